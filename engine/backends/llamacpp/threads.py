"""How many CPU threads llama.cpp should use, decided from timings: at load, and again when a reply stalls.

llama.cpp's CPU threads meet at a barrier after every operation of a forward pass. With another process busy on
the CPU, one of them is often descheduled and the others spin until it returns: a pass of 20 ms then takes a
second or more (measured: 0.3-6.5 tok/s at 2 threads beside a busy process, 50.9 tok/s at 1 thread). One thread
never waits for another, so it degrades only by its share of the CPU.

Two decisions, both pure (timings in, a thread count out), so they can be tested with planted numbers:
- `choose_threads`: at load, a few short decodes timed at each candidate count, interleaved; the fewest threads
  unless more are clearly faster (more threads only pay off on an idle machine, and one thread is robust).
- `StallWatch`: during a reply, verify passes compared with what `PassCost` predicts for their width and the
  tokens already cached; several far slower passes in a row mean the machine got busy after load, and the
  backend drops to one thread (and measures again later: `RecheckClock`).
`ThreadControl`, an object the llama.cpp backend holds, times llama.cpp for them and acts on what they decide.

`PassCost` is what a pass should cost on an idle machine: timed at load at a short and a longer context (a pass
over 3,700 cached tokens legitimately takes ~4x one over 64: attention reads every cached key), extrapolated
linearly in the cached tokens, and refined by the passes of the replies that ran at normal speed. Without the
context term a long chat reads as a busy machine (measured before: "16x slower" at 1.4k tokens, nothing else
running, and the rest of the session on one thread).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.backends.llamacpp.pass_timings import PassTimings

# More threads must beat fewer by this fraction of the time (median against median) to be chosen.
THREAD_MARGIN = 0.10
# A verify pass slower than STALL_FACTOR x its measured cost counts as stalled; STALL_ROUNDS in a row drop to 1.
STALL_FACTOR = 4.0
STALL_ROUNDS = 3
# PassCost: passes over fewer extra cached tokens than this teach nothing about the context term (too little of
# their time is attention); the learnt scale of that term moves by LEARN_WEIGHT per pass within SCALE_BOUNDS of
# what load measured.
LEARN_MIN_EXTRA = 256
# The measured growth is capped at this many base costs per 1,000 cached tokens: a load-time timing that another
# process disturbed must not blind the guard at long contexts (measured on the embedded model: ~0.8 per 1,000).
MAX_GROWTH_PER_1K = 3.0
LEARN_WEIGHT = 0.1
SCALE_BOUNDS = (0.5, 4.0)
# After a drop to one thread the counts are measured again once RECHECK_FIRST_S has passed (at the start of a
# reply); each time one thread still wins, the wait doubles, up to RECHECK_MAX_S.
RECHECK_FIRST_S = 60.0
RECHECK_MAX_S = 960.0
# Choosing the thread count at load: up to THREAD_SAMPLES samples per count (each THREAD_SAMPLE_STEPS one-token
# decodes), interleaved; sampling stops early once THREAD_BUDGET_S is spent (a stalled count can take seconds).
# A close call (more threads measured faster, but within the margin) samples on to THREAD_CLOSE_SAMPLES: on an
# idle 2-core host 1 load in 4 had read 2 threads 15.8 ms against 1 thread 17.3 and kept one thread, where the
# other loads measured 12.7-14.3 against 17.9-22 ms.
THREAD_SAMPLES = 5
THREAD_CLOSE_SAMPLES = 10
THREAD_SAMPLE_STEPS = 3
THREAD_BUDGET_S = 1.5
# PassCost is timed at load with passes of 1 and PASS_COST_WIDTH tokens over 64 cached tokens and over
# CONTEXT_CALIBRATION (where the context allows).
PASS_COST_WIDTH = 9
# ... and with a pass as wide as the loop may send (at most this: a long-match draft's 48 tokens plus the last one).
PASS_COST_WIDEST = 49
CONTEXT_CALIBRATION = 576
BUSY_NOTE = (
    "slow: verify passes ran {slowdown:.0f}x slower than measured at load at {threads} (another process busy on "
    "the CPU?)"
)
STALL_NOTE = (
    "dropped to 1 thread: verify passes ran {slowdown:.0f}x slower than measured at load, {rounds} in a row "
    "(another process busy on the CPU?); set threads to keep a count"
)
RECHECK_NOTE = "now {threads}: measured again after running on 1 thread ({timings} per token)"


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int
    # Median seconds of the timed decode per candidate count.
    medians: dict[int, float]

    @property
    def most(self) -> int:
        """The most threads measured (the choice itself where nothing was)."""
        return max(self.medians, default=self.threads)

    def note(self) -> str:
        """One line for the backend's notes: the choice and the numbers behind it."""
        if len(self.medians) < 2:
            return threads_label(self.threads)
        timings = ", ".join(f"{threads_label(n)} {s * 1000:.1f} ms" for n, s in sorted(self.medians.items()))
        why = "the fastest" if self.threads > 1 else "more were not clearly faster"
        return f"{threads_label(self.threads)}: measured at load per token ({timings}), {why}"


