"""The scrolling conversation, anchored to the bottom while new text arrives."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.widgets.message import ReplyMessage, UserMessage


class ChatLog(VerticalScroll, can_focus=False):
    def compose(self):
        yield Static("", id="banner")

    def on_mount(self) -> None:
        self.anchor()

    @property
    def banner(self) -> Static:
        return self.query_one("#banner", Static)

    def replies(self) -> list[ReplyMessage]:
        return list(self.query(ReplyMessage))

    def messages(self) -> list[UserMessage | ReplyMessage]:
        return [child for child in self.children if isinstance(child, UserMessage | ReplyMessage)]

    async def clear_messages(self) -> None:
        await self.remove_children([*self.query(UserMessage), *self.query(ReplyMessage)])
