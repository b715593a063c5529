"""The thread-count decisions (engine.backends.llamacpp.threads) on planted timings, and the backend's thread control
(`ThreadControl`, the object `LlamaCppBackend` holds) dropping to one thread.

No model here: the timings are the ones a busy machine gave (2 threads 680 ms a token beside another process,
1 thread 30 ms), the ones an idle one gives (2 threads faster), and the ones a long context gives on an idle
machine (the embedded model at 2 threads: ~15-18 ms a one-token pass over 64 cached tokens, ~65 ms over 3,700).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.backends.llamacpp.threads import (
    MAX_GROWTH_PER_1K,
    RECHECK_FIRST_S,
    RECHECK_MAX_S,
    RECHECK_NOTE,
    SCALE_BOUNDS,
    STALL_FACTOR,
    STALL_NOTE,
    STALL_ROUNDS,
    THREAD_CLOSE_SAMPLES,
    THREAD_SAMPLES,
    PassCost,
    RecheckClock,
    StallWatch,
    ThreadChoice,
    ThreadControl,
    choose_threads,
    close_call,
)

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


def measured_control(timings: dict[int, list[float]]) -> tuple[ThreadControl, dict[int, int]]:
    """A control whose one-token decodes take the planted seconds per thread count, in turn."""
    control = ThreadControl(2, [])
    control.target = SimpleNamespace(n_vocab=100, ids=[], clear=lambda: None, prefill=lambda ids: None)
    control.set_threads = lambda count: setattr(control, "threads", count)
    taken = {n: 0 for n in timings}

    def time_decodes(tokens) -> float:
        n = control.threads
        taken[n] += 1
        return timings[n][taken[n] - 1]

    control.time_decodes = time_decodes
    return control, taken


def test_a_close_call_at_load_samples_on_before_it_keeps_one_thread() -> None:
    # The first 5 each read 2 threads 15.8 ms against 17.3 (within the margin); 5 more show the idle machine.
    control, taken = measured_control(
        {1: [17.3 * MS] * 5 + [20 * MS] * 5, 2: [15.8 * MS] * 5 + [13 * MS] * 5}
    )
    choice = control.measure(counts=(1, 2))
    assert taken == {1: THREAD_CLOSE_SAMPLES, 2: THREAD_CLOSE_SAMPLES}
    assert choice.threads == 2
    assert close_call(choose_threads({1: [17.3 * MS] * 5, 2: [15.8 * MS] * 5}))


def test_a_clear_result_at_load_stops_at_the_usual_samples() -> None:
    for timings, threads in (
        ({1: [20 * MS] * 10, 2: [12 * MS] * 10}, 2),  # idle: the cores clearly faster
        ({1: [20 * MS] * 10, 2: [40 * MS] * 10}, 1),  # busy: more threads slower
        ({1: [20 * MS] * 10, 2: [20 * MS] * 10}, 1),  # a tie is no close call
    ):
        control, taken = measured_control(timings)
        assert control.measure(counts=(1, 2)).threads == threads
        assert taken == {1: THREAD_SAMPLES, 2: THREAD_SAMPLES}
    assert not close_call(choose_threads({1: [20 * MS] * 5, 2: [12 * MS] * 5}))
    assert not close_call(choose_threads({1: [20 * MS] * 5}))


# --- noticing a stall mid-reply -----------------------------------------------------------------------------


def predicted(width: int, context: int = 0) -> float:
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
    watch = StallWatch(lambda width, context: 0.0)
    assert not any(watch.observe(5.0, 1) for _ in range(10))


# --- the thread control's reaction (no model: the hook alone) ---------------------------------------------------


def planted_control(step_seconds: list[float]) -> tuple[ThreadControl, list[int]]:
    control = ThreadControl(2, [])
    switched: list[int] = []
    control.set_threads = lambda count: (switched.append(count), setattr(control, "threads", count))
    control.threads = 2
    control.target = SimpleNamespace(step_times=step_seconds, pass_context=0)
    control.notes = ["2 threads: measured at load"]
    control.thread_note = 0
    control.stall_watch = StallWatch(predicted)
    return control, switched


def test_a_stall_drops_to_one_thread_with_a_note_on_the_reply_and_the_backend() -> None:
    control, switched = planted_control([])
    notes: list[str] = []
    for _ in range(STALL_ROUNDS):
        control.target.step_times.append(300 * MS)  # the decode the round loop just timed
        control.on_round(300 * MS, 1, notes)
    assert switched == [1] and control.threads == 1
    assert notes == [STALL_NOTE.format(slowdown=30, rounds=STALL_ROUNDS)]
    assert tuple(control.notes) == tuple(notes)  # the thread line is replaced, not added to
    assert "dropped to 1 thread" in notes[0] and "30x slower" in notes[0]
    control.on_round(300 * MS, 1, notes)  # later rounds: no second drop, no second note
    assert switched == [1] and len(notes) == 1


def test_the_decode_time_counts_not_the_round_s_python_work() -> None:
    # The round loop's seconds include sampling; a slow Python side (the TUI redrawing) is no thread stall.
    control, switched = planted_control([])
    notes: list[str] = []
    for _ in range(STALL_ROUNDS * 2):
        control.target.step_times.append(10 * MS)
        control.on_round(300 * MS, 1, notes)
    assert switched == [] and notes == []


# --- what a pass costs at a long context ------------------------------------------------------------------

# Best-of load timings at 2 threads, 1 and 9 tokens, over 64 and 576 cached tokens: ~14 ms more per 1k tokens for a
# one-token pass (what the embedded model's F16 GGUF does on this kind of machine).
SHORT = {1: 15 * MS, 9: 27 * MS}
LONG = {1: 22 * MS, 9: 37 * MS}


def long_context_cost() -> PassCost:
    return PassCost(SHORT, 64, LONG, 576)


def test_the_cost_of_a_pass_grows_with_the_cached_tokens_per_width() -> None:
    cost = long_context_cost()
    assert cost.predict(1, 64) == pytest.approx(15 * MS)
    assert cost.predict(1, 0) == pytest.approx(15 * MS)  # shorter than the short context: the base
    assert cost.predict(1, 576) == pytest.approx(22 * MS)
    per_token_1 = 7 * MS / 512
    assert cost.predict(1, 3700) == pytest.approx(15 * MS + per_token_1 * (3700 - 64))
    assert cost.predict(9, 3700) == pytest.approx(27 * MS + 10 * MS / 512 * (3700 - 64))
    # Widths between and beyond the measured ones: linear in the width.
    assert cost.predict(5, 64) == pytest.approx(21 * MS)
    assert cost.predict(5, 576) == pytest.approx((22 + 37) / 2 * MS)
    assert cost.predict(17, 64) == pytest.approx(39 * MS)
    assert "ms per 1k cached tokens" in cost.note()
    # Not measured at a long context (a small max_context): the cost does not grow, as before.
    flat = PassCost(SHORT, 64)
    assert flat.predict(1, 3700) == pytest.approx(15 * MS) and flat.note() == "one-token pass 15.0 ms"
    # A long timing that another process disturbed at load is capped (3 base costs per 1,000 tokens).
    disturbed = PassCost(SHORT, 64, {1: 900 * MS, 9: 37 * MS}, 576)
    assert disturbed.predict(1, 1064) == pytest.approx(15 * MS * (1 + MAX_GROWTH_PER_1K))
    # A long timing below the short one (noise) is no negative growth.
    assert PassCost(SHORT, 64, {1: 14 * MS, 9: 26 * MS}, 576).predict(1, 4000) == pytest.approx(15 * MS)


def test_the_verify_cost_ratios_are_read_at_the_context_of_the_pass() -> None:
    from engine.decoding.cost_model import VerifyCostModel

    # The embedded model's F16 GGUF on a Zen 4 EPYC at load: every query row attends over the whole cache, so a
    # 9-token pass grows ~5.6x faster with the context than a one-token pass.
    cost = PassCost({1: 11 * MS, 9: 23.5 * MS}, 64, {1: 13.6 * MS, 9: 38.3 * MS}, 576)
    costs = VerifyCostModel.from_samples({1: 11 * MS, 5: 17 * MS, 9: 23.5 * MS})  # over 64 cached tokens
    costs.set_context_shape(cost.predict, 64)
    assert costs.ratio(9) == pytest.approx(23.5 / 11)
    costs.context = 2000
    expected = cost.predict(9, 2000) / cost.predict(1, 2000)
    assert costs.ratio(9) == pytest.approx(expected) and expected > 23.5 / 11 + 1.0
    assert 17 / 11 < costs.ratio(5) < costs.ratio(9)
    # A pass observed there as the shape says leaves the ratio held at the reference context as it was.
    for _ in range(40):  # the recent one-token time (a moving average) settles at this context's
        costs.observe(1, cost.predict(1, 2000))
    costs.observe(9, cost.predict(9, 2000))
    assert costs.as_dict()[9] == pytest.approx(23.5 / 11, rel=1e-4)
    costs.context = 64
    assert costs.ratio(9) == pytest.approx(23.5 / 11, rel=1e-4)
    # Without a shape (another control): the context-blind ratios.
    blind = VerifyCostModel.from_samples({1: 11 * MS, 9: 23.5 * MS})
    blind.context = 2000
    assert blind.ratio(9) == pytest.approx(23.5 / 11)


def test_a_long_context_alone_is_no_stall_but_the_old_width_only_rule_read_it_as_one() -> None:
    # One-token passes of a reply over 3,700 cached tokens on an idle machine: ~65 ms each (4.3x the short cost),
    # a little slower than load's extrapolation.
    cost = long_context_cost()
    idle = cost.predict(1, 3700) * 1.05
    watch = StallWatch(cost.predict)
    assert not any(watch.observe(idle, 1, 3700 + i) for i in range(50))
    blind = StallWatch(lambda width, context: cost.predict(width, 64))
    assert any(blind.observe(idle, 1, 3700 + i) for i in range(50))


def test_a_real_stall_at_a_long_context_is_still_caught() -> None:
    cost = long_context_cost()
    watch = StallWatch(cost.predict)
    stalled = 5 * cost.predict(1, 3700)  # a descheduled thread: 5x what the context explains
    assert [watch.observe(stalled, 1, 3700) for _ in range(STALL_ROUNDS)][-1] is True
    assert watch.slowdown() == pytest.approx(5.0)


def test_passes_at_normal_speed_teach_the_context_term_within_bounds() -> None:
    cost = long_context_cost()
    # This machine's long passes cost twice what load extrapolated: the scale moves toward 2.
    truth = 15 * MS + 2 * (7 * MS / 512) * (3000 - 64)
    for _ in range(100):
        cost.learn(1, 3000, truth)
    assert cost.scale == pytest.approx(2.0, rel=0.01)
    assert cost.predict(1, 3000) == pytest.approx(truth, rel=0.01)
    # Short contexts teach nothing (their time is the base), and the scale stays within its bounds.
    before = cost.scale
    cost.learn(1, 100, 1.0)
    assert cost.scale == before
    for _ in range(200):
        cost.learn(1, 3000, 10.0)
    assert cost.scale == pytest.approx(SCALE_BOUNDS[1], rel=0.01)
    for _ in range(200):
        cost.learn(1, 3000, 1 * MS)
    assert cost.scale == pytest.approx(SCALE_BOUNDS[0], rel=0.01)


def test_the_recheck_clock_waits_longer_each_time_one_thread_stays() -> None:
    clock = RecheckClock(100.0)
    assert not clock.due(100.0 + RECHECK_FIRST_S - 1) and clock.due(100.0 + RECHECK_FIRST_S)
    clock.still_one(200.0)
    assert not clock.due(200.0 + RECHECK_FIRST_S) and clock.due(200.0 + 2 * RECHECK_FIRST_S)
    for _ in range(20):
        clock.still_one(1000.0)
    assert clock.wait == RECHECK_MAX_S


def long_control() -> tuple[ThreadControl, list[int], list[float]]:
    control, switched = planted_control([])
    control.pass_cost = long_context_cost()
    control.pass_cost_threads = 2
    control.stall_watch = StallWatch(control.predicted_cost())
    now = [1000.0]
    control.clock = lambda: now[0]
    return control, switched, now


def test_the_backend_keeps_its_threads_over_a_long_context_and_drops_on_a_stall_there() -> None:
    control, switched, _ = long_control()
    notes: list[str] = []
    for i in range(60):  # a reply over 3,700 cached tokens at idle speed
        control.target.pass_context = 3700 + i
        control.target.step_times.append(68 * MS)
        control.on_round(70 * MS, 1, notes)
    assert switched == [] and notes == []
    for _ in range(STALL_ROUNDS):  # then another process takes a core
        control.target.step_times.append(900 * MS)
        control.on_round(900 * MS, 1, notes)
    assert switched == [1] and len(notes) == 1 and notes[0].startswith("dropped to 1 thread")


def test_after_a_drop_the_counts_are_measured_again_and_the_cores_come_back() -> None:
    control, switched, now = long_control()
    control.thread_choice = ThreadChoice(2, {1: 30 * MS, 2: 15 * MS})
    control.max_context = 8192
    control.target.ids = list(range(3700))
    measured: list[tuple] = []
    busy = [True]

    def measure(counts=None, on_cache=False):
        measured.append((tuple(counts), on_cache))
        return choose_threads({1: [30 * MS], 2: [200 * MS if busy[0] else 15 * MS]})

    control.measure = measure
    notes: list[str] = []
    for _ in range(STALL_ROUNDS):
        control.target.step_times.append(900 * MS)
        control.on_round(900 * MS, 1, notes)
    assert switched == [1]
    # The next replies start before the wait is over: nothing measured.
    control.recheck_threads(notes)
    assert measured == []
    # Still busy at the first check: one thread stays, the next check waits twice as long.
    now[0] += RECHECK_FIRST_S
    control.recheck_threads(notes)
    assert measured == [((1, 2), True)] and switched == [1, 1] and len(notes) == 1
    now[0] += RECHECK_FIRST_S
    control.recheck_threads(notes)
    assert len(measured) == 1
    # The busy spell is over: back to two threads, said on the reply and in the control's thread line.
    busy[0] = False
    now[0] += RECHECK_FIRST_S
    reply_notes: list[str] = []
    control.recheck_threads(reply_notes)
    assert switched == [1, 1, 2] and control.threads == 2
    assert reply_notes == [
        RECHECK_NOTE.format(threads="2 threads", timings="1 thread 30.0 ms, 2 threads 15.0 ms")
    ]
    assert tuple(control.notes) == tuple(reply_notes)
    # ... and a new stall is caught again.
    for _ in range(STALL_ROUNDS):
        control.target.step_times.append(900 * MS)
        control.on_round(900 * MS, 1, reply_notes)
    assert switched == [1, 1, 2, 1]


def test_a_load_that_measured_one_thread_faster_measures_again_later() -> None:
    # A busy spell during load's measurement (seen: 2 threads 194.9 ms against 1 thread 58.7, where 2 threads run
    # 34 ms idle) chose one thread for the whole session. Now that choice is measured again as after a drop: the
    # cores come back once they are faster, and the thread line says so.
    control, switched, now = long_control()
    control.max_context = 8192
    control.target.ids = list(range(100))
    measured: list[tuple] = []
    control.measure = lambda counts=None, on_cache=False: (
        measured.append((tuple(counts), on_cache)) or choose_threads({1: [58 * MS], 2: [34 * MS]})
    )
    control.adopt_measured(choose_threads({1: [58.7 * MS], 2: [194.9 * MS]}))
    assert switched == [1] and control.threads == 1 and control.recheck is not None
    notes: list[str] = []
    control.recheck_threads(notes)
    assert measured == []  # not before the wait
    now[0] += RECHECK_FIRST_S
    control.recheck_threads(notes)
    assert measured == [((1, 2), True)] and switched == [1, 2] and control.threads == 2
    assert notes == [RECHECK_NOTE.format(threads="2 threads", timings="1 thread 58.0 ms, 2 threads 34.0 ms")]
    # The fresh medians scale the load-time pass costs now.
    assert control.thread_choice.medians[2] == pytest.approx(34 * MS)
    # Where the cores won at load, or only one count was measured, nothing is scheduled.
    for medians in ({1: [30 * MS], 2: [15 * MS]}, {1: [30 * MS]}):
        control, _, _ = long_control()
        control.adopt_measured(choose_threads(medians))
        assert control.recheck is None
