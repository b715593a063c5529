"""The prompt: a TextArea where Enter sends and ctrl+j (any terminal) or shift+enter (where reported) adds a line.

Pasted text keeps everything but terminal escape sequences (the colours of pasted compiler or log output): those
are removed, and a toast says how many. A typed invisible joiner (U+200D in 👩‍👩‍👧‍👦) is kept, as a pasted one is.
"""

from __future__ import annotations

import re
import unicodedata

from textual import events
from textual.document._edit import Edit
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")

# ECMA-48 escape sequences: CSI (colours: ESC[1m), OSC (titles, links: ESC]...BEL or ESC\\), DCS/SOS/PM/APC
# strings, the two-character ones (ESC 7, ESC(B), and a lone ESC.
ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[ -/]*[0-~]|)"
)


def strip_escape_sequences(text: str) -> tuple[str, int]:
    """`text` without terminal escape sequences, and how many there were."""
    return ESCAPE_SEQUENCE.subn("", text)


def is_invisible_format_character(character: str | None) -> bool:
    """A joiner, a direction mark or an emoji tag: not printable to Python (so a TextArea drops the key), but text."""
    return character is not None and len(character) == 1 and unicodedata.category(character) == "Cf"


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
        if is_invisible_format_character(event.character):
            # Textual reports U+200D as a key that is not printable, and TextArea inserts only printable ones.
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard(event.character, start, end)
            return
        await super()._on_key(event)

    def undo(self) -> None:
        self._cursor_to_top_of(self.history.undo_stack)
        super().undo()

    def redo(self) -> None:
        self._cursor_to_top_of(self.history.redo_stack)
        super().redo()

    def _cursor_to_top_of(self, stack: list[list[Edit]]) -> None:
        """Put the cursor where the next undo or redo starts, a place that exists before and after it.

        TextArea (textual 8.x) resizes itself in the middle of an undo, before it moves the cursor: taking back a
        paste long enough to show a scrollbar then looked up the cursor's line, gone by then, and raised
        ValueError (ctrl+z after a big paste did nothing but fail). Upstream: Textualize/textual#6686 (open).
        """
        if stack:
            self.move_cursor(min(edit.top for edit in stack[-1]))

    async def _on_paste(self, event: events.Paste) -> None:
        # The parser hands a paste over whole, escape sequences included (tui/terminal.py); they are removed here.
        text, removed = strip_escape_sequences(event.text)
        event.prevent_default()  # TextArea's own handler would insert the text a second time
        await super()._on_paste(events.Paste(text) if removed else event)
        if removed:
            self.notify(
                f"Pasted text: {removed} escape sequence{'s' if removed != 1 else ''} (terminal colours or styles) "
                "removed.",
                title="Paste",
                timeout=4,
            )

    # The key table's "prompt.*" keys (tui/keymap.py): the chat screen runs these wherever focus is. They wait
    # their turn behind the keys already forwarded here (typed, then f10 at once: the editor gets the text).
    def action_edit_in_editor(self) -> None:
        from tui.external_editor import edit_prompt_in_editor

        self.call_later(edit_prompt_in_editor, self.app, self)

    def action_clear_prompt(self) -> None:
        self.call_later(self._clear_all)

    def action_select_everything(self) -> None:
        self.call_later(self._select_everything)

    def _clear_all(self) -> None:
        self.clear()  # one edit: ctrl+z brings the text back
        self.focus()

    def _select_everything(self) -> None:
        self.focus()
        self.select_all()

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
