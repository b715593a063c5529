"""Continuing a reply cut at its token limit, and saying how: the chat screen's `ReplyContinuer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.session import ChatSession
    from tui.chat_parts.reply import ReplyLifecycle
    from tui.widgets.chat_log import ChatLog


class ContinueScreen(Protocol):
    """What the part uses of the chat screen."""

    chat_log: ChatLog
    lifecycle: ReplyLifecycle

    @property
    def session(self) -> ChatSession: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def shown_key(self, binding_id: str) -> str: ...


class ReplyContinuer:
    """Goes on with the last reply where its token limit cut it, in a new widget (the old one hidden meanwhile)."""

    def __init__(self, screen: ContinueScreen) -> None:
        self.screen = screen

    async def start(self) -> None:
        """The last reply goes on (the screen has checked that no reply streams and the model is ready)."""
        screen = self.screen
        session = screen.session
        if not session.can_continue():
            screen.notify(
                "Nothing to continue: the last reply was not cut at its token limit.",
                severity="warning",
                timeout=4,
            )
            return
        replies = screen.chat_log.replies()
        last = replies[-1] if replies else None
        if last is not None:
            # Hidden while it goes on in a new widget; back if nothing new comes.
            screen.lifecycle.replace(last)
            prefix = list(last.runs) or [(last.text, False)]
        else:
            turn = session.turns[-1]
            prefix = list(turn.runs or ((turn.content, False),))
        await screen.lifecycle.start(None, flow=session.continue_reply, prefix=prefix)

    def offer(self) -> None:
        """A reply that ran into its token limit says how to go on."""
        if self.screen.session.can_continue():
            self.screen.notify(
                f"The reply reached its token limit: {self.screen.shown_key('reply.continue')} continues it.",
                timeout=6,
            )
