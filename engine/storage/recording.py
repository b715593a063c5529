"""ChatRecorder: what a ChatSession keeps after it quits — the chat in the store, each reply in the metrics log.

The session calls it at fixed points of a reply (user message in, reply started, text streaming, reply ended);
it never lets a storage problem stop a reply: a store or log that fails says so once (in `take_notices()`)
and the chat goes on in memory. A reply's text is written while it streams, at most `FLUSH_INTERVAL_S` apart
(measured on the wall clock, whatever clock the session stamps chunks with), so a process killed mid-reply
loses at most that much of it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from engine.errors import SpecchatError
from engine.events import BackendInfo, MessageStats
from engine.storage import metrics
from engine.storage.presence import ChatPresence
from engine.storage.store import MessageRecord, Store, StoreError, title_from

FLUSH_INTERVAL_S = 0.5

_MESSAGE_STATS_FIELDS = {f.name for f in fields(MessageStats)}


def stats_from_dict(data: dict[str, Any] | None) -> MessageStats | None:
    """A stored stats dict back into MessageStats (None if it is missing fields from an older version)."""
    if not data:
        return None
    try:
        return MessageStats(**{k: v for k, v in data.items() if k in _MESSAGE_STATS_FIELDS})
    except TypeError:
        return None


class ChatRecorder:
    saves = True

    def __init__(self, data_dir: Path, store: Store | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.store = store if store is not None else Store.open(self.data_dir)
        self.metrics_path = self.data_dir / metrics.METRICS_NAME
        self.chat_id: int | None = None
        self._notices: list[str] = []
        self._store_broken = False
        self._metrics_broken = False
        self._last_flush: dict[int, float] = {}
        self._fingerprints: dict[tuple[str, str], str] = {}
        self._versions: dict[str, str] | None = None
        # Which other windows have this chat open (lock files beside the database).
        self.presence = ChatPresence(self.data_dir)

    @property
    def memory_only(self) -> bool:
        """True once nothing more reaches the disk: the store fell back to memory, or saving stopped."""
        return self._store_broken or self.store.in_memory

    def others_open(self) -> int:
        """How many other specchat windows have this chat open (0 when it has no row yet)."""
        if self.chat_id is None or self.memory_only:
            return 0
        self.presence.claim(self.chat_id)
        return self.presence.others()

    def take_notices(self) -> list[str]:
        notices = self.store.take_notices() + self._notices
        self._notices = []
        return notices

    def guarded(self, action: Callable[[], Any]) -> Any:
        """`action()` on the store, a database error told once (as every store call here); None then."""
        return self._guard(action)

    def _guard(self, action: Callable[[], Any]) -> Any:
        """Run a store call; an unexpected database error is told once and saving stops (the chat goes on)."""
        if self._store_broken:
            return None
        try:
            return action()
        except sqlite3.Error as exc:
            self._store_broken = True
            self._notices.append(f"the history could not be saved ({exc}): this chat goes on in memory only")
            return None

    # --- the chat --------------------------------------------------------------------------------------------

    def new_chat(self) -> None:
        self.chat_id = None
        self.presence.claim(None)

    def open_chat(self, chat_id: int) -> list[MessageRecord]:
        """The visible conversation of a stored chat, which becomes the one new messages go to."""
        records = self.store.conversation(chat_id)  # StoreError for an unknown id
        self.chat_id = chat_id
        self.presence.claim(chat_id)
        return records

    def last_chat_id(self) -> int | None:
        return self.store.last_chat_id()

    def chats(self, search: str = "") -> list:
        """Stored chats, most recent first; `search` matches titles and message text."""
        return self.store.chats(search)

    def user_message(
        self,
        text: str,
        parent_id: int | None,
        *,
        model: str | None,
        draft: str | None,
        system_prompt: str | None,
        mode: str,
    ) -> int | None:
        def write() -> int:
            if self.chat_id is None:
                self.chat_id = self.store.create_chat(
                    title_from(text), model=model, draft=draft, system_prompt=system_prompt, preset_mode=mode
                )
                if not self.store.in_memory:
                    self.presence.claim(self.chat_id)
            return self.store.add_message(self.chat_id, "user", text, parent_id=parent_id)

        return self._guard(write)

    def chat_settings_changed(self, **values: str | None) -> None:
        """The open chat now runs on another model / draft / system prompt: the stored chat says so.

        Before the chat's first message there is no row yet: that message creates it with the new values."""
        if self.chat_id is None:
            return
        chat_id = self.chat_id
        self._guard(lambda: self.store.update_chat(chat_id, **values))

    def reply_started(self, parent_id: int | None, preset: str, k: int, temperature: float) -> int | None:
        if self.chat_id is None:
            return None
        chat_id = self.chat_id
        message_id = self._guard(
            lambda: self.store.add_message(
                chat_id, "assistant", "", parent_id=parent_id, preset=preset, k=k, temperature=temperature
            )
        )
        if message_id is not None:
            self._last_flush[message_id] = time.monotonic()
        return message_id

    def reply_progress(self, message_id: int | None, text: Callable[[], str]) -> None:
        """Write the reply so far when the last write is `FLUSH_INTERVAL_S` old (`text` is built only then)."""
        if message_id is None:
            return
        now = time.monotonic()
        if now - self._last_flush.get(message_id, 0.0) < FLUSH_INTERVAL_S:
            return
        self._last_flush[message_id] = now
        self._guard(lambda: self.store.update_message(message_id, text()))

    def reply_ended(
        self,
        message_id: int | None,
        text: str,
        stop_reason: str,
        stats: MessageStats | None = None,
        error: str | None = None,
        origins: list[int] | None = None,
    ) -> None:
        if message_id is None:
            return
        self._last_flush.pop(message_id, None)
        self._guard(
            lambda: self.store.update_message(
                message_id,
                text,
                stop_reason=stop_reason,
                error=error,
                stats=stats.to_dict() if stats is not None else None,
                origins=origins,
            )
        )

    def discard(self, *message_ids: int | None) -> None:
        """Remove messages that should not stay (a reply cancelled before any text, with its prompt)."""
        for message_id in message_ids:
            if message_id is not None:
                self._last_flush.pop(message_id, None)
                self._guard(lambda m=message_id: self.store.delete_message(m))
        self._drop_empty_chat()

    def _drop_empty_chat(self) -> None:
        """A chat whose only message was taken back (refused as too long, stopped before its first token) is no
        chat: its row goes too, so the history never lists an empty `0 msgs` chat."""
        chat_id = self.chat_id
        if chat_id is None or self._store_broken:
            return

        def drop() -> None:
            if self.store.chat(chat_id).message_count == 0:
                self.store.delete_chat(chat_id)
                self.chat_id = None
                self.presence.claim(None)

        with contextlib.suppress(StoreError):
            self._guard(drop)

    def newest_path_from(self, message_id: int) -> list[MessageRecord]:
        return self._guard(lambda: self.store.newest_path_from(message_id)) or []

    def variants(self, message_id: int) -> list[MessageRecord]:
        return self._guard(lambda: self.store.siblings(message_id)) or []

    # --- the metrics log -------------------------------------------------------------------------------------

    def metrics_record(
        self, stats: MessageStats, info: BackendInfo, model_dir: str | None, message_id: int | None
    ) -> dict[str, Any]:
        model_key = model_dir or info.model
        draft_key = info.draft_model or info.draft_mode
        key = (model_key, draft_key)
        if key not in self._fingerprints:
            self._fingerprints[key] = metrics.fingerprint(model_key, draft_key)
        if self._versions is None:
            self._versions = metrics.software_versions()
        return {
            "v": metrics.RECORD_VERSION,
            "timestamp": time.time(),
            **stats.to_dict(),
            "model_path": model_dir,
            "draft": draft_key,
            "device": info.device,
            "draft_cache_mode": info.draft_cache_mode,
            "versions": self._versions,
            "fingerprint": self._fingerprints[key],
            "chat_id": self.chat_id,
            "message_id": message_id,
        }

    def log_reply(
        self, stats: MessageStats, info: BackendInfo, model_dir: str | None, message_id: int | None
    ) -> None:
        if self._metrics_broken:
            return
        try:
            metrics.append(self.metrics_path, self.metrics_record(stats, info, model_dir, message_id))
        except OSError as exc:
            self._metrics_broken = True
            self._notices.append(
                f"cannot write the metrics log {self.metrics_path} ({exc.strerror or exc}): replies are not logged"
            )

    def recent_metrics(self) -> list[dict[str, Any]]:
        with contextlib.suppress(OSError):
            return metrics.read(self.metrics_path)
        return []