def threads_label(count: int) -> str:
    return f"{count} thread{'' if count == 1 else 's'}"


def choose_threads(samples: Mapping[int, Sequence[float]], margin: float = THREAD_MARGIN) -> ThreadChoice:
    """The thread count to use from timed decodes (seconds) per count: the fewest threads unless a larger count's
    median is lower by more than `margin` (then the one with the lowest median)."""
    medians = {n: statistics.median(times) for n, times in samples.items() if n >= 1 and times}
    if not medians:
        return ThreadChoice(1, {})
    fewest = min(medians)
    best = min(medians, key=lambda n: (medians[n], n))
    if best != fewest and medians[best] < medians[fewest] * (1.0 - margin):
        return ThreadChoice(best, medians)
    return ThreadChoice(fewest, medians)


def close_call(choice: ThreadChoice) -> bool:
    """The fewest threads kept although a larger count's median was lower (within the margin): worth more samples."""
    medians = choice.medians
    if len(medians) < 2:
        return False
    fewest = min(medians)
    return choice.threads == fewest and min(medians.values()) < medians[fewest]


def _interpolate(points: Mapping[int, float], width: int) -> float:
    """Linear in the width between the nearest measured widths, with the last slope beyond them; a single point
    grows by 10% per extra token (a modest guess, as the cost model's)."""
    known = sorted(points)
    if width in points:
        return points[width]
    if len(known) == 1:
        return points[known[0]] * (1.0 + 0.1 * (width - known[0]))
    below = [w for w in known if w < width] or known[:1]
    above = [w for w in known if w > width]
    a, b = (below[-1], above[0]) if above and below[-1] != above[0] else (known[-2], known[-1])
    slope = (points[b] - points[a]) / (b - a)
    return max(points[a] + slope * (width - a), 0.0)


class PassCost:
    """Seconds a verify pass of `width` tokens over `context` cached tokens should take on an idle machine.

    `short` holds best-of timings per width over `short_context` cached tokens; `long`, the same widths over
    `long_context` (None: not measured, the cost does not grow). The growth per cached token is their
    difference over the distance, per width (never negative), extrapolated linearly past the longer context.
    `learn` scales that growth by what passes at normal speed show (within SCALE_BOUNDS of the measured one)."""

    def __init__(
        self,
        short: Mapping[int, float],
        short_context: int,
        long: Mapping[int, float] | None = None,
        long_context: int | None = None,
    ) -> None:
        self.short = {w: s for w, s in short.items() if w >= 1 and s > 0}
        self.short_context = short_context
        self.growth: dict[int, float] = {}
        if long and long_context and long_context > short_context:
            distance = long_context - short_context
            for width, seconds in long.items():
                if width in self.short and seconds > 0:
                    cap = MAX_GROWTH_PER_1K * self.short[width] / 1000
                    self.growth[width] = min(max(0.0, (seconds - self.short[width]) / distance), cap)
        self.scale = 1.0

    def base(self, width: int) -> float:
        return _interpolate(self.short, width) if self.short else 0.0

    def per_token(self, width: int) -> float:
        """Seconds each extra cached token adds to a pass of `width` tokens (the learnt scale included)."""
        return _interpolate(self.growth, width) * self.scale if self.growth else 0.0

    def predict(self, width: int, context: int = 0) -> float:
        extra = max(0, context - self.short_context)
        return self.base(width) + self.per_token(width) * extra

    def learn(self, width: int, context: int, seconds: float) -> None:
        """A pass that ran at normal speed (the watch did not count it slow) took `seconds`: move the scale of
        the context term toward what it implies. Short contexts teach nothing (their time is the base's)."""
        extra = context - self.short_context
        growth = _interpolate(self.growth, width) if self.growth else 0.0
        # A width past the widest measured is extrapolated: its error would move the scale every width shares.
        if extra < LEARN_MIN_EXTRA or growth <= 0 or seconds <= 0 or width > max(self.short, default=0):
            return
        implied = (seconds - self.base(width)) / (growth * extra)
        implied = min(max(implied, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])
        self.scale += LEARN_WEIGHT * (implied - self.scale)

    def note(self) -> str:
        """The measured figures, for the doctor and the bench's details."""
        one = self.base(1) * 1000
        if not self.growth:
            return f"one-token pass {one:.1f} ms"
        per_1k = self.per_token(1) * 1000 * 1000
        return f"one-token pass {one:.1f} ms + {per_1k:.1f} ms per 1k cached tokens"


