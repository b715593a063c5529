"""The status bar: what the next reply will use and how the current (or last) one is going.

A 0.1 s timer calls `refresh_from(session)`: it reads plain attributes (`session.live`, `session.active`,
`session.last_stats`, `session.info`), so the bar repaints at most 10 times a second no matter how fast tokens
arrive, and only when the text actually changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import Static

from tui.formatting import draft_label, fmt, number, percent, preset_label, seconds, sparkline


@dataclass(frozen=True, slots=True)
class StatusFigures:
    state: str  # "loading", "failed", "idle", "streaming"
    message: str = ""  # loading stage / failure text
    preset: str = ""
    k: int | None = None
    k_now: int | None = None  # adaptive K's current draft length, where it moved away from k
    drafting: bool = True
    k_by_server: bool = False  # a remote server fixes K: "K server"
    temperature: float | None = None
    acceptance: float | None = None
    measured_drafting: bool | None = None  # None: no reply yet
    spark: tuple[float, ...] = field(default_factory=tuple)
    tau: float | None = None
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    context_used: int = 0
    max_context: int = 0
    cache_mode: str = ""
    backend: str = ""
    device: str = ""
    warning: str = ""  # a regression found in the metrics log (click the bar for the trend)
    unsaved: bool = False  # the history went to memory (full disk, unwritable folder): shown while it lasts
    draft_model: str = ""  # the draft model, where one drafts (n-gram and none show nothing here)
    # `draft off: doesn't pay (running c 0.42, r(2) 2.00)`: the machine's verdict, while it keeps drafting off
    verdict: str = ""


def collect_status(session: Any, state: str, message: str = "") -> StatusFigures:
    """Read the session's plain attributes into a snapshot (UI thread; the engine thread only writes them)."""
    if state in ("loading", "failed") or session is None:
        return StatusFigures(state=state, message=message)
    info = session.info
    base: dict[str, Any] = {
        "warning": regression_warning(getattr(session, "regressions", ())),
        "unsaved": bool(getattr(session, "memory_only", False)),
        "context_used": int(getattr(session, "context_used", 0) or 0),
        "max_context": int(getattr(session, "max_context", 0) or 0),
        "cache_mode": info.cache_mode if info else "",
        "backend": info.backend if info else "",
        "device": info.device if info else "",
        "draft_model": draft_label(info.draft_model) if info and info.draft_mode == "model" else "",
    }
    by_server = bool(getattr(info, "k_by_server", False))
    verdict = getattr(session, "verdict", None)
    off_text = verdict.status_text() if verdict is not None else ""
    if by_server:
        base["k_by_server"] = True
    if session.active is not None:
        return _streaming_status(session, base, off_text, by_server)
    return _idle_status(session, base, off_text, by_server)


def _streaming_status(session: Any, base: dict[str, Any], off_text: str, by_server: bool) -> StatusFigures:
    """While a reply runs: its preset and K, and the live figures."""
    live, active = session.live, session.active
    drafting_now = active.drafting and (active.num_draft_tokens > 0 or by_server)
    return StatusFigures(
        state="streaming",
        preset=preset_label(active.preset, active.auto),
        k=active.num_draft_tokens,
        k_now=live.k_now if active.k_mode == "adaptive" else None,
        drafting=drafting_now,
        temperature=live.temperature if live.new_tokens else active.temperature,
        acceptance=live.acceptance_rate,
        measured_drafting=drafting_now,
        spark=tuple(live.recent_round_acceptance),
        tau=live.mean_accepted_length,
        tokens_per_s=live.tokens_per_s,
        ttft_s=live.ttft_s,
        # Only adaptive K leaves drafting off where it does not pay; a fixed K drafts anyway.
        verdict=off_text if drafting_now and not live.drafted and active.k_mode == "adaptive" else "",
        **base,
    )


@dataclass(frozen=True, slots=True)
class NextReply:
    """Between replies: the settings the next reply will use (None: the preset's own, not known yet)."""

    preset: str
    k: int | None = None
    temperature: float | None = None
    drafting: bool = True
    adaptive: bool = True


