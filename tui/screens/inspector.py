"""The statistics inspector: every MessageStats field of one reply, with acceptance drawn as bars.

Opened on a reply that is still coming in (ctrl+s pressed before its last token, the moment a short reply looks
done), it says so and fills in the moment the reply finishes; an End pressed while it waits is kept, so
"ctrl+s, End" shows the histogram either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.events import MessageStats
from tui.formatting import (
    DASH,
    bar,
    drafts_by_source,
    drafts_here,
    fmt,
    history_drafting_unavailable,
    number,
    percent,
    preset_label,
    seconds,
)
from tui.keymap import INSPECTOR_KEYS, bindings
from tui.widgets.footer import FittingFooter

K_RUNS_SHOWN = 16


def k_runs(k_per_round: list[int], limit: int = K_RUNS_SHOWN) -> str:
    """The K of each round, runs collapsed: `5×12 3×4 0×30 2 0×16`; the tail past `limit` runs as `… (+n)`."""
    runs: list[list[int]] = []
    for k in k_per_round:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    parts = [f"{k}×{n}" if n > 1 else str(k) for k, n in runs[:limit]]
    if len(runs) > limit:
        parts.append(f"… (+{len(runs) - limit} runs)")
    return " ".join(parts)


def long_match_rounds(stats: MessageStats) -> tuple[int, int]:
    """Rounds that drafted past the preset's K (long-match mode: the reply copied its context), and the most one
    drafted; (0, 0) where none did."""
    if stats.k_mode != "adaptive" or stats.k_by_server:
        return 0, 0
    past = [k for k in stats.k_per_round if k > stats.num_draft_tokens]
    return len(past), max(past, default=0)


def drafting_line(stats: MessageStats) -> str:
    if stats.k_by_server:
        return f"{stats.draft_mode}  K server (the server fixes K)"
    if stats.k_mode == "adaptive":
        line = f"{stats.draft_mode}  K adaptive, up to {stats.num_draft_tokens}"
        rounds, longest = long_match_rounds(stats)
        if rounds:
            line += (
                f"; long-match mode drafted up to {longest} in {rounds} "
                f"round{'s' if rounds != 1 else ''} (the reply copied its context)"
            )
        return line
    return f"{stats.draft_mode}  K {stats.num_draft_tokens}"


# This reply's own c: its mean draft step over its mean plain target step. The draft verdict's c is another
# figure (the backend's running estimate since load: engine/decoding/verdict.py), and says so.
COST_RATIO_LABEL = "cost ratio c (this reply)"

CAP_NOTE = re.compile(r"drafts (?:are )?capped at (\d+)")


def drafts_cap_note(backend_notes: Sequence[str]) -> str:
    """The backend's note on a cap on drafts per round (llama.cpp: the widest pass proven exact), or ""."""
    return next((note for note in backend_notes if CAP_NOTE.search(note)), "")


def verdict_row(stats: MessageStats) -> str:
    """The reply's draft verdict; where it says the draft's own drafts cannot pay, the free drafts this reply sent
    all the same (n-gram, history: drafted/accepted) are counted beside it."""
    free = drafts_by_source(stats, free_only=True) if stats.draft_verdict_status == "warn" else DASH
    return stats.draft_verdict + (f"; free drafts sent all the same: {free}" if free != DASH else "")


def stats_table(stats: MessageStats, cancelled: bool = False, backend_notes: Sequence[str] = ()) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right")
    table.add_column()
    rows = _figure_rows(stats, cancelled)
    _add_drafting_rows(rows, stats, backend_notes)
    _add_thinking_rows(rows, stats)
    # What the backend did differently in this reply and why (threads dropped, a loop stopped, drafting off).
    rows.extend(("note", note) for note in stats.notes)
    for label, value in rows:
        table.add_row(label, value)
    return table


