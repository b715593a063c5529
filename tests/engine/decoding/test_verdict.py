"""Whether the draft pays: one verdict for doctor and the chat (engine.decoding.verdict), shown at load, in the
status bar while drafting is off, in the inspector and when it turns; and the figures nothing measured reads "–"."""

from __future__ import annotations

import threading

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.decoding.acceptance import AcceptanceAccounting
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.verdict import draft_verdict, verdict_k_max
from engine.events import Chunk, Done
from engine.session import ChatSession
from tests.support.tui import make_app, send, status, wait_ready, wait_until
from tui.formatting import stats_line

# The Qwen2.5-Coder pair on a 2-core CPU, as the issue saw it: r(2) 2.00, c 0.42.
SLOW_CURVE = {1: 1.0, 2: 2.0, 3: 2.9, 4: 3.8, 5: 4.7, 6: 5.6, 7: 6.5}
CHEAP_CURVE = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2, 6: 1.25, 7: 1.3}


def slow_costs() -> VerifyCostModel:
    return VerifyCostModel.from_ratios(SLOW_CURVE, draft_ratio=0.42)


# --- the verdict (pure, exact numbers) --------------------------------------------------------------------


def test_the_verdict_prices_every_k_at_high_acceptance_and_says_why():
    verdict = draft_verdict(slow_costs(), "model", 6)
    assert verdict.status == "warn" and verdict.pays is False
    # K 1: (1 + 0.9) / (2.0 + 0.42) = 0.785; every longer K is worse.
    assert verdict.k == 1 and verdict.speedup == pytest.approx(1.9 / 2.42)
    assert verdict.c == pytest.approx(0.42) and verdict.r2 == pytest.approx(2.0)
    assert verdict.status_text() == "draft off: doesn't pay (running c 0.42, r(2) 2.00)"
    assert verdict.doctor_line() == (
        "no: a verify pass of 2 costs r(2) 2.00 plain steps and a draft step running c 0.42 of a target step, so even at "
        "90% acceptance the best K (1) gives 0.79x (compute-bound here); adaptive K leaves drafting off; n-gram "
        "drafting (--draft ngram) costs no draft steps"
    )
    assert verdict.chat_line("draft qwen2.5-coder-0.5b") == (
        "draft qwen2.5-coder-0.5b doesn't pay on this machine: " + verdict.doctor_line().removeprefix("no: ")
    )


def test_doctor_and_the_chat_call_the_same_verdict():
    from engine.benchmarks.draft_prediction import draft_pays_verdict

    for costs, mode in ((slow_costs(), "model"), (slow_costs(), "ngram"), (None, "model")):
        verdict = draft_verdict(costs, mode, 6)
        assert draft_pays_verdict(costs, mode, 6) == (verdict.status, verdict.doctor_line())


def test_n_gram_drafts_are_free_so_only_the_verify_cost_decides():
    cheap = draft_verdict(VerifyCostModel.from_ratios(CHEAP_CURVE), "ngram", 6)
    assert cheap.status == "pass" and cheap.figures() == "r(2) 1.05" and cheap.c == 0.0
    # r(2) 2.00: even a free draft cannot pay (1.9 tokens for 2 plain steps).
    slow = draft_verdict(VerifyCostModel.from_ratios(SLOW_CURVE), "ngram", 6)
    assert slow.status == "warn" and slow.status_text() == "draft off: doesn't pay (r(2) 2.00)"


def test_nothing_measured_makes_no_verdict():
    untimed = VerifyCostModel.from_ratios(SLOW_CURVE)  # the draft step never timed: c unknown, not 0
    verdict = draft_verdict(untimed, "model", 6)
    assert verdict.status == "skip" and verdict.c is None and verdict.figures() == "running c –, r(2) 2.00"
    assert verdict.status_text() == "" and verdict.chat_line("draft x") == ""
    assert draft_verdict(VerifyCostModel(), "ngram", 6).status == "skip"  # no pass wider than 1 timed
    assert draft_verdict(slow_costs(), "none", 6).status == "skip"


def test_the_verdict_prices_up_to_the_largest_k_of_the_presets_that_draft():
    from engine.presets import load_presets

    assert verdict_k_max(load_presets().values()) == 6


# --- figures nothing measured reads "–" -------------------------------------------------------------------


def chunk(tokens: int, drafted: int = 0, accepted: int = 0, t: float = 1.0) -> Chunk:
    ids = tuple(range(tokens))
    origins = (True,) * min(accepted, tokens) + (False,) * (tokens - min(accepted, tokens))
    return Chunk("x" * tokens, ids, drafted, accepted, origins, t, k=drafted)


def finish(acc: AcceptanceAccounting, done: Done):
    return acc.finish(
        done, 2.0, preset="code", num_draft_tokens=6, temperature=0.0, draft_mode="model", backend="b",
        model="m", k_mode="adaptive",
    )  # fmt: skip


