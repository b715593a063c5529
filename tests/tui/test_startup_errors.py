"""Problems found before the model loads (bad config, missing folders, no exllamav2) show in the open app."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from tests.support.tui import SIZE, plain, status, wait_until
from tui.app import SpecchatApp
from tui.screens.error import ErrorScreen


async def _shows_error(app: SpecchatApp, fragment: str, timeout: float = 60) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "failed", timeout=timeout)
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert fragment in plain(app.screen.query_one("#error-message"))
        await pilot.press("enter")
        assert fragment in plain(app.chat.chat_log.banner)
        assert "model not loaded" in status(app)
        assert app.is_running


async def test_bad_config_opens_the_app_with_the_message_and_loads_on_defaults():
    message = "~/.config/specchat/config.toml: cache_mode: must be one of auto, fp16, q8, q6, q4 (got 'q3')"
    app = SpecchatApp(Settings.model_construct(), backend=ScriptedBackend(), startup_error=message)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert "cache_mode: must be one of" in plain(app.screen.query_one("#error-message"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.state == "ready")
        assert "cache_mode: must be one of" in plain(app.chat.chat_log.banner)
        assert "model not loaded" not in status(app)


async def test_missing_model_folder_fails_the_load_in_app(tmp_path: Path):
    app = SpecchatApp(Settings(model=tmp_path / "missing", backend="transformers"))
    await _shows_error(app, "missing")


async def test_exllamav2_backend_unusable_is_a_message_in_app(tiny_model_dir: Path):
    app = SpecchatApp(Settings(model=tiny_model_dir, backend="exllamav2"))
    await _shows_error(app, "exllamav2 is unusable here")


@pytest.mark.slow
async def test_a_native_crash_in_the_trial_decode_is_a_message_and_the_app_stays_up(monkeypatch):
    # The trial child dies of a real SIGSEGV (planted), as llama.cpp's AMX path does on some Xeons: the open app
    # shows one line naming the signal instead of vanishing.
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import native as llamacpp_native
    from engine.models import ensure_embedded_gguf

    path = ensure_embedded_gguf(precision="q4_1")
    monkeypatch.setenv(llamacpp_native.PLANT_ENV, "decode")
    app = SpecchatApp(Settings(model=path, backend="llamacpp"))
    await _shows_error(
        app, "llama.cpp crashed (SIGSEGV)", timeout=600
    )  # a child loads the model: slow when busy
