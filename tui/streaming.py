"""The hand-off between the generation thread and the UI: a locked buffer of text runs, and the pace of redraws.

The worker's `on_event` callback runs on the generation thread for every Chunk. It only appends to
`ReplyBuffer` and, at most every `interval_s`, asks for one message to be posted; the UI drains everything
buffered in one go. So nothing per token touches the DOM, and a burst of chunks costs one repaint.

The interval is tied to the eye, not to the model: `RENDER_INTERVAL_S` (5 redraws a second still reads as flowing
text; 10 cost the model ~6% of its speed on 2 cores) whatever the token rate. `RenderPace` stretches it while the
UI thread uses more than its budget of a core (a long code block re-highlighted per redraw, a wide terminal, a long
chat), so the UI never takes the cores the model needs: where the model's threads fill every core this process may
use, llama.cpp's threads meet at a barrier every operation and a third busy thread stalls them all, so the budget
is `CONTENDED_UI_BUDGET` there (`ui_budget`): each 1% of a core the UI takes costs the model ~2% of its speed.
There the first text waits an interval too (`ReplyBuffer.first_waits`): drawn at once, laying out the reply's first
paragraph (~10-25 ms of the UI thread at 160x48) lands in the first tokens, and a one-sentence answer decoded in
~0.1 s ran at ~0.8x `generate`; waiting, it is drawn once, whole, when it ends.

The two threads share one interpreter lock. A thread coming back from llama.cpp (which runs without the lock)
waits for it while the UI thread lays out a reply: up to the interpreter's switch interval, 5 ms by default, about
a token's time on a small model. `GIL_SWITCH_INTERVAL_S` shortens that while a reply streams.

Draft highlighting needs text per origin: `engine.origins.split_chunk_by_origin` splits each chunk, on the
generation thread, never on the UI.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backends.base import usable_cpus
from engine.events import Chunk
from engine.origins import OriginRun, split_chunk_by_origin

RENDER_INTERVAL_S = 0.2
MAX_RENDER_INTERVAL_S = 1.0  # a long chat at 160x48 needs nearly this much (docs/performance.md)
UI_BUDGET = 0.06  # of a core for the UI thread while a reply streams (docs/performance.md: redraw pace)
# The same where the model's threads take every core: each 1% of a core costs the model ~2% there.
CONTENDED_UI_BUDGET = 0.03
# The interpreter's switch interval while a reply streams (sys.setswitchinterval; CPython's default is 0.005).
GIL_SWITCH_INTERVAL_S = 0.0005


def model_threads(backend: object) -> int | None:
    """The CPU threads a loaded backend computes with, where it says (llama.cpp's `threads`, transformers' when set)."""
    threads = getattr(backend, "threads", None)
    return threads if isinstance(threads, int) and not isinstance(threads, bool) else None


def contended(threads: int | None, cores: int | None = None) -> bool:
    """Whether the model's CPU `threads` (None: it computes elsewhere, or says not) take every usable core."""
    cores = usable_cpus() if cores is None else cores
    return threads is not None and threads >= cores


def ui_budget(threads: int | None, cores: int | None = None) -> float:
    """The UI thread's share of a core while a reply streams: `CONTENDED_UI_BUDGET` where the model's CPU `threads`
    take every usable core (`contended`), `UI_BUDGET` where one is left over."""
    return CONTENDED_UI_BUDGET if contended(threads, cores) else UI_BUDGET


@dataclass
class RenderPace:
    """The redraw interval, from the UI thread's CPU use since the last redraw (`observe`, UI thread only).

    Over `budget` the interval grows in proportion (a redraw costing 30 ms at 10 Hz is 0.3 of a core: at 5 Hz,
    0.15); well under it, it comes back towards `base`. CPU time is the thread's own (`time.thread_time`), so
    waiting for the model does not count."""

    base: float = RENDER_INTERVAL_S
    budget: float = UI_BUDGET
    ceiling: float = MAX_RENDER_INTERVAL_S
    interval: float = RENDER_INTERVAL_S
    _cpu: float | None = None
    _wall: float = 0.0

    def observe(self, cpu: float | None = None, wall: float | None = None) -> float:
        """Account the UI thread's time since the last call; returns the interval to use from now on."""
        cpu = time.thread_time() if cpu is None else cpu
        wall = time.monotonic() if wall is None else wall
        if self._cpu is not None and wall > self._wall:
            share = (cpu - self._cpu) / (wall - self._wall)
            if share > self.budget:
                self.interval = min(self.ceiling, self.interval * share / self.budget)
            elif share < self.budget / 2:
                self.interval = max(self.base, self.interval * 0.8)
        self._cpu, self._wall = cpu, wall
        return self.interval


@dataclass
class LockHandoff:
    """The interpreter's switch interval at `interval` between `begin` and `end` (a reply streaming), the one
    before it back after; a second `begin` keeps the first one's saved value."""

    interval: float = GIL_SWITCH_INTERVAL_S
    _saved: float | None = None

    def begin(self) -> None:
        if self._saved is None:
            self._saved = sys.getswitchinterval()
            sys.setswitchinterval(self.interval)

    def end(self) -> None:
        if self._saved is not None:
            sys.setswitchinterval(self._saved)
            self._saved = None


@dataclass
class ReplyBuffer:
    """Chunks of one reply on their way from the generation thread to the UI."""

    decode: Callable[[list[int]], str] | None = None
    interval_s: float = RENDER_INTERVAL_S  # set by the UI thread (RenderPace), read here: a float is atomic
    # The first chunk waits an interval too, instead of being posted at once (where the model is `contended`).
    first_waits: bool = False
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
            if self.first_waits and self.last_chunk_t is None:
                self._last_post = now
            self._pending.extend(runs)
            self.last_chunk_t = chunk.t
            if now - self._last_post >= self.interval_s:
                self._last_post = now
                return True
        return False

    def take(self) -> list[OriginRun]:
        """Everything buffered since the last take (UI thread). The next post waits a whole interval from now."""
        with self._lock:
            runs, self._pending = self._pending, []
            self._last_post = time.monotonic()
        return runs

    @property
    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    @property
    def overdue(self) -> bool:
        """Text waiting longer than an interval: the stream stalled right after a chunk that was not posted (the
        UI's timer drains it then; draining on every tick would redraw at the timer's rate, not the pace's)."""
        with self._lock:
            return bool(self._pending) and time.monotonic() - self._last_post >= self.interval_s
