"""Pure functions that turn engine figures into the words and glyphs the UI shows (easy to test exactly)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.events import DASH, MessageStats, fmt, number, percent

__all__ = ["DASH", "fmt", "number", "percent"]  # the chat's figures are the benches' (engine/events.py)

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_EMPTY = "░"


def sparkline(values: Sequence[float], width: int = 16) -> str:
    """Recent per-round acceptance (0..1) as block characters, newest on the right."""
    tail = list(values)[-width:]
    top = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[max(0, min(top, round(v * top)))] for v in tail)


def bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return BAR_FULL * filled + BAR_EMPTY * (width - filled)


def seconds(value: float | None) -> str:
    """A duration as people read it: '420 ms' under a second, '2.35 s' above."""
    if value is None:
        return DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def preset_label(preset: str, auto: bool) -> str:
    return f"auto → {preset}" if auto else preset


def stats_drafted(stats: MessageStats) -> bool:
    k_known = stats.num_draft_tokens > 0 or stats.k_by_server
    return stats.draft_mode != "none" and k_known and stats.drafted_tokens > 0


def source_label(name: str) -> str:
    """A draft source as the chat names it: the drafters' name map's label ("n-gram", "history", "draft model")."""
    from engine.decoding.drafters import spec_of_mode

    spec = spec_of_mode(name)
    return spec.label if spec is not None else name


def drafts_by_source(stats: MessageStats, free_only: bool = False) -> str:
    """Drafted / accepted tokens per source, for the stats line and the inspector alike:
    `n-gram 40/32, history 120/118` (drafted/accepted), only the sources that drafted; "–" where nothing was
    measured per source (no round said who drafted: a server's or a generator's own loop, or nothing drafted).
    `free_only`: only the sources whose drafts take no model steps (n-gram, history)."""
    from engine.decoding.drafters import DRAFTERS, spec_of_mode

    def free(name: str) -> bool:
        spec = spec_of_mode(name)
        return spec is not None and not spec.steps

    drafted = {n: d for n, d in stats.drafted_by.items() if d > 0 and (free(n) or not free_only)}
    if not drafted:
        return DASH
    order = list(DRAFTERS)  # the name map's order; a source not in it last
    ordered = sorted(drafted, key=lambda n: (order.index(n) if n in order else len(order), n))
    return ", ".join(f"{source_label(n)} {drafted[n]}/{stats.accepted_by.get(n, 0)}" for n in ordered)


def history_drafting_unavailable(backend: str) -> str:
    """Why history drafting never runs on an engine (by its label, `MessageStats.backend`), or "" where it can: it is
    asked beside the drafter by the round loop, so only engines whose draft settings are the round loop's have it
    (the engines' registry); a library's own generator (ExLlamaV2/V3) or a server drafts by its own rules."""
    from engine.backends.registry import ENGINES
    from engine.decoding.drafters.registry import loop_drafters

    row = next((e for e in ENGINES if e.label == backend), None)
    if row is None or row.drafters == loop_drafters(row.name):
        return ""
    if not row.drafters:
        return "not available: the server drafts by its own settings (it is not handed this chat's history)"
    return f"not available: {row.label} runs its own generator loop, which takes no history drafts"


def k_label(stats: MessageStats) -> str:
    """`K 4`, or `K server` where a remote server fixes K (the preset's K was not sent)."""
    return "K server" if stats.k_by_server else f"K {stats.num_draft_tokens}"


def stats_line(stats: MessageStats, cancelled: bool = False) -> str:
    """The compact line under a reply: tokens, speed, acceptance, τ, K, T, preset, the backend's notes."""
    tokens = f"{stats.new_tokens} tok"
    if stats.thinking_tokens:
        tokens += f" (thinking {stats.thinking_tokens})"
    parts = [
        tokens,
        f"{number(stats.decode_tokens_per_s)} tok/s",
        f"ttft {seconds(stats.ttft_s)}",
    ]
    if stats_drafted(stats):
        accept = f"accept {percent(stats.acceptance_rate)}"
        if stats.k_by_server:  # a server's counts, as it reported them
            accept += f" ({stats.accepted_tokens}/{stats.drafted_tokens})"
        parts += [accept, f"τ {number(stats.mean_accepted_length, 2)}"]
        parts.append(k_label(stats))
        by_source = drafts_by_source(stats)
        if by_source != DASH:
            parts.append(f"drafted/accepted {by_source}")
    elif "drafted_tokens" in stats.unavailable and stats.draft_mode != "none":
        parts += [f"accept {DASH}", k_label(stats)]  # the server does not say (the inspector says why)
    elif stats.draft_mode == "none" or (stats.num_draft_tokens == 0 and not stats.k_by_server):
        parts.append("draft off")
    else:  # drafting was on, but no round drafted: say why (adaptive K found no length that pays)
        parts += [f"no drafts ({no_drafts_reason(stats)})", k_label(stats)]
    parts.append(f"T {stats.temperature:.2f}")
    parts.append(preset_label(stats.preset, bool(stats.router_reason)))
    if cancelled:
        parts.append("cancelled")
    elif stats.stop_reason == "max_new_tokens":
        parts.append("truncated (max_new_tokens)")
    elif stats.stop_reason == "context":
        parts.append("stopped: context full")
    # What the backend did differently in this reply and why (threads dropped, a loop stopped): said where the
    # reply is, not only in a log.
    parts.extend(note for note in stats.notes if note)
    return " · ".join(parts)


def no_drafts_reason(stats: MessageStats) -> str:
    """Why a reply with drafting on drafted nothing: the machine's verdict, else the measured acceptance."""
    if stats.draft_verdict_status == "warn":
        return "draft off: doesn't pay"
    if stats.draft_mode == "ngram":
        return "no match paid"
    return "no K paid at the measured acceptance"


def draft_label(file_name: str | None) -> str:
    """A draft model's name short enough for the bar: a named model's name (qwen2.5-coder-0.5b), else the
    file or folder name without .gguf, cut to 24 characters."""
    from engine.models.named import NAMED_MODELS

    name = file_name or "?"
    named = next((m.name for m in NAMED_MODELS.values() if m.filename == name), None)
    if named is not None:
        return named
    stem = name.removesuffix(".gguf")
    return stem if len(stem) <= 24 else stem[:23] + "…"


def drafter_name(info) -> str:
    """`draft qwen2.5-coder-0.5b` or `n-gram drafting` (the drafters' name map's label): what the verdict is about
    (a BackendInfo)."""
    from engine.decoding.drafters import spec_of_mode

    spec = spec_of_mode(info.draft_mode)
    if spec is not None and spec.keyword:
        return f"{spec.label} drafting"
    return f"draft {draft_label(info.draft_model)}"


def drafts_here(draft_mode: str | None) -> bool:
    """Drafting by one of our drafters (the name map's), not off and not a server's own."""
    from engine.decoding.drafters import drafts

    return drafts(draft_mode)


def verdict_line(verdict, info, changed: bool = False) -> str:
    """The chat's line on whether drafting pays (engine.decoding.verdict, the doctor's words); "" for none."""
    if verdict is None or info is None:
        return ""
    line = verdict.chat_line(drafter_name(info))
    if line and changed:
        line = "now: " + line
    return line


# A reply row that never got its end: specchat quit mid-reply, or the history could no longer be written (a full
# disk: the reply finished in memory only). The file cannot tell which.
INTERRUPTED = "interrupted mid-reply (specchat quit, or saving stopped: a full disk)"


def interrupted_line(preset: str | None, k: int | None, temperature: float | None, text: str = "") -> str:
    """The line under a reply whose process ended mid-stream: what is known of it (no speed, no acceptance)."""
    parts = [INTERRUPTED]
    if text:
        parts.append(f"{len(text.split())} words kept")
    if k:
        parts.append(f"K {k}")
    if temperature is not None:
        parts.append(f"T {temperature:.2f}")
    if preset:
        parts.append(preset)
    return " · ".join(parts)


def stored_stats_line(message) -> str:
    """The stats line of a stored reply (a `MessageRecord`): as under a live reply, or why it has none."""
    from engine.storage.recording import stats_from_dict

    if message.role != "assistant":
        return ""
    stats = stats_from_dict(message.stats)
    line = stats_line(stats, message.stop_reason == "cancelled") if stats is not None else ""
    if message.error:
        line = f"failed: {message.error}" + (f" · {line}" if line else "")
    elif message.interrupted:
        line = INTERRUPTED
    return line


TREND_WINDOW_S = 7 * 86400


def trend_text(rows: list[dict], regressions: list, width: int = 96) -> str:
    """The metrics trend dialog's text: what regressed (if anything), the daily table and the per-reply plot of the
    last 7 days, as `specchat metrics` prints them."""
    import time

    from engine.storage import metrics

    lines: list[str] = []
    for regression in regressions:
        lines.append(f"⚠ regression: {regression.describe()}")
    if regressions:
        lines += [
            "  (specchat metrics --check says the same; the baseline is the 7 days before the last 20 replies)",
            "",
        ]
    recent = [r for r in rows if r["timestamp"] >= time.time() - TREND_WINDOW_S]
    if not recent:
        return "\n".join([*lines, "no replies in the metrics log in the last 7 days"])
    lines.append(metrics.format_table(metrics.summarize(recent, "day"), "day"))
    if len(recent) >= 2:
        lines += ["", metrics.plot(recent, width=width, height=16)]
    return "\n".join(lines)
