"""The one line between the app and its chat screen.

The screen sees the app only as a `ChatHost`, handed to it when it is made: the session, the settings, the keys in
force, the model's state (`ModelStatus`, which the app alone writes), and two requests: load another model, and
the one failure handler for the screen's workers. The app never calls the screen: it tells it what happened to
the model, a crashed reply and a stored chat to show with the messages below, named in the past tense.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from textual.message import Message

if TYPE_CHECKING:
    from textual.worker import Worker

    from engine.config import Settings
    from engine.session import ChatSession


@dataclass
class ModelStatus:
    """The model's state as the app holds it; the chat screen reads it."""

    state: str = "loading"  # loading / failed / ready
    message: str = "starting"  # what the status bar says while it loads (the stage) or after it failed
    load_error: str | None = None  # why the last load failed
    startup_error: str | None = None  # a config problem found before the app opened


class ChatHost(Protocol):
    """What the chat screen reads of the app and may ask of it."""

    session: ChatSession
    settings: Settings
    keymap: dict[str, str]
    model_status: ModelStatus

    def start_reload(self, model: str | None, draft: str, options: dict[str, str] | None = None) -> None: ...

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None: ...


class HostMessage(Message):
    """What the app tells the chat screen: the screen's alone (it does not bubble back to the app)."""

    bubble = False


class ModelLoadStarted(HostMessage):
    """The app began to load a model (`model`, `draft`: another one picked in F12; None at startup)."""

    def __init__(self, model: str | None = None, draft: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.draft = draft


class ModelLoadDeferred(HostMessage):
    """The app opened without loading the model (tests drive the load themselves): what stays above the chat."""


class LoadStageReached(HostMessage):
    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadStageReached)


class ModelLoaded(HostMessage):
    def __init__(self, info: Any, reloaded: bool) -> None:
        super().__init__()
        self.info = info
        self.reloaded = reloaded


class ModelLoadFailed(HostMessage):
    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title = title
        self.message = message


class ModelReloadFailed(HostMessage):
    """Another model for this chat did not load; the old one (if any) stays."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class ReplyCrashed(HostMessage):
    """The generation thread raised what the session did not catch."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class StoredChatChosen(HostMessage):
    """A stored chat to continue, picked before the app opened (--resume, --chat ID)."""

    def __init__(self, chat_id: int) -> None:
        super().__init__()
        self.chat_id = chat_id
