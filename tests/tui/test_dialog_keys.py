"""The dialogs' keys are the key table's too (tui/keymap.py): each dialog binds its table's rows, and a key remapped
under [keymap] in config.toml works in its dialog, the real app under Pilot."""

from __future__ import annotations

from pathlib import Path

from engine.backends.scripted import ScriptedBackend
from engine.config import load_settings
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support.isolation import isolated_config  # noqa: F401 (autouse)
from tests.support.tui import SIZE, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.keymap import DIALOG_KEYS, HISTORY_KEYS, check_keymap
from tui.screens.error import ErrorScreen
from tui.screens.find import FindScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.inspector import InspectorScreen
from tui.screens.path_picker import PathPickerScreen
from tui.screens.presets import PresetPickerScreen
from tui.screens.settings import SettingsScreen
from tui.screens.trend import TrendScreen

DIALOGS = (
    ErrorScreen,
    FindScreen,
    HelpScreen,
    InspectorScreen,
    PathPickerScreen,
    PresetPickerScreen,
    SettingsScreen,
    TrendScreen,
)


def test_every_dialog_binds_its_key_table_and_nothing_by_hand():
    assert len(DIALOGS) == len(DIALOG_KEYS)
    for dialog, specs in ((HistoryScreen, HISTORY_KEYS), *zip(DIALOGS, DIALOG_KEYS, strict=True)):
        bound = {binding.id: binding for binding in dialog.BINDINGS}
        assert set(bound) == {spec.id for spec in specs}, dialog.__name__
        for spec in specs:
            binding = bound[spec.id]
            assert (binding.key, binding.action, binding.show, binding.priority) == (
                spec.key,
                spec.action,
                spec.show,
                spec.priority,
            ), spec.id


def test_a_dialog_key_is_a_known_binding_id_and_checked_in_its_dialog():
    assert check_keymap({"history.delete": "ctrl+g", "picker.up": "f9"}) == []
    # Two keys of one dialog on the same key: an error that names both.
    [problem] = check_keymap({"picker.up": "ctrl+s"})
    assert problem.severity == "error" and "picker.pick" in problem.message and "picker.up" in problem.message


async def test_history_delete_remapped_in_the_config_file_deletes_on_its_new_key(tmp_path: Path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text('[keymap]\n"history.delete" = "ctrl+g"\n"find.close" = "f9"\n', encoding="utf-8")
    monkeypatch.setenv("SPECCHAT_CONFIG_FILE", str(config))
    settings = load_settings(data_dir=tmp_path / "data")
    session = ChatSession(settings, backend=ScriptedBackend(["Hi!"]), presets=load_presets(None), save=True)
    app = SpecchatApp(settings, session=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert [n.message for n in app._notifications if "keymap" in n.message] == []
        await send(pilot, "Say hello")
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen
        await wait_until(pilot, lambda: len(screen.chats) == 1)
        await pilot.press("ctrl+d")  # the default key is the search box's again (delete right)
        assert screen.mode == "search"
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: screen.mode == "confirm-delete")
        assert "delete 'Say hello'" in plain(screen.query_one("#history-status"))
        await pilot.press("y")
        await wait_until(pilot, lambda: screen.chats == [])
        assert Store.open(tmp_path / "data").chats() == []
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HistoryScreen))

        # Another dialog's key: find closes on its new key.
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, FindScreen))
        await pilot.press("f9")
        await wait_until(pilot, lambda: not isinstance(app.screen, FindScreen))