def _next_reply_settings(session: Any) -> NextReply:
    """The preset, K, temperature, drafting and adaptive K of the next reply."""
    mode = session.mode
    if mode == "auto":
        # The router picks per message: nothing is chosen until one is sent (the last reply's choice is history).
        # This chat's settings (F12) still show: they apply to whichever preset the router picks.
        overrides = getattr(session, "overrides", {})
        drafting = bool(overrides.get("drafting", True)) and overrides.get("k") != 0
        return NextReply("auto", overrides.get("k"), overrides.get("temperature"), drafting)
    chosen = session.effective_preset(mode) if mode in session.presets else None
    if chosen is None:
        return NextReply(mode)
    adaptive = getattr(chosen, "k_mode", "adaptive") == "adaptive"
    return NextReply(mode, chosen.k, chosen.temperature, bool(chosen.drafting and chosen.k > 0), adaptive)


def _idle_status(session: Any, base: dict[str, Any], off_text: str, by_server: bool) -> StatusFigures:
    """Between replies: the settings the next reply will use, the figures of the last one."""
    info, last, live = session.info, session.last_stats, session.live
    following = _next_reply_settings(session)
    drafting = following.drafting
    if info is not None and info.draft_mode == "none":
        drafting = False  # the loaded model runs without a drafter (draft "none"): no preset's K applies
    measured = None
    if last is not None:
        # Drafting on but nothing drafted (n-gram back-off) shows "accept –", not "draft off".
        measured = last.draft_mode != "none" and (last.num_draft_tokens > 0 or last.k_by_server)
    if by_server and info is not None:
        drafting = info.draft_mode != "none"
    return StatusFigures(
        state="idle",
        preset=following.preset,
        k=following.k,  # the next reply's ceiling: adaptive K's moves show while a reply runs
        drafting=drafting,
        temperature=following.temperature,
        acceptance=last.acceptance_rate if last is not None else None,
        measured_drafting=measured,
        spark=tuple(live.recent_round_acceptance) if last is not None else (),
        tau=last.mean_accepted_length if last is not None else None,
        tokens_per_s=last.decode_tokens_per_s if last is not None else None,
        ttft_s=last.ttft_s if last is not None else None,
        # Said until a reply drafts after all (n-gram lookup beside the draft model, a probe).
        verdict=off_text
        if drafting and following.adaptive and (last is None or not last.drafted_tokens)
        else "",
        **base,
    )


def regression_warning(regressions: Any) -> str:
    """`acceptance −12 pts (qa)`: the first regression, and how many more."""
    if not regressions:
        return ""
    first = regressions[0]
    if first.what == "acceptance":
        drop = f"acceptance −{(first.baseline - first.recent) * 100:.0f} pts"
    else:
        drop = f"tok/s −{(1 - first.recent / first.baseline) * 100:.0f}%"
    more = f" +{len(regressions) - 1}" if len(regressions) > 1 else ""
    return f"{drop} ({first.preset}){more}"


# Fields in the order shown, each with its priority: when the bar is too narrow the lowest priority goes first
# (backend, then cache mode, ...), whole fields at a time; the preset, acceptance and tok/s stay to the last.
PRIORITY = {
    "backend": 1,
    "kv": 2,
    "spark": 3,
    "ttft": 4,
    "tau": 5,
    "temperature": 6,
    "k": 7,
    "ctx": 8,
    "warning": 9,
    "draft": 9,
    "accept": 10,
    "speed": 11,
    "unsaved": 12,  # the last to go: a chat that is not being saved must say so
}


