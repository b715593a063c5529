"""The statistics inspector: every MessageStats field of one reply, with acceptance drawn as bars."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.events import MessageStats
from tui.formatting import bar, number, percent, preset_label, seconds
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


def drafting_line(stats: MessageStats) -> str:
    if stats.k_by_server:
        return f"{stats.draft_mode}  K server (the server fixes K)"
    if stats.k_mode == "adaptive":
        return f"{stats.draft_mode}  K adaptive, up to {stats.num_draft_tokens}"
    return f"{stats.draft_mode}  K {stats.num_draft_tokens}"


def stats_table(stats: MessageStats, cancelled: bool = False) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right")
    table.add_column()
    missing = stats.unavailable

    def shown(field: str, value: str) -> str:
        """A figure, or "—" and the reason where a remote server could not give it."""
        return f"—  ({missing[field]})" if field in missing else value

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
        ("verification rounds", shown("rounds", str(stats.rounds))),
        ("acceptance rate", shown("acceptance_rate", percent(stats.acceptance_rate))),
        ("mean accepted length τ", shown("mean_accepted_length", number(stats.mean_accepted_length, 2))),
        ("α (per-token acceptance)", shown("alpha", number(stats.alpha, 3))),
        ("cost ratio c", shown("cost_ratio", number(stats.cost_ratio, 3))),
        (
            "predicted speedup",
            shown(
                "predicted_speedup",
                "–" if stats.predicted_speedup is None else f"{stats.predicted_speedup:.2f}×",
            ),
        ),
        ("time to first token", seconds(stats.ttft_s)),
        ("prefill", f"{number(stats.prefill_tokens_per_s)} tok/s"),
        ("decode", f"{number(stats.decode_tokens_per_s)} tok/s"),
        ("total", seconds(stats.total_s)),
        ("stopped by", stats.stop_reason + ("  (cancelled by you)" if cancelled else "")),
    ]
    if stats.k_per_round:
        at = rows.index(("drafting", drafting_line(stats))) + 1
        rows.insert(at, ("K per round", k_runs(stats.k_per_round)))
    if stats.thinking_tokens:
        at = rows.index(("new tokens", str(stats.new_tokens))) + 1
        rows[at:at] = [
            ("thinking tokens", str(stats.thinking_tokens)),
            ("acceptance thinking / answer", f"{percent(stats.thinking_acceptance_rate)} / "
             f"{percent(stats.answer_acceptance_rate)}"),
        ]  # fmt: skip
    for label, value in rows:
        table.add_row(label, value)
    return table


def position_bars(stats: MessageStats) -> Text:
    text = Text()
    if "per_position_acceptance" in stats.unavailable:
        return Text(f"—  ({stats.unavailable['per_position_acceptance']})", style="dim")
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
        return Text(f"—  ({stats.unavailable['acceptance_histogram']})", style="dim")
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


def recent_comparison(stats: MessageStats, recent) -> Table | Text:
    """This reply beside the preset's recent average (a metrics `Summary` of its last logged replies)."""
    if recent is None or not recent.replies:
        return Text(f"no logged {stats.preset} replies to compare with yet", style="dim")
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column("", style="dim", justify="right")
    table.add_column("this reply", justify="right")
    table.add_column(f"{stats.preset} recent average ({recent.replies} replies)", justify="right")
    table.add_row("acceptance", percent(stats.acceptance_rate), percent(recent.acceptance))
    table.add_row("τ", number(stats.mean_accepted_length, 2), number(recent.tau, 2))
    table.add_row("tok/s", number(stats.decode_tokens_per_s), number(recent.tokens_per_s))
    table.add_row(
        "time to first token",
        seconds(stats.ttft_s),
        "–" if recent.ttft_s is None else seconds(recent.ttft_s),
    )
    return table


class InspectorScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,i", "dismiss", "close", id="inspector.close"),
    ]

    def __init__(self, stats: MessageStats, cancelled: bool = False, recent=None) -> None:
        super().__init__()
        self.stats = stats
        self.cancelled = cancelled
        self.recent = recent  # the preset's recent average from the metrics log, when the session saves

    def compose(self) -> ComposeResult:
        with Vertical(id="inspector", classes="dialog"):
            yield Static(Text("Reply statistics", style="bold"), classes="title")
            with VerticalScroll():
                yield Static(stats_table(self.stats, self.cancelled), id="inspector-fields")
                if self.recent is not None:
                    yield Static(
                        Group(
                            Text("\nbeside recent replies", style="bold"),
                            recent_comparison(self.stats, self.recent),
                        ),
                        id="inspector-recent",
                    )
                yield Static(
                    Group(Text("\nper-position acceptance", style="bold"), position_bars(self.stats)),
                    id="inspector-positions",
                )
                yield Static(
                    Group(Text("\naccepted drafts per round", style="bold"), histogram_bars(self.stats)),
                    id="inspector-histogram",
                )
            yield Static("esc close · ↑↓ pgup pgdn home end scroll", classes="hint")
        yield FittingFooter()
