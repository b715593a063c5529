"""The hand-off between the generation thread and the UI: a locked buffer of text runs.

The worker's `on_event` callback runs on the generation thread for every Chunk. It only appends to
`ReplyBuffer` and, at most every `POST_INTERVAL_S`, asks for one message to be posted; the UI drains everything
buffered in one go. So nothing per token touches the DOM, and a burst of chunks costs one repaint.

Draft highlighting needs text per origin (accepted from the draft vs the target's own token). A verification
round's chunk is shaped `accepted drafts..., one target token`, so `split_chunk_by_origin` decodes just the
trailing target-own tokens with the backend's tokenizer and splits the chunk text there; where that does not
line up (a multi-byte character cut across tokens, an unusual shape) it falls back to a proportional split by
token count. The split runs on the generation thread, never on the UI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.events import Chunk

POST_INTERVAL_S = 0.05

# (text, from_draft)
OriginRun = tuple[str, bool]


def split_chunk_by_origin(chunk: Chunk, decode: Callable[[list[int]], str] | None = None) -> list[OriginRun]:
    origins = chunk.origins
    if not chunk.text:
        return []
    if not origins or all(origins) or not any(origins):
        return [(chunk.text, bool(origins) and origins[0])]
    runs: list[tuple[bool, list[int]]] = []
    for index, origin in enumerate(origins):
        if runs and runs[-1][0] == origin:
            runs[-1][1].append(index)
        else:
            runs.append((origin, [index]))
    # The usual shape: one run of accepted drafts, then the target's own token(s).
    if len(runs) == 2 and decode is not None and len(chunk.token_ids) == len(origins):
        tail_ids = [chunk.token_ids[i] for i in runs[1][1]]
        try:
            tail = decode(tail_ids)
        except Exception:  # noqa: BLE001 - a decode hiccup only costs precision of the colouring
            tail = ""
        if tail and chunk.text.endswith(tail) and len(tail) < len(chunk.text):
            cut = len(chunk.text) - len(tail)
            return [(chunk.text[:cut], runs[0][0]), (chunk.text[cut:], runs[1][0])]
    # Fallback: split the text in proportion to token counts.
    out: list[OriginRun] = []
    total = len(origins)
    consumed = 0
    position = 0
    for origin, indices in runs:
        consumed += len(indices)
        end = round(len(chunk.text) * consumed / total)
        if end > position:
            out.append((chunk.text[position:end], origin))
        position = end
    return out


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


def merge_runs(runs: list[OriginRun], new: list[OriginRun]) -> None:
    """Append `new` to `runs`, joining neighbours of the same origin so the list stays short."""
    for text, origin in new:
        if not text:
            continue
        if runs and runs[-1][1] == origin:
            runs[-1] = (runs[-1][0] + text, origin)
        else:
            runs.append((text, origin))
