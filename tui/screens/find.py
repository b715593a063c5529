"""Find text in the conversation: type, see how many messages hold it, enter jumps to the newest (again: older).

Dismisses with the text to find (None on escape); the chat selects the matching message (tui/chat_parts/find.py).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tui.keymap import FIND_KEYS, bindings
from tui.widgets.footer import FittingFooter


class FindScreen(ModalScreen[str | None]):
    BINDINGS = bindings(FIND_KEYS)

    def __init__(self, query: str, count: Callable[[str], int]) -> None:
        super().__init__()
        self.query_text = query
        self.count = count

    def compose(self) -> ComposeResult:
        with Vertical(id="find", classes="dialog"):
            yield Static(Text("Find in this chat", style="bold"), classes="title")
            yield Input(value=self.query_text, placeholder="text to find", id="find-input")
            yield Static("", id="find-count")
            yield Static("enter jump (again: the one before) · esc close", classes="hint")
        yield FittingFooter()

    def on_mount(self) -> None:
        field = self.query_one(Input)
        field.focus()
        field.cursor_position = len(field.value)
        self._say(field.value)

    def _say(self, query: str) -> None:
        n = self.count(query) if query.strip() else 0
        text = "" if not query.strip() else "no message holds it" if not n else f"{n} message{'s' * (n != 1)}"
        self.query_one("#find-count", Static).update(Text(text, style="dim"))

    @on(Input.Changed, "#find-input")
    def _changed(self, event: Input.Changed) -> None:
        self._say(event.value)

    @on(Input.Submitted, "#find-input")
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value)
