"""A bad preset file is skipped, named in the chat, and the other presets work; chosen by name, it says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import presets_dir
from engine.session import ChatSession
from tests.support.isolation import isolated_config_and_data  # noqa: F401 (autouse)
from tests.support.tui import make_app, plain, send, wait_ready

SMALL = (80, 24)


def write_preset(name: str, text: str) -> Path:
    presets_dir().mkdir(parents=True, exist_ok=True)
    path = presets_dir() / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


async def test_a_bad_preset_file_is_skipped_named_in_the_chat_and_the_others_work():
    bad = write_preset("short", "banana = 3\n")
    write_preset("steady", 'k = 2\nk_mode = "fixed"\n')
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        assert app.is_running and app.state == "ready"
        banner = plain(app.chat.chat_log.banner)
        assert "Preset file skipped" in banner and bad.name in banner and "banana" in banner
        assert "short" not in app.session.presets and "steady" in app.session.presets
        app.chat.action_use_preset("steady")
        await send(pilot, "hello")
        assert app.chat.chat_log.replies()[-1].stats.preset == "steady"


def test_a_skipped_preset_chosen_by_name_says_why():
    from engine.config import Settings
    from engine.errors import SpecchatError

    write_preset("short", "k = 99\n")
    session = ChatSession(Settings(), backend=ScriptedBackend())
    with pytest.raises(SpecchatError, match=r"preset 'short' was skipped: .*short\.toml: k: must be"):
        session.set_mode("short")
