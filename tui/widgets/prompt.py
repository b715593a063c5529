"""The prompt: a TextArea where Enter sends and ctrl+j (any terminal) or shift+enter (where reported) adds a line."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # ctrl+e / ctrl+y are the prompt's (end of line, redo) while it holds text (or, for redo, has something
        # to redo); otherwise they fall through to the app's non-priority bindings (edit last, copy reply).
        if action == "cursor_line_end" and not self.text:
            return False
        if action == "redo" and not self.text and not self.history.redo_stack:
            return False
        return super().check_action(action, parameters)

    def set_text(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)