def test_tau_is_at_least_one_the_final_round_that_emitted_only_the_stop_token_is_not_a_round():
    acc = AcceptanceAccounting(t_start=0.0)
    for i in range(12):
        acc.add(chunk(1, t=1.0 + i))
    acc.add(chunk(0, drafted=2, accepted=0, t=20.0))  # its only token was end-of-turn
    stats = finish(acc, Done("end_of_turn", prompt_tokens=5))
    # Was 12 tokens / 13 rounds = 0.92.
    assert stats.rounds == 12 and stats.mean_accepted_length == pytest.approx(1.0)
    assert stats.k_per_round == [0] * 12 and stats.drafted_tokens == 0


def test_a_round_whose_tokens_were_held_back_counts_when_they_arrive():
    acc = AcceptanceAccounting(t_start=0.0)
    acc.add(chunk(2, drafted=3, accepted=1))
    acc.add(chunk(0, drafted=3, accepted=2))  # its text held back (it may begin a stop string)
    assert acc.live.rounds == 1
    acc.add(chunk(4, drafted=3, accepted=2))  # ... and released with the next round's
    assert acc.live.rounds == 3 and acc.live.mean_accepted_length == pytest.approx(6 / 3)
    assert acc.live.drafted == 9 and acc.live.accepted == 5


def test_no_draft_step_timed_reads_dash_not_zero():
    acc = AcceptanceAccounting(t_start=0.0)
    for i in range(3):
        acc.add(chunk(1, t=1.0 + i))
    stats = finish(acc, Done("eos", prompt_tokens=5, draft_step_s=0.0, target_step_s=0.05, round_cost=1.0))
    assert stats.cost_ratio is None and stats.predicted_speedup is None and stats.alpha is None
    from textual.widgets import Static

    from tests.support.tui import plain
    from tui.screens.inspector import stats_table

    text = plain(Static(stats_table(stats)))
    assert "cost ratio c (this reply)  –" in text and "predicted speedup  –" in text


# --- the session and the chat ----------------------------------------------------------------------------


def test_the_session_judges_at_load_and_flags_a_verdict_that_turns():
    backend = ScriptedBackend("one two three four", draft_mode="model", costs=slow_costs())
    session = ChatSession(Settings(), backend=backend)
    session.load()
    assert session.verdict.status == "warn" and not session.verdict_changed
    result = session.send("hello", lambda event: None, threading.Event())
    assert result.stats.draft_verdict_status == "warn"
    assert result.stats.draft_verdict.startswith("doesn't pay (running c 0.42, r(2) 2.00")
    assert not session.verdict_changed
    backend.costs = VerifyCostModel.from_ratios(
        CHEAP_CURVE, draft_ratio=0.05
    )  # the next passes measured cheaper
    session.send("again", lambda event: None, threading.Event())
    assert session.verdict.status == "pass" and session.verdict_changed


def test_the_stats_line_says_why_nothing_was_drafted():
    acc = AcceptanceAccounting(t_start=0.0)
    acc.add(chunk(1))
    stats = finish(acc, Done("eos", prompt_tokens=5))
    import dataclasses

    off = dataclasses.replace(stats, draft_verdict="doesn't pay (…)", draft_verdict_status="warn")
    assert "no drafts (draft off: doesn't pay) · K 6" in stats_line(off)
    assert "no drafts (no K paid at the measured acceptance) · K 6" in stats_line(stats)


async def test_the_chat_says_at_load_whether_the_draft_pays_and_the_status_bar_while_it_stays_off():
    backend = ScriptedBackend("one two three", draft_mode="model", costs=slow_costs())
    app = make_app(backend)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: app.chat.chat_log.query(".chat-notice"))
        line = app.chat.chat_log.query(".chat-notice").first().plain
        assert line.startswith(
            "draft scripted-draft doesn't pay on this machine: a verify pass of 2 costs r(2) 2.00"
        )
        assert line.endswith(draft_verdict(slow_costs(), "model", 6).body())
        assert "draft off: doesn't pay (running c 0.42, r(2) 2.00)" in status(app)


async def test_the_chat_says_so_when_a_reply_turns_the_verdict():
    backend = ScriptedBackend("one two three", draft_mode="model", costs=slow_costs())
    app = make_app(backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: app.chat.chat_log.query(".chat-notice"))
        backend.costs = VerifyCostModel.from_ratios(CHEAP_CURVE, draft_ratio=0.05)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: len(app.chat.chat_log.query(".chat-notice")) == 2)
        assert (
            app.chat.chat_log.query(".chat-notice")
            .last()
            .plain.startswith(
                "now: draft scripted-draft can pay on this machine: a verify pass of 2 costs r(2) 1.05"
            )
        )
        assert "doesn't pay" not in status(app)


# --- the inspector: the verdict, long-match mode, the drafts cap, the recent average -------------------------


def inspector_text(stats, notes=()) -> str:
    from textual.widgets import Static

    from tests.support.tui import plain
    from tui.screens.inspector import stats_table

    return plain(Static(stats_table(stats, backend_notes=notes)))


def adaptive_stats(**changes):
    import dataclasses

    acc = AcceptanceAccounting(t_start=0.0)
    for k, tokens, accepted in ((3, 2, 1), (8, 9, 8), (8, 9, 8), (3, 1, 0)):
        acc.add(chunk(tokens, drafted=k, accepted=accepted))
    stats = acc.finish(
        Done("eos", prompt_tokens=5), 2.0, preset="code", num_draft_tokens=3, temperature=0.0, draft_mode="ngram",
        backend="llama.cpp", model="m", k_mode="adaptive",
    )  # fmt: skip
    return dataclasses.replace(stats, **changes)