class StallWatch:
    """Counts verify passes in a row that ran far slower than predicted for their width and cached tokens;
    `observe` answers True once, on the pass that completes a stall (STALL_ROUNDS passes over STALL_FACTOR x the
    predicted cost). A pass at normal speed resets the count (`last_slow` says how the latest pass was judged)."""

    def __init__(
        self, predicted: Callable[[int, int], float], factor: float = STALL_FACTOR, rounds: int = STALL_ROUNDS
    ) -> None:
        self.predicted = predicted  # (width, cached tokens) -> seconds, e.g. PassCost.predict
        self.factor = factor
        self.rounds = rounds
        self.slow_in_a_row = 0
        self.slow_seconds: list[float] = []
        self.fired = False
        self.last_slow = False

    def observe(self, seconds: float, width: int, context: int = 0) -> bool:
        if self.fired:
            return False
        expected = self.predicted(max(1, width), max(0, context))
        if expected <= 0 or seconds <= self.factor * expected:
            self.slow_in_a_row = 0
            self.slow_seconds = []
            self.last_slow = False
            return False
        self.last_slow = True
        self.slow_in_a_row += 1
        self.slow_seconds.append(seconds / expected)
        if self.slow_in_a_row >= self.rounds:
            self.fired = True
            return True
        return False

    def slowdown(self) -> float:
        """How many times slower than predicted the stalled passes ran (median)."""
        return statistics.median(self.slow_seconds) if self.slow_seconds else 0.0


class RecheckClock:
    """When a drop to one thread is worth measuring again: `due(now)` after the wait, which starts at
    RECHECK_FIRST_S from the drop and doubles (up to RECHECK_MAX_S) each time one thread is still the choice.
    A busy spell ends; a session should not stay on one thread because of one."""

    def __init__(
        self, dropped_at: float, first: float = RECHECK_FIRST_S, most: float = RECHECK_MAX_S
    ) -> None:
        self.wait = first
        self.most = most
        self.next_at = dropped_at + first

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def still_one(self, now: float) -> None:
        """The re-measure kept one thread: wait twice as long before the next."""
        self.wait = min(self.wait * 2, self.most)
        self.next_at = now + self.wait