def status_fields(fig: StatusFigures) -> list[tuple[str, list[Any]]]:
    """(name, Text.assemble parts) per field of a ready bar, in display order."""
    fields: list[tuple[str, list[Any]]] = []
    if fig.unsaved:
        fields.append(("unsaved", [("⚠ not saved (memory only)", "bold red")]))
    k_text = "off" if not fig.drafting else "server" if fig.k_by_server else fmt(fig.k, "{}")
    if (
        fig.drafting
        and not fig.k_by_server
        and fig.k is not None
        and fig.k_now is not None
        and fig.k_now != fig.k
    ):
        k_text = f"{fig.k}→{fig.k_now}"  # adaptive K moved away from the preset's ceiling
    fields.append(("k", [("K ", "dim"), k_text]))
    if fig.draft_model:
        fields.append(("draft", [("draft ", "dim"), fig.draft_model]))
    fields.append(("temperature", [("T ", "dim"), number(fig.temperature, 2)]))
    if fig.measured_drafting is False:
        fields.append(("accept", [("draft off", "dim")]))
    elif fig.verdict:
        fields.append(("accept", [(fig.verdict, "yellow")]))
    else:
        fields.append(("accept", [("accept ", "dim"), (percent(fig.acceptance), "bold")]))
        if fig.spark:
            fields.append(("spark", [(sparkline(fig.spark), "green")]))
        fields.append(("tau", [("τ ", "dim"), number(fig.tau, 2)]))
    fields.append(("speed", [number(fig.tokens_per_s), (" tok/s", "dim")]))
    if fig.ttft_s is not None:
        fields.append(("ttft", [("ttft ", "dim"), seconds(fig.ttft_s)]))
    if fig.max_context:
        fields.append(("ctx", [("ctx ", "dim"), f"{fig.context_used}/{fig.max_context}"]))
    if fig.cache_mode:
        fields.append(("kv", [("kv ", "dim"), fig.cache_mode]))
    if fig.backend:
        fields.append(("backend", [f"{fig.backend}·{fig.device}"]))
    if fig.warning:
        fields.append(("warning", [("⚠ " + fig.warning, "bold yellow")]))
    return fields


def render_status(fig: StatusFigures, width: int | None = None) -> Text:
    """The bar's text; with `width`, fields are dropped by PRIORITY (never cut mid-word) until it fits."""
    sep = (" │ ", "dim")
    if fig.state == "loading":
        text = Text.assemble(("◌ ", "bold yellow"), ("loading model", "bold"), "  ", (fig.message, "dim"))
        return _truncate(text, width)
    if fig.state == "failed":
        text = Text.assemble(("✖ ", "bold red"), ("model not loaded", "bold red"), "  ", fig.message)
        return _truncate(text, width)
    marker = ("● ", "bold green") if fig.state == "streaming" else ("○ ", "dim")
    head: list[Any] = [marker, (fig.preset, "bold")]
    fields = status_fields(fig)

    def assemble(kept: list[tuple[str, list[Any]]]) -> Text:
        parts = list(head)
        for name, field_parts in kept:
            # The sparkline sits right after the acceptance figure, without a separator.
            parts += [" "] if name == "spark" else [sep]
            parts += field_parts
        return Text.assemble(*parts)

    text = assemble(fields)
    while width is not None and text.cell_len > width and fields:
        lowest = min(fields, key=lambda field: PRIORITY[field[0]])
        fields.remove(lowest)
        text = assemble(fields)
    return _truncate(text, width)


def _truncate(text: Text, width: int | None) -> Text:
    if width is not None and text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    return text


class StatusBar(Static):
    """One line of live figures; see module doc for the refresh policy. A click with a warning shown opens
    the metrics trend."""

    class TrendRequested(Message):
        pass

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.figures: StatusFigures | None = None
        self._width: int | None = None
        self.plain = ""

    def show(self, fig: StatusFigures) -> None:
        width = self.content_size.width or None
        if fig == self.figures and width == self._width:
            return
        self.figures = fig
        self._width = width
        text = render_status(fig, width)
        if text.plain != self.plain:
            self.plain = text.plain
            # One line of fixed size (height 1, the screen's width): no layout pass. Static.update's default
            # re-lays out the whole screen, the chat log with every message in it, up to 10 times a second.
            self.update(text, layout=False)

    def on_click(self) -> None:
        if self.figures is not None and self.figures.warning:
            self.post_message(self.TrendRequested())

    def on_resize(self) -> None:
        if self.figures is not None:
            self.show(self.figures)
