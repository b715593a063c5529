"""One message of a conversation as the session keeps it (`Turn`): its text, stats and where it came from.

A plain dataclass below both the session and its history (which builds turns from stored messages), so neither
imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import MessageStats
from engine.origins import OriginRun


@dataclass(slots=True)
class Turn:
    role: str
    content: str
    stats: MessageStats | None = None
    origins: tuple[bool, ...] | None = None
    cancelled: bool = False
    message_id: int | None = None  # its row in the store, when the session saves
    # Which characters came from accepted drafts (draft colouring), as (text, from_draft) runs.
    runs: tuple[OriginRun, ...] | None = None
    interrupted: bool = False  # a stored reply whose process ended mid-stream (it has no stats)
    error: str = ""  # a stored reply that failed: why
    # A stored reply's (preset, K, temperature) as it started: all that is known of an interrupted one.
    started: tuple[str | None, int | None, float | None] | None = None
