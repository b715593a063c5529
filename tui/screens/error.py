"""A failure the user should read: a one-line message, never a traceback. The app stays open.

`describe_error` is how the TUI words any failure: a `UserError` (engine/errors.py) as its message, with its title
where it has one; anything else (a bug) as its type and message.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from engine.errors import UserError
from tui.keymap import ERROR_KEYS, bindings
from tui.widgets.footer import FittingFooter


def describe_error(error: BaseException | None) -> tuple[str | None, str]:
    """(title or None, one-line message) of a failure, as the TUI shows it."""
    if isinstance(error, UserError):
        return getattr(error, "title", None), str(error)
    return None, f"{type(error).__name__}: {error}"


class ErrorScreen(ModalScreen[None]):
    BINDINGS = bindings(ERROR_KEYS)

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="error", classes="dialog"):
            yield Static(Text("✖ " + self.title_text, style="bold red"), classes="title")
            yield Static(self.message, id="error-message")
            yield Button("OK", variant="error", id="error-ok")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss()