def _figure_rows(stats: MessageStats, cancelled: bool) -> list[tuple[str, str]]:
    """The reply's figures, in the order shown, the verify costs beside c."""
    missing = stats.unavailable

    def shown(field: str, value: str) -> str:
        """A figure, or "–" and the reason where a remote server could not give it."""
        return f"{DASH}  ({missing[field]})" if field in missing else value

    rows: list[tuple[str, str]] = [
        ("preset", preset_label(stats.preset, bool(stats.router_reason))),
        ("router", stats.router_reason or "chosen by hand"),
        ("model", stats.model),
        ("backend", f"{stats.backend}  cache {stats.cache_mode or '–'}"),
        ("drafting", drafting_line(stats)),
        ("temperature", f"{stats.temperature:.2f}"),
        ("prompt tokens", f"{stats.prompt_tokens}  (cached {stats.cached_tokens})"),
        ("new tokens", str(stats.new_tokens)),
        ("drafted / accepted", shown("drafted_tokens", f"{stats.drafted_tokens} / {stats.accepted_tokens}")),
        ("  by source", drafts_by_source(stats)),
        ("verification rounds", shown("rounds", str(stats.rounds))),
        ("acceptance rate", shown("acceptance_rate", percent(stats.acceptance_rate))),
        ("mean accepted length τ", shown("mean_accepted_length", number(stats.mean_accepted_length, 2))),
        ("α (per-token acceptance)", shown("alpha", number(stats.alpha, 3))),
        (COST_RATIO_LABEL, shown("cost_ratio", number(stats.cost_ratio, 3))),
        (
            "predicted speedup",
            shown(
                "predicted_speedup",
                fmt(stats.predicted_speedup, "{:.2f}×"),
            ),
        ),
        ("time to first token", seconds(stats.ttft_s)),
        ("prefill", f"{number(stats.prefill_tokens_per_s)} tok/s"),
        ("decode", f"{number(stats.decode_tokens_per_s)} tok/s"),
        ("total", seconds(stats.total_s)),
        ("stopped by", stats.stop_reason + ("  (cancelled by you)" if cancelled else "")),
    ]
    if stats.verify_cost:
        # What a verify pass of 1 + k tokens costs in plain steps: with c, what decides whether a draft pays.
        at = rows.index((COST_RATIO_LABEL, shown("cost_ratio", number(stats.cost_ratio, 3)))) + 1
        costs = "  ".join(f"{ratio:.2f}" for ratio in stats.verify_cost)
        rows.insert(at, ("verify cost r(1+k)", f"{costs}  (k = 1..{len(stats.verify_cost)})"))
    return rows


def _add_drafting_rows(
    rows: list[tuple[str, str]], stats: MessageStats, backend_notes: Sequence[str]
) -> None:
    """Under "drafting": the draft verdict, history drafting's absence, the drafts' cap and K per round."""
    at = rows.index(("drafting", drafting_line(stats))) + 1
    if stats.draft_verdict:
        # Whether drafting can pay on this machine at all, as the reply ended (the doctor's verdict).
        rows.insert(at, ("draft verdict", verdict_row(stats)))
        at += 1
    unavailable = history_drafting_unavailable(stats.backend)
    if unavailable:
        rows.insert(at, ("history drafting", unavailable))
        at += 1
    cap = drafts_cap_note(backend_notes) if drafts_here(stats.draft_mode) else ""
    if cap:
        rows.insert(at, ("drafts cap", cap))
        at += 1
    if stats.k_per_round:
        rows.insert(at, ("K per round", k_runs(stats.k_per_round)))


def _add_thinking_rows(rows: list[tuple[str, str]], stats: MessageStats) -> None:
    """Under "new tokens", where the reply reasoned: its thinking tokens and the acceptance of each part."""
    if stats.thinking_tokens:
        at = rows.index(("new tokens", str(stats.new_tokens))) + 1
        rows[at:at] = [
            ("thinking tokens", str(stats.thinking_tokens)),
            ("acceptance thinking / answer", f"{percent(stats.thinking_acceptance_rate)} / "
             f"{percent(stats.answer_acceptance_rate)}"),
        ]  # fmt: skip


def position_bars(stats: MessageStats) -> Text:
    text = Text()
    if "per_position_acceptance" in stats.unavailable:
        return Text(f"{DASH}  ({stats.unavailable['per_position_acceptance']})", style="dim")
    if not stats.per_position_acceptance:
        return Text("no drafted positions", style="dim")
    for index, rate in enumerate(stats.per_position_acceptance, start=1):
        text.append(f"pos {index:>2} ", style="dim")
        text.append(bar(rate, 24), style="green")
        text.append(f" {rate * 100:5.1f}%\n")
    text.rstrip()
    return text


def histogram_bars(stats: MessageStats) -> Text:
    counts = stats.acceptance_histogram
    if "acceptance_histogram" in stats.unavailable:
        return Text(f"{DASH}  ({stats.unavailable['acceptance_histogram']})", style="dim")
    if not counts or not sum(counts):
        return Text("no drafting rounds", style="dim")
    top = max(counts)
    text = Text()
    for accepted, count in enumerate(counts):
        text.append(f"{accepted:>2} accepted ", style="dim")
        text.append(bar(count / top, 24), style="cyan")
        text.append(f" {count}\n")
    text.rstrip()
    return text


def recent_comparison(stats: MessageStats, recent, includes_this: bool = True) -> Table | Text:
    """This reply beside the preset's recent average (a metrics `Summary` of its last logged replies).
    `includes_this`: the newest reply is logged when it ends, so the average counts it (and says so)."""
    if recent is None or recent.replies < (2 if includes_this else 1):
        # One reply would be compared with itself.
        return Text(f"no earlier {stats.preset} replies to compare with yet", style="dim")
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column("", style="dim", justify="right")
    table.add_column("this reply", justify="right")
    label = f"last {recent.replies} {stats.preset}" + (" (with this)" if includes_this else "")
    table.add_column(label, justify="right")
    table.add_row("acceptance", percent(stats.acceptance_rate), percent(recent.acceptance))
    table.add_row("τ", number(stats.mean_accepted_length, 2), number(recent.tau, 2))
    table.add_row("tok/s", number(stats.decode_tokens_per_s), number(recent.tokens_per_s))
    table.add_row(
        "time to first token",
        seconds(stats.ttft_s),
        seconds(recent.ttft_s),
    )
    return table