class ThreadControl:
    """The llama.cpp backend's thread count over a session: measured at load, watched per verify pass against
    `PassCost`, dropped to one thread on a stall and measured again later.

    The backend holds one (`LlamaCppBackend.thread_control`) and hands it the loaded models with `attach`; the
    thread line it keeps in the backend's notes (`notes`, the backend's own list) is replaced as the count changes.
    """

    def __init__(self, threads: int, notes: list[str], clock: Callable[[], float] = time.monotonic) -> None:
        # The count llama.cpp runs with now: the physical cores (or the configured count) until load measures.
        self.threads = threads
        self.notes = notes
        self.clock = clock  # the recheck's clock (tests plant one)
        self.thread_choice: ThreadChoice | None = None
        self.stall_watch: StallWatch | None = None
        # What a pass should cost by width and cached tokens at `pass_cost_threads` threads (measured at load).
        self.pass_cost: PassCost | None = None
        self.pass_cost_threads = 0
        # Set after a drop to one thread: when to measure the counts again.
        self.recheck: RecheckClock | None = None
        self.thread_note: int | None = None  # index of the thread line in `notes`
        self.lib: Any = None
        self.target: Any = None  # the target's LlamaCppModel
        self.draft: Any = None  # the draft model's, or None
        self.max_context = 0

    def attach(self, lib: Any, target: Any, draft: Any, max_context: int) -> None:
        """The loaded models this count applies to (llama_cpp's bindings, the target's and draft's LlamaCppModel)."""
        self.lib, self.target, self.draft, self.max_context = lib, target, draft, max_context

    def set_threads(self, count: int) -> None:
        """Run the target (and the draft model) with `count` threads from the next decode on."""
        for state in (self.target, self.draft):
            if state is not None:
                self.lib.llama_set_n_threads(state.ctx.ctx, count, count)
        self.threads = count

    def adopt_measured(self, choice: ThreadChoice) -> None:
        """Run with the count load measured. Fewer threads than were measured (the cores read slower at load: a
        busy moment, or a machine where one thread wins) are measured again later, as after a drop (RecheckClock):
        a session must not stay on one thread because its load met a busy spell."""
        self.thread_choice = choice
        self.set_threads(choice.threads)
        if choice.threads < choice.most:
            self.recheck = RecheckClock(self.clock())

    def context_threads(self) -> int:
        """The thread count the target's llama.cpp context runs with (what llama.cpp itself reports)."""
        return int(self.lib.llama_n_threads(self.target.ctx.ctx))

    def measure(self, counts: Sequence[int] | None = None, on_cache: bool = False) -> ThreadChoice:
        """Time short runs of one-token decodes at 1 thread and at the physical cores, interleaved, and choose.

        `on_cache`: on top of the conversation's cache, which is kept (a re-measure between replies must not
        cost the next reply its prefix); otherwise over a 64-token filler, and the cache is cleared."""
        target = self.target
        counts = sorted(set(counts or (1, self.threads)))
        filler = [(11 + 17 * i) % max(target.n_vocab - 1, 1) + 1 for i in range(64 + THREAD_SAMPLE_STEPS)]
        samples: dict[int, list[float]] = {n: [] for n in counts}
        spent = 0.0
        kept = len(target.ids)
        try:
            if not on_cache:
                target.clear()
                target.prefill(filler[:64])
            for sample in range(THREAD_CLOSE_SAMPLES):
                for count in counts if sample % 2 == 0 else counts[::-1]:
                    self.set_threads(count)
                    per_token = self.time_decodes(filler[64:])
                    samples[count].append(per_token)
                    spent += per_token * THREAD_SAMPLE_STEPS
                if sample >= 1 and spent > THREAD_BUDGET_S:
                    break
                if sample + 1 == THREAD_SAMPLES and not close_call(choose_threads(samples)):
                    break
        finally:
            if on_cache:
                target.crop(kept)
            else:
                target.clear()
        return choose_threads(samples)

    def recheck_threads(self, notes: list[str]) -> None:
        """After a drop to one thread (or a load that measured one faster), once the recheck clock says so (at
        the start of a reply): measure 1 and the most threads measured again on top of the cache; where more
        threads are clearly faster, move to them (the stall watch armed anew) and say so on the reply; else wait
        longer before the next check."""
        clock = self.recheck
        if clock is None or self.thread_choice is None or not clock.due(self.clock()):
            return
        target = self.target
        if len(target.ids) + THREAD_SAMPLE_STEPS + 2 > self.max_context:
            clock.still_one(self.clock())  # no room on top of this cache; the next reply may have some
            return
        choice = self.measure(counts=(1, self.thread_choice.most), on_cache=True)
        if choice.threads <= 1:
            self.set_threads(1)
            clock.still_one(self.clock())
            return
        self.recheck = None
        self.thread_choice = choice  # its medians scale the load-time pass costs now (thread_scale)
        self.set_threads(choice.threads)
        self.stall_watch = StallWatch(self.predicted_cost())
        timings = ", ".join(
            f"{threads_label(n)} {s * 1000:.1f} ms" for n, s in sorted(choice.medians.items())
        )
        note = RECHECK_NOTE.format(threads=threads_label(choice.threads), timings=timings)
        notes.append(note)
        if self.thread_note is not None:
            self.notes[self.thread_note] = note
        else:
            self.notes.append(note)

    def time_decodes(self, tokens: Sequence[int]) -> float:
        """Seconds per token of one-token decodes of `tokens` at the current thread count (padded where plain
        steps are: the kernels replies run); the cache is put back as it was."""
        target = self.target
        length = len(target.ids)
        start = time.perf_counter()
        for token in tokens:
            target.decode([token], outputs=1)
        elapsed = time.perf_counter() - start
        target.crop(length)
        return elapsed / max(1, len(tokens))

    def measure_pass_cost(self, max_draft: int, timings: PassTimings | None = None) -> PassCost:
        """Best-of timings of passes of 1 and PASS_COST_WIDTH tokens over 64 cached tokens and over
        CONTEXT_CALIBRATION (where the context has room): the busy-CPU guard's idea of an idle machine. `timings`:
        the model's kept pass timings (pass_timings.py), of which only the missing ones are decoded."""
        timings = timings or PassTimings()
        # The widest pass the loop may send is timed too (a long-match draft's), so that no width it sends is
        # priced by extrapolation.
        widest = max(PASS_COST_WIDTH, min(max_draft + 1, PASS_COST_WIDEST))
        short = 64
        long = min(CONTEXT_CALIBRATION, self.max_context - widest - 8)
        widths = (1, PASS_COST_WIDTH, widest) if widest > PASS_COST_WIDTH else (1, PASS_COST_WIDTH)
        short_s = timings.passes(self.target, widths, short)
        long_s = timings.passes(self.target, widths, long) if long >= short + LEARN_MIN_EXTRA else None
        return PassCost(short_s, short, long_s, long if long_s else None)

    def predicted_cost(self):
        """(width, cached tokens) -> seconds a verify pass should take at the chosen count on an idle machine:
        `pass_cost` where load measured it; else the load-time cost by width alone."""
        if self.pass_cost is not None:
            predict, scale = self.pass_cost.predict, self.thread_scale()
            return predict if scale == 1.0 else lambda width, context=0: predict(width, context) * scale
        costs = self.target.costs
        one = costs.one_token_s if costs is not None and costs.one_token_s else None
        if one is None and self.thread_choice is not None:
            one = self.thread_choice.medians.get(self.threads)
        frozen = costs.as_dict() if costs is not None else {}

        def predicted(width: int, context: int = 0) -> float:
            ratio = frozen.get(width)
            if ratio is None:
                ratio = 1.0 + 0.1 * (width - 1)  # not measured: a modest growth with width
            return (one or 0.0) * ratio

        return predicted

    def thread_scale(self) -> float:
        """How much slower a pass runs at the current thread count than at the count `pass_cost` was measured at
        (the load-time one-token medians of both counts): after a drop to one thread, a reply is judged against
        what one thread costs, not the load-time count."""
        measured = self.pass_cost_threads
        if not measured or self.threads == measured or self.thread_choice is None:
            return 1.0
        medians = self.thread_choice.medians
        now, then = medians.get(self.threads), medians.get(measured)
        return now / then if now and then else 1.0

    def on_round(self, seconds: float, width: int, notes: list[str], busy: StallWatch | None = None) -> None:
        """After each round: a verify pass (its llama.cpp decode alone) against what a pass of its width over
        its cached tokens should cost; a stall of several rounds drops to one thread (measured again later),
        noted on the reply and the backend. Where the count cannot drop, `busy` notes the stall on the reply
        (once). Passes at normal speed teach the cost model how the context adds to a pass."""
        watch = self.stall_watch
        decode_s = self.target.step_times[-1] if self.target.step_times else seconds
        context = self.target.pass_context
        judge = watch if watch is not None else busy
        if judge is None:
            return
        fired = judge.observe(decode_s, width, context)
        if not judge.last_slow and self.pass_cost is not None and self.threads == self.pass_cost_threads:
            self.pass_cost.learn(width, context, decode_s)
        if not fired:
            return
        if watch is None:
            notes.append(BUSY_NOTE.format(slowdown=judge.slowdown(), threads=threads_label(self.threads)))
            return
        self.stall_watch = None
        self.recheck = RecheckClock(self.clock())
        self.set_threads(1)
        note = STALL_NOTE.format(slowdown=watch.slowdown(), rounds=watch.rounds)
        notes.append(note)
        if self.thread_note is not None:
            self.notes[self.thread_note] = note
        else:
            self.notes.append(note)
