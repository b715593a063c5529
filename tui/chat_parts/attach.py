"""Attaching text files to the prompt (`/attach PATH ...`, or a file picked in a tree): the chat screen's
`Attacher`. Nothing is sent: the files go into the prompt, and the question follows them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.session.attachments import AttachmentError, attachment_block, expand_attach, parse_attach

if TYPE_CHECKING:
    from textual.app import App

    from tui.widgets.prompt import PromptInput


class AttachScreen(Protocol):
    """What the part uses of the chat screen."""

    prompt: PromptInput

    @property
    def app(self) -> App[Any]: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...


class Attacher:
    def __init__(self, screen: AttachScreen) -> None:
        self.screen = screen

    def command(self, text: str) -> bool:
        """A prompt whose first line is `/attach PATH ...`: the files go into the prompt (True), nothing is sent."""
        if parse_attach(text) is None:
            return False
        screen = self.screen
        try:
            expanded = expand_attach(text)
        except AttachmentError as exc:
            screen.notify(str(exc), title="Not attached", severity="error", timeout=10)
            return True  # the prompt keeps what was typed
        screen.prompt.set_text(expanded)
        screen.prompt.focus()
        count = len(parse_attach(text) or ())
        screen.notify(
            f"Attached {count} file{'s' if count != 1 else ''}: write your question, enter sends.", timeout=4
        )
        return True

    def pick(self) -> None:
        """A file picked in a folder tree goes before what the prompt holds."""
        from tui.screens.path_picker import PathPickerScreen

        screen = self.screen

        def picked(path: str | None) -> None:
            if not path:
                return
            try:
                block = attachment_block(path)
            except AttachmentError as exc:
                screen.notify(str(exc), title="Not attached", severity="error", timeout=10)
                return
            prompt = screen.prompt
            before = prompt.text
            prompt.set_text(block + "\n\n" + before.lstrip("\n") if before.strip() else block + "\n\n")
            prompt.focus()
            screen.notify(f"Attached {Path(path).name}: write your question, enter sends.", timeout=4)

        screen.app.push_screen(PathPickerScreen("Attach a text file", Path.cwd()), picked)
