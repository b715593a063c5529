"""A bad keymap or config in the real app under Pilot: a key stolen from another binding or an invalid key name
is an error and the defaults apply; a broken config opens on the defaults with its message and loads the
model; a bad SPECCHAT_MODEL path names the variable.

The test names keep the numbers of the problems issue 9 listed.
"""

from __future__ import annotations

import pytest
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.session import ChatSession
from tests.support.isolation import isolated_config  # noqa: F401 (autouse)
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.error import ErrorScreen

SMALL = (80, 24)


async def test_11_a_key_stolen_from_another_binding_is_an_error_and_defaults_apply():
    app = make_app(keymap={"preset.qa": "ctrl+q"})
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert any("preset.qa" in m and "app.quit" in m for m in errors), errors
        await pilot.press("f3")  # the default key still works: the bad keymap was not applied
        assert app.session.mode == "qa"
        assert app.is_running


async def test_11_an_invalid_key_name_is_an_error_and_never_shown():
    app = make_app(keymap={"preset.code": "banana key"})
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert any("preset.code" in m and "banana key" in m for m in errors), errors
        footer = app.screen_stack[0].query_one(Footer)
        assert not any("banana" in k.key_display for k in footer.query(FooterKey))
        await pilot.press("f2")
        assert app.session.mode == "code"


async def test_13_a_broken_config_opens_on_defaults_with_the_message_and_loads_the_model():
    message = "~/.config/specchat/config.toml: cache_mode: must be one of fp16, q8, q6, q4 (got 'q3')"
    app = SpecchatApp(Settings.model_construct(), backend=ScriptedBackend(), startup_error=message)
    async with app.run_test(size=SMALL) as pilot:
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert "cache_mode: must be one of" in plain(app.screen.query_one("#error-message"))
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.state == "ready" and "model not loaded" not in status(app)
        assert "cache_mode" in plain(app.chat.chat_log.banner)
        await send(pilot, "hello")
        assert app.session.turns[-1].role == "assistant"


def test_13_a_bad_model_path_from_the_environment_names_specchat_model(tmp_path, monkeypatch):
    from engine.config import load_settings
    from engine.errors import UserError

    monkeypatch.setenv("SPECCHAT_MODEL", str(tmp_path / "no-such-model"))
    session = ChatSession(load_settings(backend="transformers"))
    with pytest.raises(UserError, match=r"^SPECCHAT_MODEL: .*no-such-model"):
        session.load()
