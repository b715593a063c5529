"""What the store hands out: a chat (`ChatRecord`), a message (`MessageRecord`), a chat's title from its first
message, and the store's one user-facing error."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine.errors import UserError

TITLE_CHARS = 60


class StoreError(UserError):
    """A store failure whose message is written for the user (e.g. an unknown chat id)."""


@dataclass(frozen=True, slots=True)
class ChatRecord:
    id: int
    title: str
    created_at: float
    updated_at: float
    model: str | None
    draft: str | None
    system_prompt: str | None
    preset_mode: str | None
    message_count: int = 0


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: int
    chat_id: int
    parent_id: int | None
    role: str
    text: str
    created_at: float
    updated_at: float
    preset: str | None = None
    k: int | None = None
    temperature: float | None = None
    stop_reason: str | None = None  # None while streaming (or when the process died mid-reply)
    error: str | None = None
    stats: dict[str, Any] | None = field(default=None)
    origins: list[int] | None = field(default=None, repr=False)  # engine.origins.encode_runs of the text

    @property
    def interrupted(self) -> bool:
        """A reply that never finished: its process ended mid-stream."""
        return self.role == "assistant" and self.stop_reason is None


def title_from(text: str) -> str:
    """A chat title from its first message: the first non-empty line, spaces collapsed, cut at 60 chars."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def message_from_row(row: sqlite3.Row) -> MessageRecord:
    """A `messages` row as a record: its stats and origins read back from JSON."""
    data = dict(row)
    stats = data.pop("stats")
    origins = data.pop("origins", None)
    try:
        runs = orjson.loads(origins) if origins else None
    except orjson.JSONDecodeError:
        runs = None  # only colouring is lost
    return MessageRecord(
        **data, stats=orjson.loads(stats) if stats else None, origins=runs if isinstance(runs, list) else None
    )
