"""Settings for this chat (issue 9): the F12 dialog and the remembered theme, on the real app under Pilot."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from textual.widgets import Button, Input, Label, Switch, TextArea

from engine.backends import registry
from engine.backends.scripted import ScriptedBackend
from engine.config import load_settings
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.chat_settings import engine_fields
from tui.screens.settings import SettingsScreen

SIZE = (100, 36)


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    monkeypatch.delenv("SPECCHAT_MODEL", raising=False)
    return tmp_path / "config" / "specchat" / "config.toml"


async def open_settings(pilot) -> SettingsScreen:
    await pilot.press("f12")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
    return pilot.app.screen


def fill(screen: SettingsScreen, field: str, value: str) -> None:
    screen.query_one(f"#settings-{field}", Input).value = value


async def test_changed_k_and_temperature_reach_the_next_request_and_the_status_bar():
    backend = ScriptedBackend(replies=["one", "two"])
    app = make_app(backend, preset="qa")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first")
        assert backend.requests[-1].num_draft_tokens != 7
        screen = await open_settings(pilot)
        fill(screen, "k", "7")
        fill(screen, "temperature", "0.25")
        fill(screen, "ramp_tokens", "0")
        fill(screen, "ramp_start", "0")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert "K 7" in status(app) and "0.25" in status(app)
        await send(pilot, "second")
        request = backend.requests[-1]
        assert request.num_draft_tokens == 7
        assert request.sampler.temperature == pytest.approx(0.25)


async def test_a_bad_value_shows_one_line_and_keeps_the_dialog_and_the_edits():
    backend = ScriptedBackend(replies=["ok"])
    app = make_app(backend, preset="qa")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        screen.query_one("#settings-system-prompt", TextArea).text = "Be brief."
        fill(screen, "k", "40")
        fill(screen, "temperature", "0.3")
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        assert app.screen is screen
        error = plain(screen.query_one("#settings-error"))
        assert "k: must be between 0 and 16 (got 40)" in error and "\n" not in error.strip()
        assert screen.query_one("#settings-temperature", Input).value == "0.3"
        assert screen.query_one("#settings-system-prompt", TextArea).text == "Be brief."
        fill(screen, "k", "abc")
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        assert app.screen is screen and "k: must be a whole number" in plain(
            screen.query_one("#settings-error")
        )
        assert app.session.preset_choice.overrides == {}


async def test_the_system_prompt_and_drafting_off_reach_the_next_request():
    backend = ScriptedBackend(replies=["ok"])
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        screen.query_one("#settings-system-prompt", TextArea).text = "You are a pirate."
        screen.query_one("#settings-drafting", Switch).value = False
        await pilot.click("#settings-apply")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        await send(pilot, "hello")
        request = backend.requests[-1]
        prompt = backend.decode(list(request.prompt_ids))
        assert prompt.startswith("<system>\nYou are a pirate.\n<user>\nhello")
        assert request.effective_k == 0


async def test_the_chosen_theme_is_written_to_the_config_and_used_on_the_next_start(isolated_config):
    app = SpecchatApp(load_settings(), backend=ScriptedBackend())
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.theme != "nord"
        app.theme = "nord"  # what the command palette's theme picker does
        await pilot.pause(0.1)
    assert tomllib.loads(isolated_config.read_text())["theme"] == "nord"
    settings = load_settings()
    assert settings.theme == "nord"
    again = SpecchatApp(settings, backend=ScriptedBackend())
    async with again.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert again.theme == "nord"


async def test_at_80x24_the_whole_dialog_and_its_hint_are_on_screen_even_with_an_error():
    app = make_app(ScriptedBackend(), preset="qa")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        footer_row = 23
        for shown_error in (False, True):
            if shown_error:
                fill(screen, "k", "40")
                await pilot.press("ctrl+s")
                await pilot.pause(0.1)
                assert "k: must be between" in plain(screen.query_one("#settings-error"))
            await pilot.pause(0.1)
            dialog = screen.query_one("#settings").region
            hint = screen.query_one("#settings .hint")
            assert dialog.y >= 0 and dialog.bottom <= footer_row, dialog
            # The hint is the last row inside the border: on screen, and no blank rows under it.
            assert hint.region.bottom == dialog.bottom - 1 and hint.region.height == 1, (hint.region, dialog)
            assert "esc close" in plain(hint)


async def test_tab_and_shift_tab_move_between_the_fields_and_typing_replaces_a_path():
    app = make_app(ScriptedBackend())
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await open_settings(pilot)
        assert app.focused.id == "settings-system-prompt"
        await pilot.press("tab")
        assert app.focused.id == "settings-k"
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused.id == "settings-draft-browse"  # the "…" button that opens the folder tree
        await pilot.press("shift+tab")
        assert app.focused.id == "settings-draft"
        await pilot.press(*"none")  # the field's text is selected on focus: typing replaces it
        assert app.focused.value == "none"
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused.id == "settings-model"


@pytest.mark.parametrize("preset", ["auto", "qa"])
async def test_a_model_loaded_without_a_drafter_shows_k_off_before_the_first_reply(preset):
    app = make_app(ScriptedBackend(draft_mode="none"), preset=preset)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "│ K off │" in status(app), status(app)


async def test_the_folder_tree_picks_a_model_folder_into_the_field(tmp_path):
    models = tmp_path / "models"
    for name in ("alpha", "beta"):
        folder = models / name
        folder.mkdir(parents=True)
        for file in ("config.json", "tokenizer.json"):
            (folder / file).write_text("{}")
        (folder / "model.safetensors").write_bytes(b"")
    app = make_app(ScriptedBackend())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        screen.query_one("#settings-model", Input).value = str(models / "alpha")
        await pilot.click("#settings-model-browse")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "PathPickerScreen")
        picker = app.screen
        assert "esc back" in plain(picker.query_one(".hint"))  # the hint fits 80x24 too
        assert picker.query_one(".hint").region.bottom <= 23
        await wait_until(pilot, lambda: picker.highlighted() is not None)
        for _ in range(5):  # the tree lists alpha, then beta
            if picker.highlighted() == models / "beta":
                break
            await pilot.press("down")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is screen)
        field = screen.query_one("#settings-model", Input)
        assert field.value == str(models / "beta") and app.focused is field
        assert plain(screen.query_one("#settings-error")).strip() == ""  # a model folder: valid


async def test_applying_the_same_model_and_draft_does_not_reload(tmp_path):
    backend = ScriptedBackend()
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        for draft in ("ngram", "NGRAM "):  # unchanged, and the same word typed otherwise
            screen = await open_settings(pilot)
            fill(screen, "draft", draft)
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            assert app.state == "ready" and app.session.backend is backend
            assert not [w for w in app.workers if w.group == "reload"]


async def test_a_model_that_does_not_load_brings_the_dialog_back_with_the_typed_values_and_the_reason():
    from engine.errors import SpecchatError

    app = make_app(ScriptedBackend(replies=["ok"]), preset="qa")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        tried: list[tuple] = []

        def reload(model, draft, progress=None, options=None):
            tried.append((model, draft))
            raise SpecchatError("draft 'none' failed: the vocabulary size differs from the target's")

        app.session.reload = reload
        screen = await open_settings(pilot)
        fill(screen, "draft", "none")
        fill(screen, "temperature", "0.4")
        screen.query_one("#settings-system-prompt", TextArea).text = "Be brief."
        await pilot.press("ctrl+s")
        await wait_until(
            pilot, lambda: tried and isinstance(app.screen, SettingsScreen) and app.screen is not screen
        )
        again = app.screen
        await pilot.pause(0.1)
        assert tried == [(None, "none")]
        assert again.query_one("#settings-draft", Input).value == "none"
        assert again.query_one("#settings-temperature", Input).value == "0.4"
        assert again.query_one("#settings-system-prompt", TextArea).text == "Be brief."
        error = plain(again.query_one("#settings-error"))
        assert "not loaded: draft 'none' failed: the vocabulary size differs" in error
        assert "still on scripted-model" in error
        assert app.focused is again.query_one("#settings-draft", Input)
        assert not [n for n in app._notifications if n.severity == "error"]  # said in the dialog, not a toast
        assert app.state == "ready"


async def test_the_dialog_returns_its_values_to_whoever_opened_it_and_applies_nothing_itself():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        returned: list = []
        dialog = SettingsScreen(
            "be brief",
            {"k": 3},
            check=lambda result: None,
            fields=engine_fields({"model": "", "draft": "ngram"}),
        )
        app.push_screen(dialog, returned.append)
        await wait_until(pilot, lambda: app.screen is dialog and dialog.query("#settings-temperature"))
        fill(dialog, "temperature", "0.5")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: returned)
        assert returned[0]["system_prompt"] == "be brief"
        assert returned[0]["overrides"]["temperature"] == 0.5 and returned[0]["overrides"]["k"] == 3
        assert (returned[0]["model"], returned[0]["draft"]) == ("", "ngram")
        assert app.session.preset_choice.overrides == {} and app.session.settings.system_prompt != "be brief"


def engine_rows(screen: SettingsScreen) -> list[tuple[str, str, str, str | None]]:
    """The dialog's engine rows as shown: (field id, label, placeholder, the browse button's tooltip)."""
    rows = []
    for button in screen.query(Button):
        if button.id and button.id.endswith("-browse"):
            row = button.parent
            field = row.query_one(Input)
            label = str(row.query_one(Label).render())
            rows.append((field.id, label, field.placeholder, str(button.tooltip)))
    return rows


async def test_the_engine_rows_are_the_engine_options_marked_for_the_dialog():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        marked = [option.name for option in registry.ENGINE_OPTIONS if option.dialog is not None]
        assert marked == ["model", "draft"]
        rows = engine_rows(screen)
        assert [field_id for field_id, *_ in rows] == [f"settings-{name}" for name in marked]
        model, draft = rows
        assert model[1:] == (
            "model",
            "a model folder or .gguf file (empty: the embedded model)",
            "pick a folder or file",
        )
        assert draft[1] == "draft" and draft[2].endswith(", or a draft model folder")
        assert set(screen.collect()) >= {"model", "draft"}


def mark_for_dialog(monkeypatch, name: str, label: str, placeholder: str) -> None:
    """The engine option `name` as if its registry row had a `dialog`."""
    field = registry.DialogField(label, placeholder, "Pick a folder")
    options = tuple(
        dataclasses.replace(option, dialog=field) if option.name == name else option
        for option in registry.ENGINE_OPTIONS
    )
    monkeypatch.setattr(registry, "ENGINE_OPTIONS", options)


async def test_an_option_marked_for_the_dialog_shows_there_with_no_row_written_for_it(monkeypatch):
    # Would go red with the rows written out in the dialog: a third marked option shows, in the table's order.
    mark_for_dialog(monkeypatch, "endpoint", "endpoint", "a server's base URL")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        screen = await open_settings(pilot)
        rows = engine_rows(screen)
        assert [field_id for field_id, *_ in rows] == [
            "settings-model",
            "settings-draft",
            "settings-endpoint",
        ]
        assert rows[2][1:3] == ("endpoint", "a server's base URL")
        fill(screen, "endpoint", " http://127.0.0.1:8080 ")
        assert screen.collect()["endpoint"] == "http://127.0.0.1:8080"


async def test_a_third_option_marked_for_the_dialog_opens_with_its_value_and_a_change_reloads_with_it(
    monkeypatch,
):
    # Red where the dialog's rows other than the model and draft opened empty and their change was dropped.
    mark_for_dialog(monkeypatch, "max_context", "context length", "tokens")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        tried: list[tuple] = []

        def reload(model, draft, progress=None, options=None):
            tried.append((model, draft, options))
            return app.session.backend.info

        app.session.reload = reload
        screen = await open_settings(pilot)
        shown = screen.query_one("#settings-max_context", Input).value
        assert shown == str(app.session.settings.max_context) == "4096"
        fill(
            screen, "max_context", "abc"
        )  # checked as the config file's value: the dialog stays and says why
        await pilot.pause(0.1)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: plain(screen.query_one("#settings-error")).strip())
        assert "max_context: must be a whole number (got 'abc')" in plain(screen.query_one("#settings-error"))
        assert app.screen is screen and not tried
        fill(screen, "max_context", "2048")
        await pilot.pause(0.1)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: tried)
        assert tried == [(None, "ngram", {"max_context": "2048"})]


async def test_a_model_change_while_a_reply_streams_is_refused_naming_the_stop_key_in_force():
    reply = " ".join(["word"] * 80)
    app = make_app(ScriptedBackend(replies=[reply], tokens_per_s=20), keymap={"reply.cancel": "ctrl+g"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "count", wait=False)
        await wait_until(pilot, lambda: app.chat.generating)
        screen = await open_settings(pilot)
        fill(screen, "draft", "none")
        await pilot.pause(0.1)  # the field's Changed (it hides an error) is handled before the key
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: plain(screen.query_one("#settings-error")).strip())
        assert app.screen is screen  # refused: the dialog stays, with the reason
        error = plain(screen.query_one("#settings-error"))
        assert "a reply is streaming (ctrl+g stops it)" in error, error
        assert not [w for w in app.workers if w.group == "reload"]
