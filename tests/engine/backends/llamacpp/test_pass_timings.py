"""A model loaded again in the same process (F12 switching drafters, a benchmark's second backend) reads the pass
timings its first load measured instead of decoding them again; another cache type or thread count is another
model as loaded and is timed afresh; the next start reads them from disk once a one-token pass confirms them (as
fast, or slower as at a busy moment), and times everything again where it does not: a pass much faster than stored
(the table was timed at a busy moment) or far slower (another machine) (engine/backends/llamacpp/pass_timings.py)."""

from __future__ import annotations

import json
import time
import types

import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend, pass_timings  # noqa: E402
from tests.support.threads import fixed_threads  # noqa: E402


class Clock(types.SimpleNamespace):
    """time.perf_counter as pass_timings.py sees it, counting the passes it times (two reads per pass)."""

    def __init__(self) -> None:
        super().__init__(reads=0)

    def perf_counter(self) -> float:
        self.reads += 1
        return time.perf_counter()

    def time(self) -> float:  # when a table was stored (not a pass's timing)
        return time.time()


@pytest.fixture
def clock(monkeypatch, tmp_path) -> Clock:
    pass_timings.forget(store=tmp_path / "pass-timings.json")
    clock = Clock()
    monkeypatch.setattr(pass_timings, "time", clock)
    yield clock
    pass_timings.forget()


# A context too short for the busy-CPU guard's long-context passes (threads.py: 64 + LEARN_MIN_EXTRA cached tokens
# and the widest pass): what this module checks is how a table is kept, read and confirmed, the same whatever it
# holds; timing those passes (a 576-token prefill and three widths over it) took 10 of a load's 16 s on one Zen 1
# core. The long-context timings are checked in test_threads_on_real_decodes.py.
MAX_CONTEXT = 256


def loaded(path, draft: str, cache_mode: str = "fp16", threads: int | None = None) -> LlamaCppBackend:
    backend = LlamaCppBackend(
        path, draft=draft, cache_mode=cache_mode, max_context=MAX_CONTEXT, threads=threads
    )
    backend.load()
    return backend


@pytest.mark.slow
def test_a_second_load_of_the_same_model_reads_the_first_ones_timings(clock: Clock) -> None:
    from engine.models import ensure_embedded_gguf

    path = ensure_embedded_gguf()
    first = loaded(path, "ngram", threads=fixed_threads())
    try:
        timed = clock.reads
        assert timed > 0  # the first load timed its passes
        prior, guard = first.target.costs.as_dict(), first.thread_control.pass_cost
    finally:
        first.close()
    again = loaded(path, "ngram", threads=fixed_threads())
    try:
        assert clock.reads == timed  # no pass timed again
        assert again.target.costs.as_dict() == prior
        assert again.thread_control.pass_cost.short == guard.short
        assert again.thread_control.pass_cost is not guard  # what live passes learn stays with each backend
    finally:
        again.close()
    # Another cache type: timed afresh.
    other = loaded(path, "ngram", cache_mode="q8", threads=fixed_threads())
    try:
        assert clock.reads > timed
    finally:
        other.close()


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_next_start_reads_the_stored_timings_once_a_one_token_pass_confirms_them(clock: Clock) -> None:
    from engine.models import ensure_embedded_gguf

    path = ensure_embedded_gguf()
    first = loaded(path, "ngram", threads=1)
    prior = first.target.costs.as_dict()
    first.close()
    store = pass_timings.store_path()
    assert store.exists()
    pass_timings.forget(store=store)  # a new process: nothing in memory, the file stays
    clock.reads = 0
    again = loaded(path, "ngram", threads=1)
    try:
        (kept,) = pass_timings._kept.values()
        if kept.confirmation == "kept":  # the machine ran as fast as at the first load
            assert clock.reads == 2 * pass_timings.ROUNDS  # the check's one-token pass, nothing else
            assert again.target.costs.as_dict() == prior
        else:  # a busy moment then or now: everything timed again, as at a first load
            assert kept.confirmation == "timed afresh" and clock.reads > 2 * pass_timings.ROUNDS
    finally:
        again.close()


