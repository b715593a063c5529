"""Composing a long message in `$VISUAL` / `$EDITOR` (vi when neither is set): the app suspends, the editor opens
a temporary file holding the prompt's text, and what was saved comes back into the prompt (ctrl+z restores the text
from before). An editor that fails or cannot be found leaves the prompt as it was and says why."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


class EditorError(Exception):
    pass


def editor_command() -> list[str]:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        command = shlex.split(editor)
    except ValueError as exc:
        raise EditorError(f"$EDITOR is not a command line ({exc}): {editor}") from None
    if not command:
        raise EditorError("$EDITOR is empty")
    return command


def edit_text(text: str, run: Callable[[list[str]], int]) -> str:
    """`text` as the editor left it; `run` runs a command line and returns its exit status."""
    command = editor_command()
    handle, name = tempfile.mkstemp(prefix="specchat-prompt-", suffix=".md")
    path = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        try:
            status = run([*command, str(path)])
        except OSError as exc:
            raise EditorError(
                f"cannot run the editor {command[0]}: {exc.strerror or exc} (set $EDITOR)"
            ) from None
        if status != 0:
            raise EditorError(f"the editor {command[0]} exited with status {status}: the prompt is unchanged")
        edited = path.read_text(encoding="utf-8", errors="replace")
    finally:
        path.unlink(missing_ok=True)
    return edited.rstrip("\n")  # editors end the file with a line break the message does not need


def edit_prompt_in_editor(app, prompt) -> None:
    """The prompt's action: suspend the app (a real terminal), edit, put the result in `prompt` as one undoable
    edit."""
    from textual.app import SuspendNotSupported

    def run(command: list[str]) -> int:
        if app.is_headless:  # tests: no terminal to hand over
            return subprocess.call(command)
        with app.suspend():
            return subprocess.call(command)

    try:
        edited = edit_text(prompt.text, run)
    except EditorError as exc:
        app.notify(str(exc), title="Editor", severity="error", timeout=8)
        return
    except SuspendNotSupported:
        app.notify("This terminal cannot hand over to an editor.", title="Editor", severity="error")
        return
    if edited != prompt.text:
        prompt.replace(edited, (0, 0), prompt.document.end)
    prompt.move_cursor(prompt.document.end)
    prompt.focus()
