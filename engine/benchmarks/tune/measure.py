"""How `specchat tune` measures: a configuration (`Cell`: K, sampler, K mode) run over a task's prompts in a
rotating order, each run's best time and pooled counts kept, and its row against plain decoding; the progress line
with its ETA."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO

from engine.benchmarks.tune.plan import TunePlan
from engine.benchmarks.tune.results import TuneRow
from engine.decoding.acceptance import predicted_speedup
from engine.request import SamplerSettings

# The ramp tried for a preset that has none: the first 16 tokens start at half the temperature.
DEFAULT_RAMP_TOKENS = 16


class ProgressBar:
    """Runs done / planned with the elapsed time and an ETA, on one redrawn line (a terminal) or every 10%."""

    def __init__(
        self, total: int, stream: IO[str] | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.start = clock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_decile = -1

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        elapsed = self.clock() - self.start
        return elapsed / self.done * (self.total - self.done)

    def line(self, label: str = "") -> str:
        width = 24
        filled = min(width, int(width * self.done / self.total))
        eta = self.eta_s()
        eta_text = "ETA --:--" if eta is None else f"ETA {_clock(eta)}"
        return (
            f"tune [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} runs  "
            f"{_clock(self.clock() - self.start)} elapsed  {eta_text}  {label}"
        ).rstrip()

    def advance(self, label: str = "", steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line(label))
            self.stream.flush()
            return
        decile = self.done * 10 // self.total
        if decile != self._last_decile:
            self._last_decile = decile
            print(self.line(label), file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


@dataclass(slots=True)
class Cell:
    """One configuration measured over a task's prompts: its runs' best times and pooled counts."""

    k: int
    sampler: SamplerSettings
    k_mode: str = "fixed"
    key: str = ""  # whose acceptance estimates the backend keeps for these runs (apart from the chat's)
    best_s: dict[int, float] = field(default_factory=dict)  # prompt index -> best seconds
    tokens: dict[int, int] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    emitted: int = 0
    predicted_weighted: float = 0.0  # sum of (prediction x tokens) over runs

    @property
    def tokens_per_s(self) -> float:
        seconds = sum(self.best_s.values())
        return sum(self.tokens.values()) / seconds if seconds > 0 else 0.0

    @property
    def predicted(self) -> float | None:
        return self.predicted_weighted / self.emitted if self.emitted else None


def _prediction(accounting, done) -> float:
    """The run's own speedup prediction, as the stats line computes it (1.0 for a run that drafted nothing)."""
    live = accounting.live
    if not live.drafted:
        return 1.0
    if done is not None and done.round_cost and live.rounds:
        return (live.new_tokens / live.rounds) / done.round_cost
    alpha, k = accounting.alpha_and_k()
    if alpha is None:
        return 1.0
    c = done.draft_step_s / done.target_step_s if done is not None and done.target_step_s > 0 else 0.0
    return predicted_speedup(alpha, k, c)


def measure(
    backend,
    prompt_ids: list[list[int]],
    cells: list[Cell],
    plan: TunePlan,
    progress: ProgressBar,
    label: str,
) -> None:
    """Run every cell on every prompt, `plan.repeats` times in rotating order; fill in the cells."""
    from engine.benchmarks.runner import timed_reply

    timed_reply(backend, prompt_ids[0], 0, 4)  # warm-up: allocator, caches
    for rep in range(plan.repeats):
        for p, ids in enumerate(prompt_ids):
            shift = (p + rep) % len(cells)
            for cell in cells[shift:] + cells[:shift]:
                out, seconds, accounting, done = timed_reply(
                    backend, ids, cell.k, plan.max_new_tokens, cell.sampler, cell.k_mode, cell.key
                )
                n = max(len(out), 1)
                cell.best_s[p] = min(cell.best_s.get(p, math.inf), seconds)
                cell.tokens[p] = n
                live = accounting.live
                cell.drafted += live.drafted
                cell.accepted += live.accepted
                cell.rounds += live.rounds
                cell.emitted += live.new_tokens
                cell.predicted_weighted += _prediction(accounting, done) * live.new_tokens
                mode = " adaptive" if cell.k_mode == "adaptive" else ""
                progress.advance(f"{label} K={cell.k}{mode} T={cell.sampler.temperature:g}")


def tune_row(task: str, sweep: str, cell: Cell, plain: Cell, drafting: str, cache_mode: str) -> TuneRow:
    base = plain.tokens_per_s
    return TuneRow(
        task=task,
        sweep=sweep,
        k=cell.k,
        k_mode=cell.k_mode,
        temperature=cell.sampler.temperature,
        ramp=cell.sampler.ramp_tokens > 0,
        drafting=drafting if cell.k > 0 else "none",
        cache_mode=cache_mode,
        acceptance=cell.accepted / cell.drafted if cell.drafted else None,
        tokens_per_round=cell.emitted / cell.rounds if cell.rounds else None,
        tokens_per_s=cell.tokens_per_s,
        predicted_speedup=cell.predicted if cell.k > 0 else 1.0,
        measured_speedup=cell.tokens_per_s / base if base > 0 else None,
        prompts=len(cell.best_s),
        tokens=sum(cell.tokens.values()),
        drafted=cell.drafted,
        accepted=cell.accepted,
        rounds=cell.rounds,
    )


def without_ramp(sampler: SamplerSettings) -> SamplerSettings:
    return replace(sampler, ramp_tokens=0, ramp_start=0.0)


def with_ramp(sampler: SamplerSettings) -> SamplerSettings:
    if sampler.ramp_tokens > 0:
        return sampler
    return replace(sampler, ramp_tokens=DEFAULT_RAMP_TOKENS, ramp_start=round(sampler.temperature / 2, 3))