def test_the_inspector_names_long_match_mode_where_rounds_drafted_past_k():
    text = inspector_text(adaptive_stats())
    assert "ngram  K adaptive, up to 3; long-match mode drafted up to 8 in 2 rounds" in text
    from tui.screens.inspector import drafting_line

    plain_k = adaptive_stats(k_per_round=[3, 2, 0])
    assert drafting_line(plain_k) == "ngram  K adaptive, up to 3"


def test_the_inspector_shows_the_backends_drafts_cap_and_the_verdict():
    note = "drafts capped at 3: width 5 rounds differently on this build"
    text = inspector_text(
        adaptive_stats(draft_verdict="doesn't pay (r(2) 2.00: …)", draft_verdict_status="warn"),
        notes=("cache: q8_0", note),
    )
    assert "drafts cap  " + note in text
    assert "draft verdict  doesn't pay (r(2) 2.00: …)" in text
    assert "drafts cap" not in inspector_text(adaptive_stats(), notes=("cache: q8_0",))
    # The wording before the lead's change is recognised too.
    assert "drafts cap" in inspector_text(adaptive_stats(), notes=("drafts are capped at 2 per round",))


def test_the_recent_average_says_whether_it_counts_this_reply():
    from types import SimpleNamespace

    from rich.console import Console

    from tui.screens.inspector import recent_comparison

    recent = SimpleNamespace(replies=2, acceptance=0.5, tau=1.5, tokens_per_s=10.0, ttft_s=0.2)
    console = Console(width=120, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(recent_comparison(adaptive_stats(), recent))
    console.print(recent_comparison(adaptive_stats(), recent, includes_this=False))
    out = console.export_text()
    assert "last 2 code (with this)" in out
    assert out.count("last 2 code") == 2


def test_the_status_bar_says_it_while_a_reply_streams_without_drafts_and_not_once_one_drafts():
    from types import SimpleNamespace

    from engine.events import LiveStats, ReplyStarted
    from tui.widgets.status_bar import collect_status, render_status

    verdict = draft_verdict(slow_costs(), "model", 6)
    info = SimpleNamespace(
        cache_mode="q8", backend="llama.cpp", device="cpu", draft_mode="model", draft_model="d.gguf",
        k_by_server=False,
    )  # fmt: skip
    started = ReplyStarted("code", True, "r", 6, 0.2, True, 10, k_mode="adaptive")
    session = SimpleNamespace(
        info=info, live=LiveStats(rounds=3, new_tokens=3), active=started, verdict=verdict
    )
    assert (
        "draft off: doesn't pay (running c 0.42, r(2) 2.00)"
        in render_status(collect_status(session, "ready")).plain
    )
    session.live = LiveStats(rounds=3, new_tokens=5, drafted=2, accepted=2)  # n-gram lookup drafted after all
    shown = render_status(collect_status(session, "ready")).plain
    assert "doesn't pay" not in shown and "accept 100%" in shown


# --- free drafts beside a draft model (issue 45: the verdict counts history drafts) ----------------------------


def test_where_the_draft_model_cannot_pay_its_free_companions_still_may():
    # A cheap verify pass and a draft step as dear as a target step: the draft model's drafts never pay, but the
    # n-gram and history drafts asked beside it are free, and the verdict says they can.
    costs = VerifyCostModel.from_ratios(CHEAP_CURVE, draft_ratio=1.0)
    verdict = draft_verdict(costs, "model", 6)
    assert verdict.status == "warn" and verdict.free == ("n-gram", "history") and verdict.free_pays
    assert verdict.short().startswith("doesn't pay (running c 1.00, r(2) 1.05")
    assert "; free n-gram and history drafts can (K 6 gives" in verdict.short()
    assert "n-gram and history drafts take no draft steps" in verdict.chat_line("draft m")
    assert "leaves drafting off" not in verdict.chat_line("draft m")
    # History drafting off: the verdict counts only the n-gram beside the draft.
    assert draft_verdict(costs, "model", 6, left_out=("history",)).free == ("n-gram",)
    # Free drafts that cannot pay either (a verify pass of 2 costs 2 steps): as before.
    slow = draft_verdict(slow_costs(), "model", 6)
    assert slow.free and not slow.free_pays and "leaves drafting off" in slow.chat_line("draft m")
    # A free drafter alone has no companions to count.
    assert draft_verdict(costs, "ngram", 6).free == ()


def test_the_session_leaves_history_out_of_the_verdict_where_history_drafting_is_off():
    costs = VerifyCostModel.from_ratios(CHEAP_CURVE, draft_ratio=1.0)
    for on, free in ((True, ("n-gram", "history")), (False, ("n-gram",))):
        backend = ScriptedBackend("one two", draft_mode="model", costs=costs)
        session = ChatSession(Settings(history_drafting=on), backend=backend)
        session.load()
        assert session.verdict.free == free