def _stored_check(entry: dict) -> float:
    """The one-token pass (pass_timings.CHECK) of a table as the file holds it."""
    return next(row[2] for row in entry["best"] if row[:2] == list(pass_timings.CHECK))


def _load_again_with_the_check_scaled(clock: Clock, factor: float) -> tuple[LlamaCppBackend, str, float]:
    """The embedded model loaded once (its table stored), the stored one-token pass scaled by `factor` as if timed
    on another machine or at another moment, and the model loaded again by a new process: the second backend, the
    table's key and the planted figure; `clock` counts from the second load."""
    from engine.models import ensure_embedded_gguf

    path = ensure_embedded_gguf()
    loaded(path, "ngram", threads=1).close()
    store = pass_timings.store_path()
    data = json.loads(store.read_text())
    (key,) = data
    for row in data[key]["best"]:
        row[2] *= factor if row[:2] == list(pass_timings.CHECK) else 1
    data[key]["at"] = 0.0
    store.write_text(json.dumps(data))
    pass_timings.forget(store=store)  # a new process: nothing in memory, the file stays
    clock.reads = 0
    return loaded(path, "ngram", threads=1), key, _stored_check(data[key])


@pytest.mark.slow
@pytest.mark.parametrize(
    "factor", [10.0, 0.1], ids=["stored-10x-slower-timed-when-busy", "stored-10x-faster-another-machine"]
)
def test_stored_timings_that_no_longer_hold_are_timed_afresh_and_stored(clock: Clock, factor: float) -> None:
    again, key, planted = _load_again_with_the_check_scaled(clock, factor)
    try:
        (kept,) = pass_timings._kept.values()
        assert kept.confirmation == "timed afresh"
        assert clock.reads == 2 * pass_timings.ROUNDS * len(kept.best)  # the check, then every other pass
        now = _stored_check(json.loads(pass_timings.store_path().read_text())[key])
        assert (now < planted / 2) if factor > 1 else (now > planted * 2)
    finally:
        again.close()


@pytest.mark.slow
def test_stored_timings_are_kept_when_the_check_runs_at_a_busy_moment(clock: Clock) -> None:
    """A one-token pass twice as slow as the stored table says is a busy moment now (one process beside us on 2
    cores), not a reason to replace an idle machine's figures with a busy one's: the table is kept, nothing but
    the check is timed, and the file marks it used (the tables used last are the ones it keeps)."""
    again, key, planted = _load_again_with_the_check_scaled(clock, 0.5)
    try:
        (kept,) = pass_timings._kept.values()
        assert kept.confirmation == "kept"
        assert clock.reads == 2 * pass_timings.ROUNDS  # the check's one-token pass, nothing else
        entry = json.loads(pass_timings.store_path().read_text())[key]
        assert _stored_check(entry) == planted and entry["at"] > 0.0  # kept as it was, marked used
    finally:
        again.close()


def test_the_file_keeps_the_tables_timed_last(tmp_path, monkeypatch) -> None:
    """Tests build random models afresh each run: the file keeps only the KEPT_TABLES stored (timed, or confirmed
    at a load) last."""
    store = tmp_path / "pass-timings.json"
    pass_timings.forget(store=store)
    monkeypatch.setattr(pass_timings, "KEPT_TABLES", 3)
    try:
        for i in range(5):
            table = pass_timings.PassTimings(f"model {i}")
            table.best = {pass_timings.CHECK: 0.01 + i}
            table._write()
        assert sorted(json.loads(store.read_text())) == ["model 2", "model 3", "model 4"]
        assert pass_timings.PassTimings.kept("model 4").best == {pass_timings.CHECK: 4.01}
        assert pass_timings.PassTimings.kept("model 0").best == {}
    finally:
        pass_timings.forget()
