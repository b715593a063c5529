"""Messages from the worker threads to the app, named in the past tense (they report what happened).

The generation thread fills a `ReplyBuffer` and posts `ReplyTextArrived` (a burst collapses into the newest: it sets
`can_replace`) and one `ReplyEventArrived` per session event; the load thread posts `LoadProgressed`.
"""

from __future__ import annotations

from textual.message import Message

from tui.streaming import ReplyBuffer


class ReplyTextArrived(Message):
    """New text is waiting in the reply buffer. A burst collapses into the newest message."""

    def __init__(self, buffer: ReplyBuffer) -> None:
        super().__init__()
        self.buffer = buffer

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ReplyTextArrived) and message.buffer is self.buffer


class ReplyEventArrived(Message):
    def __init__(self, event: object, buffer: ReplyBuffer) -> None:
        super().__init__()
        self.event = event
        self.buffer = buffer


class LoadProgressed(Message):
    def __init__(self, stage: str, fraction: float | None) -> None:
        super().__init__()
        self.stage = stage
        self.fraction = fraction

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgressed)