def context_line(session: Any) -> str:
    """What the model sees of the chat now: 'context: the model sees the last 4 of 10 turns · 812/4096 tokens'."""
    total, seen = len(session.turns), len(session.context_turns)
    which = f"all {total} turns" if seen == total else f"the last {seen} of {total} turns"
    return f"context: the model sees {which} · {session.context_used}/{session.max_context} tokens"


WAITING = "this reply is still coming in: its statistics appear here when it finishes"
NO_STATS = "this reply ended without statistics (it failed or was stopped before its first token)"
POLL_S = 0.1
SETTLE_POLLS = 30  # a reply that stopped streaming gets 3 s to show its stats before "no statistics"


class InspectorScreen(ModalScreen[None]):
    BINDINGS = bindings(INSPECTOR_KEYS)

    def __init__(
        self,
        stats: MessageStats | None = None,
        cancelled: bool = False,
        recent=None,
        *,
        pending: Any = None,
        recent_for: Callable[[str], Any] | None = None,
        context: str = "",
        backend_notes: Sequence[str] = (),
        includes_this: bool = True,
    ) -> None:
        """`stats` of a finished reply; or `pending`, a reply widget still streaming (its `stats`, `cancelled`,
        `failed` and `streaming` are read until it ends) and `recent_for(preset)` for the recent average."""
        super().__init__()
        self.stats = stats
        self.cancelled = cancelled
        self.recent = recent  # the preset's recent average from the metrics log, when the session saves
        self.pending = pending if stats is None else None
        self.recent_for = recent_for
        self.context = context  # what the model sees of this chat now ("the model sees 6 of 10 turns ...")
        self.backend_notes = tuple(backend_notes)  # the loaded backend's notes (a cap on drafts per round)
        self.includes_this = includes_this  # the recent average counts this reply (the newest one)
        self._end_wanted = False
        self._settling = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="inspector", classes="dialog"):
            yield Static(Text("Reply statistics", style="bold"), classes="title")
            if self.context:
                yield Static(Text(self.context, style="dim"), id="inspector-context")
            if self.stats is None:
                waiting = WAITING if self.pending is not None else NO_STATS
                yield Static(Text(waiting, style="dim"), id="inspector-waiting")
            else:
                with VerticalScroll():
                    yield from self._sections(self.stats)
            yield Static("esc close · ↑↓ pgup pgdn home end scroll", classes="hint")
        yield FittingFooter()

    def _sections(self, stats: MessageStats) -> Iterator[Static]:
        yield Static(stats_table(stats, self.cancelled, self.backend_notes), id="inspector-fields")
        if self.recent is not None:
            comparison = recent_comparison(stats, self.recent, self.includes_this)
            yield Static(
                Group(Text("\nbeside recent replies", style="bold"), comparison),
                id="inspector-recent",
            )
        yield Static(
            Group(Text("\nper-position acceptance", style="bold"), position_bars(stats)),
            id="inspector-positions",
        )
        yield Static(
            Group(Text("\naccepted drafts per round", style="bold"), histogram_bars(stats)),
            id="inspector-histogram",
        )

    def on_mount(self) -> None:
        if self.pending is not None:
            self._poll = self.set_interval(POLL_S, self._check_pending)

    def _check_pending(self) -> None:
        reply = self.pending
        if reply is None:
            return
        if reply.stats is None and reply.streaming and reply.is_attached:
            return  # still coming in (a reply stopped before its first token is taken off the chat)
        if reply.stats is None and not reply.failed and reply.is_attached and self._settling < SETTLE_POLLS:
            self._settling += 1  # between its last token and its stats (the widget renders the text first)
            return
        self._poll.stop()
        self.pending = None
        if reply.stats is None:
            self.query_one("#inspector-waiting", Static).update(Text(NO_STATS, style="dim"))
            return
        self.stats, self.cancelled = reply.stats, reply.cancelled
        if self.recent_for is not None:
            self.recent = self.recent_for(reply.stats.preset)
        # Swap the waiting line for the figures. Not awaited: this runs in the screen's own timer, and awaiting
        # a mount from there waits on the very queue that is busy running it.
        self.query_one("#inspector-waiting").remove()
        scroller = VerticalScroll(*self._sections(reply.stats))
        self.query_one("#inspector").mount(scroller, before=self.query_one("#inspector .hint"))
        self.call_after_refresh(self._show_figures, scroller)

    def _show_figures(self, scroller: VerticalScroll) -> None:
        scroller.focus()
        if self._end_wanted:
            # Anchored: it stays at the end while its layout settles, and lets go at the first scroll key.
            scroller.anchor()

    def action_remember_end(self) -> None:
        self._end_wanted = True
        scrollers = self.query(VerticalScroll)
        if scrollers:  # the figures are there, the focus elsewhere: scroll them all the same
            scrollers.first().scroll_end(animate=False)
