"""Opening a reply's measurements in the inspector (`tui.screens.inspector`): the chat screen's `ReplyInspector`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tui.screens.inspector import InspectorScreen, context_line

if TYPE_CHECKING:
    from textual.app import App

    from engine.session import ChatSession
    from tui.chat_parts.reply import ReplyLifecycle
    from tui.widgets.chat_log import ChatLog
    from tui.widgets.message import ReplyMessage


class InspectScreen(Protocol):
    """What the part uses of the chat screen."""

    chat_log: ChatLog
    lifecycle: ReplyLifecycle

    @property
    def app(self) -> App[Any]: ...

    @property
    def session(self) -> ChatSession: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...


class ReplyInspector:
    def __init__(self, screen: InspectScreen) -> None:
        self.screen = screen

    def inspect(self, reply: ReplyMessage | None) -> None:
        """The inspector for `reply` (None: the selected one was none); the reply still streaming fills it in at
        its end."""
        screen = self.screen
        session = screen.session
        notes = session.info.notes if session.info is not None else ()
        streaming = screen.lifecycle.streaming
        if streaming is not None and reply in (None, streaming) and getattr(reply, "stats", None) is None:
            # Asked before the reply's last token (a short reply looks done early): open now, fill in at the end.
            screen.app.push_screen(
                InspectorScreen(
                    pending=streaming,
                    recent_for=session.history.recent_average,
                    context=context_line(session),
                    backend_notes=notes,
                )
            )
            return
        if reply is None or reply.stats is None:
            screen.notify("No finished reply to inspect yet.", severity="warning")
            return
        stats = reply.stats
        recent = session.history.recent_average(stats.preset, model=stats.model, backend=stats.backend)
        replies = screen.chat_log.replies()
        screen.app.push_screen(
            InspectorScreen(
                reply.stats,
                reply.cancelled,
                recent,
                context=context_line(session),
                backend_notes=notes,
                # The newest reply is in the metrics log's recent average; an older one may have left it.
                includes_this=bool(replies) and reply is replies[-1],
            )
        )
