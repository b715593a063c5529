"""The hand-off between the generation thread and the UI: a locked buffer of text runs.

The worker's `on_event` callback runs on the generation thread for every Chunk. It only appends to
`ReplyBuffer` and, at most every `POST_INTERVAL_S`, asks for one message to be posted; the UI drains everything
buffered in one go. So nothing per token touches the DOM, and a burst of chunks costs one repaint.

Draft highlighting needs text per origin: `engine.origins.split_chunk_by_origin` splits each chunk, on the
generation thread, never on the UI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.events import Chunk
from engine.origins import OriginRun, merge_runs, split_chunk_by_origin

__all__ = ["OriginRun", "ReplyBuffer", "merge_runs", "split_chunk_by_origin"]

POST_INTERVAL_S = 0.05


@dataclass
class ReplyBuffer:
    """Chunks of one reply on their way from the generation thread to the UI."""

    decode: Callable[[list[int]], str] | None = None
    interval_s: float = POST_INTERVAL_S
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: list[OriginRun] = field(default_factory=list)
    _last_post: float = 0.0
    last_chunk_t: float | None = None
    finished: bool = False

    def add(self, chunk: Chunk) -> bool:
        """Buffer a chunk (generation thread). True when the caller should post a wake-up message now."""
        runs = split_chunk_by_origin(chunk, self.decode)
        now = time.monotonic()
        with self._lock:
            self._pending.extend(runs)
            self.last_chunk_t = chunk.t
            if now - self._last_post >= self.interval_s:
                self._last_post = now
                return True
        return False

    def take(self) -> list[OriginRun]:
        """Everything buffered since the last take (UI thread)."""
        with self._lock:
            runs, self._pending = self._pending, []
        return runs

    @property
    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)
