"""Pure parts of the TUI: origin splitting, buffering, formatting, keymap checks, the status bar and the inspector."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.events import Chunk, Done, MessageStats
from engine.origins import merge_runs, split_chunk_by_origin
from tests.support.tui import wide_figures
from tui.formatting import bar, percent, sparkline, stats_line
from tui.keymap import check_keymap, key_for
from tui.streaming import (
    CONTENDED_UI_BUDGET,
    RENDER_INTERVAL_S,
    UI_BUDGET,
    RenderPace,
    ReplyBuffer,
    contended,
    model_threads,
    ui_budget,
)
from tui.widgets.message import last_code_block
from tui.widgets.status_bar import StatusFigures, render_status


def chunk(text, ids, origins, drafted=4):
    return Chunk(text, tuple(ids), drafted, sum(origins), tuple(origins), t=0.0)


def test_split_uses_the_decoded_target_token():
    pieces = {1: " the", 2: " cat", 3: " sat"}
    c = chunk(" the cat sat", [1, 2, 3], [True, True, False])
    runs = split_chunk_by_origin(c, lambda ids: "".join(pieces[i] for i in ids))
    assert runs == [(" the cat", True), (" sat", False)]


def test_split_falls_back_to_token_proportion():
    c = chunk("abcdef", [1, 2, 3], [True, True, False])
    assert split_chunk_by_origin(c, lambda ids: "zz") == [("abcd", True), ("ef", False)]
    assert split_chunk_by_origin(chunk("xy", [5], [False])) == [("xy", False)]


def test_buffer_posts_at_most_every_interval_and_take_drains_all():
    buffer = ReplyBuffer(interval_s=10.0)
    assert buffer.add(chunk("a", [1], [False])) is True
    assert buffer.add(chunk("b", [2], [True])) is False
    assert buffer.has_pending
    assert buffer.take() == [("a", False), ("b", True)]
    assert buffer.take() == [] and not buffer.has_pending


def test_where_the_first_chunk_waits_it_is_posted_an_interval_later_like_every_other():
    buffer = ReplyBuffer(interval_s=10.0, first_waits=True)
    assert buffer.add(chunk("a", [1], [False])) is False  # not at once: the model has every core
    assert buffer.has_pending and not buffer.overdue
    buffer.interval_s = 0.0
    assert buffer.add(chunk("b", [2], [False])) is True
    assert buffer.take() == [("a", False), ("b", False)]


def test_a_stalled_buffer_is_overdue_only_after_an_interval():
    buffer = ReplyBuffer(interval_s=10.0)
    buffer.add(chunk("a", [1], [False]))  # posted at once (the first chunk)
    buffer.add(chunk("b", [2], [False]))  # not posted: within the interval
    assert buffer.has_pending and not buffer.overdue  # the UI's timer must not redraw at its own rate
    buffer.interval_s = 0.0
    assert buffer.overdue
    buffer.take()
    assert not buffer.overdue


def test_render_pace_stretches_over_the_ui_budget_and_comes_back():
    pace = RenderPace(budget=0.15, ceiling=1.0)
    assert pace.observe(cpu=0.0, wall=0.0) == RENDER_INTERVAL_S  # nothing measured yet
    # 0.3 of a core over the last 0.1 s: twice the budget, so redraws half as often.
    assert pace.observe(cpu=0.03, wall=0.1) == pytest.approx(2 * RENDER_INTERVAL_S)
    # Far over (a whole core): capped at the ceiling, never slower than that.
    assert pace.observe(cpu=0.23, wall=0.3) == 1.0
    # Well under the budget: back towards the eye's rate step by step, never faster than it.
    interval = 1.0
    for step in range(1, 30):
        interval = pace.observe(cpu=0.23 + 0.001 * step, wall=0.3 + step)
    assert interval == RENDER_INTERVAL_S
    # Between half the budget and the budget: left as it is.
    pace.interval = 0.4
    assert pace.observe(cpu=0.23 + 0.029 + 0.1, wall=30.0) == 0.4


def test_merge_runs_joins_neighbours():
    runs = [("a", True)]
    merge_runs(runs, [("b", True), ("c", False), ("", True), ("d", False)])
    assert runs == [("ab", True), ("cd", False)]


def test_sparkline_bar_percent():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert len(sparkline([0.5] * 40, width=16)) == 16
    assert bar(0.5, 10) == "█████░░░░░"
    assert percent(0.734) == "73%" and percent(None) == "–"


def make_stats(**changes):
    base = dict(
        prompt_tokens=20, new_tokens=100, drafted_tokens=80, accepted_tokens=60, rounds=30,
        acceptance_rate=0.75, mean_accepted_length=3.33, per_position_acceptance=[0.9, 0.7],
        acceptance_histogram=[2, 3, 25], alpha=0.8, predicted_speedup=2.1, ttft_s=0.1,
        prefill_tokens_per_s=500.0, decode_tokens_per_s=42.0, total_s=2.5, preset="code",
        num_draft_tokens=4, temperature=0.2, draft_mode="ngram", backend="hf", model="m",
        stop_reason="eos", router_reason="has code",
    )  # fmt: skip
    base.update(changes)
    return MessageStats(**base)


def test_stats_line_shows_preset_choice_and_draft_off():
    assert (
        stats_line(make_stats())
        == "100 tok · 42.0 tok/s · ttft 100 ms · accept 75% · τ 3.33 · K 4 · T 0.20 · auto → code"
    )
    off = make_stats(
        draft_mode="none", drafted_tokens=0, accepted_tokens=0, acceptance_rate=None, router_reason=""
    )
    assert (
        stats_line(off, cancelled=True)
        == "100 tok · 42.0 tok/s · ttft 100 ms · draft off · T 0.20 · code · cancelled"
    )
    backed_off = make_stats(drafted_tokens=0, accepted_tokens=0, acceptance_rate=None, router_reason="")
    # Nothing drafted says why: the machine's verdict where drafting cannot pay, else the measured acceptance.
    assert (
        stats_line(backed_off)
        == "100 tok · 42.0 tok/s · ttft 100 ms · no drafts (no match paid) · K 4 · T 0.20 · code"
    )
    cannot_pay = make_stats(
        drafted_tokens=0,
        accepted_tokens=0,
        acceptance_rate=None,
        router_reason="",
        draft_verdict_status="warn",
    )
    assert (
        stats_line(cannot_pay)
        == "100 tok · 42.0 tok/s · ttft 100 ms · no drafts (draft off: doesn't pay) · K 4 · T 0.20 · code"
    )


def test_render_status_idle_and_draft_off():
    fig = StatusFigures(
        state="idle", preset="auto → code", k=4, temperature=0.2, acceptance=0.5, measured_drafting=True,
        spark=(0.0, 1.0), tau=2.5, tokens_per_s=30.0, context_used=100, max_context=2048, cache_mode="q8",
        backend="transformers", device="cpu",
    )  # fmt: skip
    assert render_status(fig).plain == (
        "○ auto → code │ K 4 │ T 0.20 │ accept 50% ▁█ │ τ 2.50 │ 30.0 tok/s │ ctx 100/2048 │ kv q8 │ transformers·cpu"
    )
    off = StatusFigures(
        state="idle", preset="plain", k=4, drafting=False, temperature=0.3, measured_drafting=False
    )
    assert "K off" in render_status(off).plain and "draft off" in render_status(off).plain


def test_last_code_block():
    assert last_code_block("x\n```py\na = 1\n```\ny\n```\nb = 2\n```") == "b = 2"
    assert last_code_block("```sh\nls -l") == "ls -l"  # a fence cut off by cancel still counts
    assert last_code_block("no code") is None


def test_keymap_check_and_lookup():
    assert check_keymap({"preset.code": "f9"}) == []
    assert [p.message for p in check_keymap({"preset.cod": "f9"})] == [
        "keymap: unknown binding id 'preset.cod' (did you mean 'preset.code'?)"
    ]
    assert key_for("preset.code", {}) == "f2" and key_for("preset.code", {"preset.code": "f9"}) == "f9"


def test_status_bar_drops_whole_fields_by_priority():
    fig = wide_figures()
    full = render_status(fig).plain
    assert full == (
        "○ auto → creative │ K 3 │ T 0.90 │ accept 45% ▅█ │ τ 2.10 │ 12.3 tok/s │ ttft 410 ms │ ctx 1234/4096 │ kv q8"
        " │ transformers·cpu"
    )
    assert render_status(fig, width=len(full)).plain == full
    assert render_status(fig, width=len(full) - 1).plain == full[: full.index(" │ transformers")]
    at_78 = render_status(fig, width=78).plain
    assert at_78 == "○ auto → creative │ K 3 │ T 0.90 │ accept 45% │ 12.3 tok/s │ ctx 1234/4096"
    narrow = render_status(fig, width=44).plain
    assert narrow == "○ auto → creative │ accept 45% │ 12.3 tok/s"
    for width in range(30, len(full) + 1):
        text = render_status(fig, width=width).plain
        assert len(text) <= width and "…" not in text


def test_draft_spans_follow_the_source_through_markdown():
    from tui.widgets.message import DRAFT_STYLE, HISTORY_STYLE, align_to_source, draft_spans, drafted_mask

    source = "Some **bold** text"
    rendered = "Some bold text"
    assert align_to_source(rendered, source) == [0, 1, 2, 3, 4, 7, 8, 9, 10, 13, 14, 15, 16, 17]
    mask = [""] * 5 + [DRAFT_STYLE] * 8 + [""] * 5  # "**bold**" came from the draft
    spans = draft_spans(rendered, source, mask, 0)
    assert [(s.start, s.end) for s in spans] == [(5, 9)]
    # Offsets: the block's source starts 3 characters into the reply.
    assert [(s.start, s.end) for s in draft_spans("ab", "ab", ["", "", "", DRAFT_STYLE, ""], 3)] == [(0, 1)]
    # A history draft's text right after another draft's: two spans, each in its own colour.
    mask = drafted_mask([("Some ", False), ("**bo", "ngram"), ("ld** text", "history")])
    spans = draft_spans(rendered, source, mask, 0)
    assert [(s.start, s.end, str(s.style)) for s in spans] == [(5, 7, DRAFT_STYLE), (7, 14, HISTORY_STYLE)]


def test_keymap_errors_name_the_bindings():
    problems = check_keymap({"preset.qa": "ctrl+q", "preset.code": "banana key"})
    errors = [p.message for p in problems if p.severity == "error"]
    assert any("preset.qa" in m and "app.quit" in m and "ctrl+q" in m for m in errors)
    assert any("preset.code" in m and "'banana key'" in m for m in errors)
    assert [p.severity for p in check_keymap({"reply.cancel": "ctrl+g"})] == []
    assert any("ctrl+p" in p.message for p in check_keymap({"chat.new": "ctrl+p"}))


def test_key_display_reads_like_keys():
    from tui.keymap import key_display

    assert key_display("question_mark") == "?"
    assert key_display("i,enter") == "i / enter"
    assert key_display("ctrl+r") == "ctrl+r"


def test_status_bar_shows_where_adaptive_k_moved():
    fig = wide_figures(k=5, k_now=3)
    assert "K 5→3" in render_status(fig).plain
    assert "K 5 │" in render_status(wide_figures(k=5, k_now=5)).plain
    assert "K off" in render_status(wide_figures(k=5, k_now=3, drafting=False)).plain


def test_live_k_is_the_median_of_the_recent_rounds_and_the_stats_keep_every_round():
    from engine.decoding.acceptance import AcceptanceAccounting
    from engine.events import Chunk

    accounting = AcceptanceAccounting(t_start=0.0)
    for i, k in enumerate([5, 5, 4, 3, 3, 3, 0, 3, 3, 2]):
        accounting.add(Chunk("x", (1,), drafted=k, accepted=0, origins=(False,), t=float(i), k=k))
    assert accounting.live.k_now == 3
    stats = accounting.finish(
        Done("eos", prompt_tokens=3), 11.0, preset="qa", num_draft_tokens=5, temperature=0.0,
        draft_mode="ngram", backend="b", model="m", k_mode="adaptive",
    )  # fmt: skip
    assert stats.k_per_round == [5, 5, 4, 3, 3, 3, 0, 3, 3, 2] and stats.k_mode == "adaptive"


def test_inspector_lists_k_per_round_in_runs():
    from tui.screens.inspector import k_runs, stats_table

    assert k_runs([5, 5, 3, 3, 3, 0, 2]) == "5×2 3×3 0 2"
    assert k_runs([1, 2, 3, 4], limit=2) == "1 2 … (+2 runs)"
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(stats_table(make_stats(k_mode="adaptive", k_per_round=[4, 4, 2, 0, 0])))
    text = console.export_text()
    assert "K adaptive, up to 4" in text and "K per round" in text and "4×2 2 0×2" in text
    console = Console(width=120, record=True)
    console.print(stats_table(make_stats()))
    assert "K per round" not in console.export_text()


def test_the_live_k_shows_while_an_adaptive_reply_runs_and_the_ceiling_between_replies():
    from types import SimpleNamespace

    from engine.events import LiveStats, ReplyStarted
    from tui.widgets.status_bar import collect_status

    def session(active, preset_k=5):
        preset = SimpleNamespace(k=preset_k, temperature=0.5, drafting=True)
        return SimpleNamespace(
            info=None, live=LiveStats(k_now=3), active=active, last_stats=None, mode="qa",
            presets={"qa": preset}, effective_preset=lambda name: preset,
        )  # fmt: skip

    def started(mode):
        return ReplyStarted("qa", False, "", 5, 0.5, True, 10, k_mode=mode)

    assert "K 5→3" in render_status(collect_status(session(started("adaptive")), "streaming")).plain
    assert "K 5 │" in render_status(collect_status(session(started("fixed")), "streaming")).plain
    assert "K 5 │" in render_status(collect_status(session(None), "idle")).plain


def test_the_inspector_lists_the_backends_notes_on_the_reply():
    from rich.console import Console

    from tui.screens.inspector import stats_table

    note = "dropped to 1 thread: verify passes ran 9x slower than measured at load"
    console = Console(width=160, record=True)
    console.print(stats_table(make_stats(notes=[note])))
    assert note in console.export_text()
    console = Console(width=160, record=True)
    console.print(stats_table(make_stats()))
    assert "note" not in console.export_text().split("stopped by")[-1]


def test_the_doesnt_pay_verdict_shows_only_where_adaptive_k_leaves_drafting_off():
    # A fixed-K preset drafts whether or not it pays: the bar names the draft, not "draft off" (the pair's tmux
    # check with a fixed K 4 saw "draft off: doesn't pay" push the draft's name out of the bar).
    from types import SimpleNamespace

    from engine.events import LiveStats, ReplyStarted
    from tui.widgets.status_bar import collect_status

    verdict = SimpleNamespace(status_text=lambda: "draft off: doesn't pay (running c 0.42, r(2) 2.00)")

    def session(k_mode, active=None):
        preset = SimpleNamespace(k=4, temperature=0.5, drafting=True, k_mode=k_mode)
        return SimpleNamespace(
            info=None, live=LiveStats(), active=active, last_stats=None, mode="code", verdict=verdict,
            presets={"code": preset}, effective_preset=lambda name: preset,
        )  # fmt: skip

    def started(k_mode):
        return ReplyStarted("code", False, "", 4, 0.5, True, 10, k_mode=k_mode)

    assert "doesn't pay" in render_status(collect_status(session("adaptive"), "idle")).plain
    assert "doesn't pay" not in render_status(collect_status(session("fixed"), "idle")).plain
    streaming = collect_status(session("adaptive", started("adaptive")), "streaming")
    assert "doesn't pay" in render_status(streaming).plain
    streaming = collect_status(session("fixed", started("fixed")), "streaming")
    assert "doesn't pay" not in render_status(streaming).plain


def test_the_ui_budget_halves_where_the_model_takes_every_core():
    assert contended(2, cores=2) and contended(4, cores=2)
    assert not contended(2, cores=4) and not contended(None, cores=1)
    assert ui_budget(2, cores=2) == CONTENDED_UI_BUDGET < UI_BUDGET
    assert ui_budget(4, cores=2) == CONTENDED_UI_BUDGET
    assert ui_budget(2, cores=4) == UI_BUDGET  # a core left over for the UI
    # A GPU or a server: the model's threads are not ours to count.
    assert ui_budget(None, cores=1) == UI_BUDGET
    assert model_threads(SimpleNamespace(threads=3)) == 3
    assert model_threads(SimpleNamespace(threads=None)) is None and model_threads(object()) is None
