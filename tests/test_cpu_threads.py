"""The thread-count decisions (engine.backends.llamacpp_threads) on planted timings, and the backend's drop to one thread.

No model here: the timings are the ones a busy machine gave (2 threads 680 ms a token beside another process,
1 thread 30 ms) and the ones an idle one gives (2 threads faster).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.backends.llamacpp import STALL_NOTE, LlamaCppBackend
from engine.backends.llamacpp_threads import STALL_FACTOR, STALL_ROUNDS, StallWatch, choose_threads

MS = 0.001


# --- choosing at load -------------------------------------------------------------------------------------


def test_a_busy_machine_picks_one_thread() -> None:
    choice = choose_threads({1: [30 * MS] * 5, 2: [680 * MS, 25 * MS, 900 * MS, 700 * MS, 650 * MS]})
    assert choice.threads == 1
    assert choice.medians == {1: pytest.approx(30 * MS), 2: pytest.approx(680 * MS)}
    assert choice.note().startswith("1 thread: measured at load")


def test_an_idle_machine_picks_the_cores_when_they_are_clearly_faster() -> None:
    choice = choose_threads({1: [20 * MS] * 5, 2: [12 * MS] * 5})
    assert choice.threads == 2
    assert "2 threads 12.0 ms" in choice.note() and "1 thread 20.0 ms" in choice.note()


def test_more_threads_within_the_margin_are_not_worth_it() -> None:
    # 5% faster: within the 10% margin, one thread (robust to a busy machine later) is kept.
    assert choose_threads({1: [20 * MS] * 3, 2: [19 * MS] * 3}).threads == 1
    assert choose_threads({1: [20 * MS] * 3, 2: [17.9 * MS] * 3}).threads == 2


def test_the_median_ignores_one_stalled_sample() -> None:
    # A mean would be dragged to 188 ms by the one stall; the median (10 ms) is what the count usually does.
    assert choose_threads({1: [20 * MS] * 5, 2: [10 * MS, 10 * MS, 900 * MS, 10 * MS, 10 * MS]}).threads == 2
    # ... and a single lucky sample does not make a stalling count look fast.
    assert (
        choose_threads({1: [20 * MS] * 5, 2: [900 * MS, 5 * MS, 900 * MS, 800 * MS, 700 * MS]}).threads == 1
    )


def test_more_than_two_counts_and_no_samples() -> None:
    assert choose_threads({1: [40 * MS], 2: [25 * MS], 4: [15 * MS]}).threads == 4
    assert choose_threads({1: [40 * MS], 2: [15 * MS], 4: [25 * MS]}).threads == 2
    empty = choose_threads({})
    assert empty.threads == 1 and empty.note() == "1 thread"


# --- noticing a stall mid-reply -----------------------------------------------------------------------------


def predicted(width: int) -> float:
    return 10 * MS * (1 + 0.1 * (width - 1))


def test_three_slow_rounds_in_a_row_are_a_stall_and_fire_once() -> None:
    watch = StallWatch(predicted)
    slow = 50 * MS  # 5x a one-token pass
    assert [watch.observe(slow, 1) for _ in range(STALL_ROUNDS)] == [False] * (STALL_ROUNDS - 1) + [True]
    assert watch.slowdown() == pytest.approx(5.0)
    assert watch.observe(slow, 1) is False  # once: the backend has dropped already


def test_a_round_at_normal_speed_resets_the_count() -> None:
    watch = StallWatch(predicted)
    for seconds in (50 * MS, 50 * MS, 11 * MS, 50 * MS, 50 * MS):
        assert watch.observe(seconds, 1) is False
    assert watch.observe(50 * MS, 1) is True


def test_slow_is_relative_to_the_width_and_the_factor() -> None:
    watch = StallWatch(predicted)
    wide = predicted(9) * STALL_FACTOR  # exactly at the factor: not slow
    assert not any(watch.observe(wide, 9) for _ in range(10))
    # The same seconds on one-token passes are over 4x their cost.
    assert [watch.observe(wide, 1) for _ in range(STALL_ROUNDS)][-1] is True


def test_no_prediction_never_stalls() -> None:
    watch = StallWatch(lambda width: 0.0)
    assert not any(watch.observe(5.0, 1) for _ in range(10))


# --- the backend's reaction (no model: the hook alone) ---------------------------------------------------


def planted_backend(step_seconds: list[float]) -> tuple[LlamaCppBackend, list[int]]:
    backend = LlamaCppBackend("unused.gguf")
    switched: list[int] = []
    backend.set_threads = lambda count: (switched.append(count), setattr(backend, "threads", count))
    backend.threads = 2
    backend.target = SimpleNamespace(step_times=step_seconds)
    backend.notes = ["2 threads: measured at load"]
    backend._thread_note = 0
    backend._stall_watch = StallWatch(predicted)
    return backend, switched


def test_a_stall_drops_to_one_thread_with_a_note_on_the_reply_and_the_backend() -> None:
    backend, switched = planted_backend([])
    notes: list[str] = []
    for _ in range(STALL_ROUNDS):
        backend.target.step_times.append(300 * MS)  # the decode the round loop just timed
        backend._on_round(300 * MS, 1, notes)
    assert switched == [1] and backend.threads == 1
    assert notes == [STALL_NOTE.format(slowdown=30, rounds=STALL_ROUNDS)]
    assert backend.info.notes == tuple(notes)  # the thread line is replaced, not added to
    assert "dropped to 1 thread" in notes[0] and "30x slower" in notes[0]
    backend._on_round(300 * MS, 1, notes)  # later rounds: no second drop, no second note
    assert switched == [1] and len(notes) == 1


def test_the_decode_time_counts_not_the_round_s_python_work() -> None:
    # The round loop's seconds include sampling; a slow Python side (the TUI redrawing) is no thread stall.
    backend, switched = planted_backend([])
    notes: list[str] = []
    for _ in range(STALL_ROUNDS * 2):
        backend.target.step_times.append(10 * MS)
        backend._on_round(300 * MS, 1, notes)
    assert switched == [] and notes == []
