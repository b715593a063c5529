"""A model loaded again in the same process (F12 switching drafters, a benchmark's second backend) reads the pass
timings its first load measured instead of decoding them again; another cache type or thread count is another
model as loaded and is timed afresh (engine/backends/llamacpp/pass_timings.py)."""

from __future__ import annotations

import time
import types

import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend, pass_timings  # noqa: E402


class Clock(types.SimpleNamespace):
    """time.perf_counter as pass_timings.py sees it, counting the passes it times (two reads per pass)."""

    def __init__(self) -> None:
        super().__init__(reads=0)

    def perf_counter(self) -> float:
        self.reads += 1
        return time.perf_counter()


@pytest.fixture
def clock(monkeypatch) -> Clock:
    pass_timings.forget()
    clock = Clock()
    monkeypatch.setattr(pass_timings, "time", clock)
    yield clock
    pass_timings.forget()


def loaded(path, draft: str, cache_mode: str = "fp16", threads: int | None = None) -> LlamaCppBackend:
    backend = LlamaCppBackend(path, draft=draft, cache_mode=cache_mode, max_context=1024, threads=threads)
    backend.load()
    return backend


def test_a_second_load_of_the_same_model_reads_the_first_ones_timings(clock: Clock) -> None:
    from engine.models import ensure_embedded_gguf

    path = ensure_embedded_gguf()
    first = loaded(path, "ngram", threads=2)
    try:
        timed = clock.reads
        assert timed > 0  # the first load timed its passes
        prior, guard = first.target.costs.as_dict(), first.thread_control.pass_cost
    finally:
        first.close()
    again = loaded(path, "ngram", threads=2)
    try:
        assert clock.reads == timed  # no pass timed again
        assert again.target.costs.as_dict() == prior
        assert again.thread_control.pass_cost.short == guard.short
        assert again.thread_control.pass_cost is not guard  # what live passes learn stays with each backend
    finally:
        again.close()
    other = loaded(path, "ngram", cache_mode="q8", threads=2)  # another cache type: timed afresh
    try:
        assert clock.reads > timed
    finally:
        other.close()


def test_the_two_consumers_share_the_64_token_timings(clock: Clock) -> None:
    """The cost model's prior and the busy-CPU guard read one figure for a width over 64 cached tokens: each
    (width, cached tokens) is timed ROUNDS times, once."""
    from engine.models import ensure_embedded_gguf

    backend = loaded(ensure_embedded_gguf(), "ngram", threads=1)
    try:
        guard = backend.thread_control.pass_cost
        (kept,) = (timings.best for timings in pass_timings._kept.values())
        assert guard.short == {w: kept[(w, 64)] for w in guard.short}
        assert set(guard.short) < {w for (w, context) in kept if context == 64}  # the prior's widths and more
        assert clock.reads == 2 * pass_timings.ROUNDS * len(kept)
    finally:
        backend.close()
