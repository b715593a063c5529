"""A failure the user should read: a one-line message, never a traceback. The app stays open."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tui.widgets.footer import FittingFooter


class ErrorScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "dismiss", "close", id="error.close")]

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
