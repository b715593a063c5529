"""What `specchat tune` found and how it is written out: a row per measured configuration (`TuneRow`), a decision
per task (`TaskDecision`, what `--apply` writes), the whole result (`TuneResult`), and its tables, plot, CSV and
JSON."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.benchmarks.tune.plan import TuneError
from engine.events import fmt, percent

ROW_FIELDS = (
    "task",
    "sweep",
    "k",
    "k_mode",
    "temperature",
    "ramp",
    "drafting",
    "cache_mode",
    "acceptance",
    "tokens_per_round",
    "tokens_per_s",
    "predicted_speedup",
    "measured_speedup",
    "prompts",
    "tokens",
    "drafted",
    "accepted",
    "rounds",
)


@dataclass(slots=True)
class TuneRow:
    task: str
    sweep: str  # k | adaptive | temperature | ramp | drafting | cache
    k: int  # fixed: K; adaptive: the ceiling
    k_mode: str  # fixed | adaptive
    temperature: float
    ramp: bool
    drafting: str  # none | ngram | model
    cache_mode: str
    acceptance: float | None
    tokens_per_round: float | None
    tokens_per_s: float
    predicted_speedup: float | None
    measured_speedup: float | None
    prompts: int
    tokens: int
    drafted: int
    accepted: int
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class TaskDecision:
    """What tune found for one task, and what `--apply` would write."""

    task: str
    preset_k: int
    best_k: int
    best_speedup: float | None
    ramp: tuple[int, float] | None = None  # (ramp_tokens, ramp_start) to write; None: leave the ramp alone
    ramp_note: str = ""
    # The K to write: the best, or the preset's own where the best wins only by noise.
    apply_k: int | None = None
    k_note: str = ""
    k_mode: str | None = None  # a k_mode to write ("fixed" where a fixed K beats adaptive); None: leave it

    def values(self) -> dict[str, Any]:
        values: dict[str, Any] = {"k": self.best_k if self.apply_k is None else self.apply_k}
        if self.k_mode is not None:
            values["k_mode"] = self.k_mode
        if self.ramp is not None:
            values["ramp_tokens"], values["ramp_start"] = self.ramp
        return values


@dataclass(slots=True)
class TuneResult:
    rows: list[TuneRow] = field(default_factory=list)
    decisions: dict[str, TaskDecision] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    backend: str = ""
    model: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.model,
            "seconds": self.seconds,
            "notes": self.notes,
            "rows": [r.to_dict() for r in self.rows],
            "best": {t: asdict(d) for t, d in self.decisions.items()},
        }


def speedup_text(value: float | None) -> str:
    return fmt(value, "{:.2f}x")


def format_tables(result: TuneResult) -> str:
    lines: list[str] = []
    for task, decision in result.decisions.items():
        rows = [r for r in result.rows if r.task == task]
        k_rows = [r for r in rows if r.sweep == "k"]
        first = k_rows[0]
        lines.append(
            f"{task}: {first.prompts} prompt(s), T {first.temperature:g}, {k_rows[-1].drafting} drafting, "
            f"cache {first.cache_mode}"
        )
        lines.append(
            f"  {'K':>2} | {'acceptance':>10} | {'tokens/round':>12} | {'tok/s':>7} | {'predicted':>9} | {'measured':>8}"
        )
        for r in k_rows:
            mark = " <- best" if r.k == decision.best_k else ""
            tpr = fmt(r.tokens_per_round, "{:.2f}")
            lines.append(
                f"  {r.k:>2} | {percent(r.acceptance):>10} | {tpr:>12} | {r.tokens_per_s:>7.1f} | "
                f"{speedup_text(r.predicted_speedup):>9} | {speedup_text(r.measured_speedup):>8}{mark}"
            )
        for r in rows:
            if r.sweep == "adaptive":
                lines.append(
                    f"  adaptive K up to {r.k}: acceptance {percent(r.acceptance)}, tokens/round "
                    f"{fmt(r.tokens_per_round, '{:.2f}')}, {r.tokens_per_s:.1f} tok/s, {speedup_text(r.measured_speedup)}"
                )
        temps = [r for r in rows if r.sweep == "temperature"]
        if temps:
            lines.append(
                f"  temperature at K {temps[0].k}: "
                + ", ".join(
                    f"{r.temperature:g} {percent(r.acceptance)} {speedup_text(r.measured_speedup)}"
                    for r in temps
                )
            )
        for r in rows:
            if r.sweep == "ramp":
                lines.append(
                    f"  ramp {'on ' if r.ramp else 'off'} at K {r.k}: acceptance {percent(r.acceptance)}, "
                    f"{r.tokens_per_s:.1f} tok/s, {speedup_text(r.measured_speedup)}"
                )
            elif r.sweep in ("drafting", "cache"):
                lines.append(
                    f"  {r.sweep}: {r.drafting} drafting, cache {r.cache_mode} at K {r.k}: acceptance "
                    f"{percent(r.acceptance)}, {r.tokens_per_s:.1f} tok/s, {speedup_text(r.measured_speedup)}"
                )
        lines.append(
            f"  best K {decision.best_k} ({speedup_text(decision.best_speedup)} vs plain): {decision.k_note}; "
            f"{decision.ramp_note}"
        )
        lines.append("")
    return "\n".join(lines).rstrip()


def plot(result: TuneResult, width: int = 80, height: int = 16, color: bool = False) -> str:
    """Measured speedup over K, one line per task (plotext)."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    for task in result.decisions:
        rows = [r for r in result.rows if r.task == task and r.sweep == "k"]
        plt.plot([r.k for r in rows], [r.measured_speedup or 0.0 for r in rows], label=task, marker="braille")
    plt.xlabel("K (draft tokens per round)")
    plt.title("measured speedup over plain decoding")
    drawn = plt.build()
    return drawn if color else plt.uncolorize(drawn)


def to_csv(rows: Sequence[TuneRow]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(ROW_FIELDS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.to_dict())
    return out.getvalue()


def write_outputs(result: TuneResult, folder: Path, stamp: str | None = None) -> tuple[Path, Path]:
    """`tune-<stamp>.csv` (one row per measured configuration) and `tune-<stamp>.json` (rows, winners, notes)."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        csv_path, json_path = folder / f"tune-{stamp}.csv", folder / f"tune-{stamp}.json"
        csv_path.write_text(to_csv(result.rows), encoding="utf-8")
        json_path.write_bytes(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise TuneError(f"cannot write the tune results to {folder}: {exc.strerror or exc}") from None
    return csv_path, json_path