class NoRecorder:
    """The recorder of a session that saves nothing (`ChatSession(save=False)`): every write goes nowhere, every
    read is empty, and what needs a store says so. The one place where "nothing is saved" is decided."""

    saves = False
    chat_id: int | None = None
    memory_only = False

    @property
    def store(self) -> Store:
        raise SpecchatError("this session does not keep a history")

    def user_message(self, text: str, parent_id: int | None, **chat: Any) -> int | None:
        return None

    def reply_started(self, parent_id: int | None, preset: str, k: int, temperature: float) -> int | None:
        return None

    def reply_progress(self, message_id: int | None, text: Callable[[], str]) -> None:
        pass

    def reply_ended(
        self, message_id: int | None, text: str, stop_reason: str, *args: Any, **kwargs: Any
    ) -> None:
        pass

    def log_reply(self, *args: Any) -> None:
        pass

    def discard(self, *message_ids: int | None) -> None:
        pass

    def chat_settings_changed(self, **values: str | None) -> None:
        pass

    def take_notices(self) -> list[str]:
        return []

    def new_chat(self) -> None:
        pass

    def open_chat(self, chat_id: int) -> list[MessageRecord]:
        return self.store.conversation(chat_id)  # says there is no history

    def last_chat_id(self) -> int | None:
        return None

    def chats(self, search: str = "") -> list:
        return []

    def others_open(self) -> int:
        return 0

    def guarded(self, action: Callable[[], Any]) -> Any:
        return None

    def variants(self, message_id: int) -> list[MessageRecord]:
        return []

    def newest_path_from(self, message_id: int) -> list[MessageRecord]:
        return []

    def recent_metrics(self) -> list[dict[str, Any]]:
        return []


__all__ = ["ChatRecorder", "NoRecorder", "StoreError", "stats_from_dict", "FLUSH_INTERVAL_S"]
