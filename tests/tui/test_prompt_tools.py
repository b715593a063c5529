"""The prompt as a whole: compose in $EDITOR (f10), clear (ctrl+u) and select all (alt+a), and an unsent draft kept
across ctrl+q. The real app under Pilot; the editor is a small script."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.tui import SIZE, make_app, parse, wait_until
from tui.commands import SpecchatCommands
from tui.prompt_draft import draft_path


def editor_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "editor.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def test_f10_composes_the_message_in_the_editor_and_ctrl_z_takes_it_back(tmp_path, monkeypatch):
    # The editor sees the prompt's text and appends a line; what it saved comes back into the prompt, unsent.
    script = editor_script(tmp_path, 'printf "\\nsecond line from the editor\\n" >> "$1"')
    monkeypatch.setenv("EDITOR", str(script))
    monkeypatch.delenv("VISUAL", raising=False)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        # Typed, then f10 at once, as one read from the terminal: the editor must get what was typed.
        for message in parse(b"first line\x1b[21~"):
            app.post_message(message)
        await wait_until(pilot, lambda: app.chat.prompt.text == "first line\nsecond line from the editor")
        assert not app.chat.chat_log.messages()
        await pilot.press("ctrl+z")
        await wait_until(pilot, lambda: app.chat.prompt.text == "first line")


@pytest.mark.parametrize(
    ("editor", "said"),
    [("exit 3", "exited with status 3"), (None, "cannot run the editor")],
)
async def test_an_editor_that_fails_leaves_the_prompt_as_it_was_and_says_why(
    tmp_path, monkeypatch, editor, said
):
    command = str(editor_script(tmp_path, editor)) if editor else str(tmp_path / "no-such-editor")
    monkeypatch.setenv("VISUAL", command)
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        app.chat.prompt.insert("keep me")
        await pilot.press("f10")
        await wait_until(pilot, lambda: any(said in n.message for n in app._notifications))
        assert app.chat.prompt.text == "keep me"


async def test_ctrl_u_clears_the_whole_prompt_undoably_and_alt_a_selects_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        text = "\n".join(f"line {i}" for i in range(40))
        app.chat.prompt.insert(text)
        await pilot.press("alt+a")
        assert app.chat.prompt.selected_text == text
        await pilot.press("ctrl+u")
        assert app.chat.prompt.text == ""
        await pilot.press("ctrl+z")
        await wait_until(pilot, lambda: app.chat.prompt.text == text)


async def test_ctrl_u_on_a_dialog_leaves_the_prompt_alone():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        app.chat.prompt.insert("typed")
        await pilot.press("f5")  # the help dialog
        await pilot.press("ctrl+u")
        assert app.chat.prompt.text == "typed"


async def test_the_palette_offers_the_prompt_commands():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        provider = SpecchatCommands(app.screen)
        names = [name for name, _, _ in provider._commands()]
        assert {"prompt: edit in $EDITOR", "prompt: clear", "prompt: select all"} <= set(names)


async def test_an_unsent_prompt_is_kept_across_ctrl_q_and_back_at_the_next_start(tmp_path):
    settings = {"data_dir": tmp_path / "data"}
    app = make_app(**settings)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "ready")
        app.chat.prompt.insert("a long question\nI had not sent yet")
        await pilot.press("ctrl+q")
    assert draft_path(app.settings).exists()

    again = make_app(**settings)
    async with again.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: again.chat.prompt.text == "a long question\nI had not sent yet")
        assert any("back in the prompt" in n.message for n in again._notifications)
        # in the prompt now, not in the file: a window killed before it quits does not bring back a sent draft
        assert not draft_path(again.settings).exists()
        again.chat.prompt.clear()
        await pilot.press("ctrl+q")
    assert not draft_path(again.settings).exists()  # quit with an empty prompt: nothing to bring back

    third = make_app(**settings)
    async with third.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: third.state == "ready")
        assert third.chat.prompt.text == ""
