"""Threads under the test runner: the count a test gives llama.cpp where it wants a fixed one (no measuring at
load), and the share of the CPUs each pytest-xdist worker keeps to (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.backends.base import usable_cpus


def fixed_threads() -> int:
    """Two where this process may use two cores; one where pytest-xdist gave this worker one core: two llama.cpp
    threads on one core wait a time slice at every ggml barrier, and a test then runs minutes instead of seconds."""
    return min(2, usable_cpus())


def worker_share(worker: str, count: int, cpus: Sequence[int]) -> list[int] | None:
    """The CPUs pytest-xdist's `worker` ("gw0", "gw1", ...) of `count` keeps to: every count-th of `cpus` from its
    index. None outside xdist, with one worker, or with fewer CPUs than workers (then they share them all)."""
    if not worker.startswith("gw") or count < 2 or len(cpus) < count:
        return None
    return sorted(cpus)[int(worker[2:]) % count :: count]
