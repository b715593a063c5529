"""Copying a reply, or its code blocks one at a time, to the clipboard: the chat screen's `ReplyCopier`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tui.clipboard import copy_text
from tui.widgets.message import code_blocks

if TYPE_CHECKING:
    from textual.app import App

    from tui.widgets.message import ReplyMessage


class CopyScreen(Protocol):
    """What the part uses of the chat screen."""

    @property
    def app(self) -> App[Any]: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...


class ReplyCopier:
    def __init__(self, screen: CopyScreen) -> None:
        self.screen = screen

    def copy(self, reply: ReplyMessage | None, code_only: bool) -> None:
        """The reply's answer (its reasoning left out), or its next code block; a toast says what was copied."""
        screen = self.screen
        if reply is None or not reply.text:
            screen.notify("No reply to copy yet.", severity="warning")
            return
        text = reply.answer_text  # a thinking reply's reasoning stays out of the clipboard
        if not code_only:
            screen.notify(copy_text(screen.app, text, f"the reply ({len(text)} characters)"), timeout=4)
            return
        blocks = code_blocks(text)
        if not blocks:
            screen.notify("That reply has no code block.", severity="warning")
            return
        # One block per press, in reading order: the function first, then its usage example, and round again.
        index = reply.next_code_block % len(blocks)
        reply.next_code_block = index + 1
        code = blocks[index]
        what = f"the code block ({len(code.splitlines())} lines)"
        if len(blocks) > 1:
            what = f"code block {index + 1} of {len(blocks)} ({len(code.splitlines())} lines; ctrl+b again: the next)"
        screen.notify(copy_text(screen.app, code, what), timeout=4)
