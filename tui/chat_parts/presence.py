"""Whether another specchat window has this chat open: the chat screen's `PresenceCheck`, asked on its timer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import UserError

if TYPE_CHECKING:
    from engine.session import ChatSession

PRESENCE_CHECK_S = 2.0  # how often the chat looks for another window on it (a glob and a lock try)


class PresenceScreen(Protocol):
    """What the part uses of the chat screen."""

    @property
    def session(self) -> ChatSession: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def shown_key(self, binding_id: str) -> str: ...


class PresenceCheck:
    def __init__(self, screen: PresenceScreen) -> None:
        self.screen = screen
        self._checked_at = 0.0
        self._told: int | None = None  # the chat whose other window was already mentioned

    def check(self) -> None:
        """Say once per chat that another specchat window has it open (each window's messages become branches)."""
        now = time.monotonic()
        if now - self._checked_at < PRESENCE_CHECK_S:
            return
        self._checked_at = now
        screen = self.screen
        chat_id = screen.session.chat_id
        if chat_id is None or chat_id == self._told:
            return
        try:
            others = screen.session.history.open_elsewhere()
        except (OSError, UserError):
            return
        if others:
            self._told = chat_id
            window = "another specchat window" if others == 1 else f"{others} other specchat windows"
            screen.notify(
                f"This chat is open in {window} too: what each sends becomes its own branch "
                f"(select a message, {screen.shown_key('reply.older_variant')} / "
                f"{screen.shown_key('reply.newer_variant')} pages them).",
                title="Open elsewhere",
                severity="warning",
                timeout=20,
            )
