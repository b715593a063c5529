"""How many CPU threads llama.cpp should use, decided from timings: at load, and again when a reply stalls.

llama.cpp's CPU threads meet at a barrier after every operation of a forward pass. With another process busy on
the CPU, one of them is often descheduled and the others spin until it returns: a pass of 20 ms then takes a
second or more (measured: 0.3-6.5 tok/s at 2 threads beside a busy process, 50.9 tok/s at 1 thread). One thread
never waits for another, so it degrades only by its share of the CPU.

Two decisions, both pure (timings in, a thread count out), so they can be tested with planted numbers:
- `choose_threads`: at load, a few short decodes timed at each candidate count, interleaved; the fewest threads
  unless more are clearly faster (more threads only pay off on an idle machine, and one thread is robust).
- `StallWatch`: during a reply, verify passes compared with what the load-time measurement predicts; several
  far slower passes in a row mean the machine got busy after load, and the backend drops to one thread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# More threads must beat fewer by this fraction of the time (median against median) to be chosen.
THREAD_MARGIN = 0.10
# A verify pass slower than STALL_FACTOR x its measured cost counts as stalled; STALL_ROUNDS in a row drop to 1.
STALL_FACTOR = 4.0
STALL_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int
    # Median seconds of the timed decode per candidate count.
    medians: dict[int, float]

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


class StallWatch:
    """Counts verify passes in a row that ran far slower than predicted; `observe` answers True once, on the pass
    that completes a stall (STALL_ROUNDS passes over STALL_FACTOR x the predicted cost). A pass at normal speed
    resets the count."""

    def __init__(
        self, predicted: Callable[[int], float], factor: float = STALL_FACTOR, rounds: int = STALL_ROUNDS
    ) -> None:
        self.predicted = predicted  # width (tokens in the pass) -> seconds, from the load-time measurement
        self.factor = factor
        self.rounds = rounds
        self.slow_in_a_row = 0
        self.slow_seconds: list[float] = []
        self.fired = False

    def observe(self, seconds: float, width: int) -> bool:
        if self.fired:
            return False
        expected = self.predicted(max(1, width))
        if expected <= 0 or seconds <= self.factor * expected:
            self.slow_in_a_row = 0
            self.slow_seconds = []
            return False
        self.slow_in_a_row += 1
        self.slow_seconds.append(seconds / expected)
        if self.slow_in_a_row >= self.rounds:
            self.fired = True
            return True
        return False

    def slowdown(self) -> float:
        """How many times slower than predicted the stalled passes ran (median)."""
        return statistics.median(self.slow_seconds) if self.slow_seconds else 0.0
