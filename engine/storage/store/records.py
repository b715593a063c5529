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
    private: bool = False  # never indexed for the history drafter


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
    origins: list[int | list] | None = field(
        default=None, repr=False
    )  # engine.origins.encode_runs of the text

    @property
    def interrupted(self) -> bool:
        """A reply that never finished: its process ended mid-stream."""
        return self.role == "assistant" and self.stop_reason is None


def title_from(text: str) -> str:
    """A chat title from its first message: the first non-empty line outside code fences, spaces collapsed, cut at
    60 chars. Attached files (`name`: headers over fenced blocks, engine/session/attachments.py) are named after
    it ("Add type hints (add.py)"), or alone where the message has no line of its own; a message that is only code
    takes its first line."""
    first: str | None = None
    prose: str | None = None
    names: list[str] = []
    fence = ""
    for raw in text.splitlines():
        line = raw.strip()
        if first is None and line:
            first = line
        if fence:
            fence = "" if line == fence else fence
        elif line.startswith("```"):
            fence = line[: len(line) - len(line.lstrip("`"))]
        elif len(line) > 3 and line.startswith("`") and line.endswith("`:") and "`" not in line[1:-2]:
            names.append(line[1:-2])
        elif line and prose is None:
            prose = line
    if prose is None and not names:
        prose = first
    title = " ".join((prose or "").split())
    if names:
        title = f"{title} ({', '.join(names)})" if title else ", ".join(names)
    return title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1].rstrip() + "…"


def chat_from_row(row: sqlite3.Row) -> ChatRecord:
    data = dict(row)
    return ChatRecord(**{**data, "private": bool(data.get("private"))})


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
