"""`specchat tune`: sweep K, temperature, drafting and cache mode per task, and write the winning K into presets.

What is swept, per task (code, qa, creative), on the task's prompts:
  k            K 0 and 1..8 at the preset's own sampler (temperature, ramp ...): the table and the winner
  temperature  0.1, 0.5, 0.7, 1.0, 1.2 at the winning K
  ramp         the winning K with the preset's temperature ramp and without it, side by side ("does it pay")
  drafting     the other drafter (n-gram where a draft model is configured, the draft model where one is
               configured and n-gram drove the sweep) at the winning K, on a second load
  cache        the other cache mode (q8 <-> full precision) at the winning K, on a second load
Every row's measured speedup divides its tok/s by plain decoding's (K 0) on the same prompts and the same load
(the K rows: measured in one rotation, each repeat running the cells in a shifted order so that the machine's
noise falls on all of them alike; each cell keeps its best time). The sampled runs share one seed, so with and
without drafting they emit the same tokens. The temperature and ramp rows divide by the K sweep's plain row:
plain decoding's speed per token does not depend on the sampler.

The prompts: the public bench set (engine/benchmarks/prompts.jsonl; the held-out one stays for `specchat bench`), a
JSON Lines file of {"prompt", "category"?} objects, or the user's own past messages from the conversation store. A prompt
without a category is routed as the chat would route it.

`tune_apply.apply_results()` writes the winning K (and the ramp, where on and off differ by more than the noise margin)
into `<config dir>/presets/<task>.toml`, keeping the previous file as `<task>.toml.bak`, and returns the diffs.
Drives a backend; nothing imports this module back (the CLI calls it).
"""

from __future__ import annotations

import csv
import io
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import orjson

from engine.backends.registry import resolve_cache_mode
from engine.decoding.acceptance import predicted_speedup
from engine.decoding.drafters import is_draft_keyword
from engine.errors import SpecchatError
from engine.prompt_file import PromptFileError, read_prompt_file
from engine.request import SamplerSettings

TASKS = ("code", "qa", "creative")
K_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
TEMPERATURES = (0.1, 0.5, 0.7, 1.0, 1.2)
# A preset's K or ramp changes only when the alternative is faster by more than this (a short sweep is noisy).
NOISE_MARGIN = 0.03
# The ramp tried for a preset that has none: the first 16 tokens start at half the temperature.
DEFAULT_RAMP_TOKENS = 16
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


class TuneError(SpecchatError):
    """Bad tune input (no prompts, a bad prompt file); one line for the user."""


# --------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True)
class TunePlan:
    tasks: tuple[str, ...] = TASKS
    k_values: tuple[int, ...] = K_VALUES
    temperatures: tuple[float, ...] = TEMPERATURES
    max_new_tokens: int = 128
    prompts_per_task: int = 3
    repeats: int = 2
    sweep_drafting: bool = True
    sweep_cache: bool = True

    @classmethod
    def quick(cls, **changes: Any) -> TunePlan:
        """One prompt per task, short replies, one repeat: a first look in a minute or two."""
        return replace(cls(max_new_tokens=48, prompts_per_task=1, repeats=1), **changes)


@dataclass(frozen=True, slots=True)
class TunePrompt:
    task: str
    text: str


def prompts_from_jsonl(path: Path) -> list[TunePrompt]:
    """{"prompt": ..., "category"?: code|qa|creative} per line; a line without a category is routed."""
    from engine.router import route

    try:
        records = read_prompt_file(path)
    except PromptFileError as exc:
        raise TuneError(str(exc)) from None
    prompts = []
    for number, obj in records:
        task = obj.get("category")
        if task is None:
            task = route(obj["prompt"]).preset
        elif task not in TASKS:
            raise TuneError(f"{path}:{number}: category must be code, qa or creative (got {task!r})")
        prompts.append(TunePrompt(task, obj["prompt"]))
    return prompts


def builtin_prompts() -> list[TunePrompt]:
    """The public bench set: tuning never sees the held-out prompts that `specchat bench` reports on."""
    from engine.benchmarks.runner import load_prompt_set

    return [TunePrompt(p["category"], p["prompt"]) for p in load_prompt_set("public")]


def prompts_from_history(data_dir: Path, limit: int = 200) -> list[TunePrompt]:
    """The user's own messages from the conversation store, newest first, routed as the chat routes them."""
    from engine.router import route
    from engine.storage.store import DB_NAME, Store

    if not (data_dir / DB_NAME).is_file():
        raise TuneError(f"no conversation history yet ({data_dir / DB_NAME}): chat first or use --prompts")
    store = Store.open(data_dir)
    try:
        texts = store.user_messages(limit)
    finally:
        store.close()
    prompts = [TunePrompt(route(text).preset, text) for text in texts if text.strip()]
    if not prompts:
        raise TuneError("the conversation history has no messages of yours yet: chat first or use --prompts")
    return prompts


def pick_prompts(prompts: Sequence[TunePrompt], plan: TunePlan) -> dict[str, list[str]]:
    """Up to `prompts_per_task` prompts for each planned task that has any (in the given order)."""
    chosen: dict[str, list[str]] = {}
    for task in plan.tasks:
        texts = [p.text for p in prompts if p.task == task][: plan.prompts_per_task]
        if texts:
            chosen[task] = texts
    if not chosen:
        raise TuneError("no prompts for the tasks asked for (" + ", ".join(plan.tasks) + ")")
    return chosen


# --------------------------------------------------------------------------------------------------- results


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


# --------------------------------------------------------------------------------------------------- progress


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


# --------------------------------------------------------------------------------------------------- measuring


@dataclass(slots=True)
class _Cell:
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


def _measure(
    backend,
    prompt_ids: list[list[int]],
    cells: list[_Cell],
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


def _row(task: str, sweep: str, cell: _Cell, plain: _Cell, drafting: str, cache_mode: str) -> TuneRow:
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


def _without_ramp(sampler: SamplerSettings) -> SamplerSettings:
    return replace(sampler, ramp_tokens=0, ramp_start=0.0)


def _with_ramp(sampler: SamplerSettings) -> SamplerSettings:
    if sampler.ramp_tokens > 0:
        return sampler
    return replace(sampler, ramp_tokens=DEFAULT_RAMP_TOKENS, ramp_start=round(sampler.temperature / 2, 3))


# --------------------------------------------------------------------------------------------------- the sweep


def planned_runs(plan: TunePlan, prompts: dict[str, list[str]], other_draft: bool, other_cache: bool) -> int:
    per_task = len(plan.k_values) + 2 + len(plan.temperatures) + 2 + 2 * other_draft + 2 * other_cache
    return sum(len(texts) * per_task * plan.repeats for texts in prompts.values())


def load_backend(settings, progress=None, **updates: Any):
    """A loaded backend for `settings` with some fields changed (the embedded model fetched where none is set)."""
    from engine.backends.select import create_backend
    from engine.models import ensure_embedded_model

    settings = settings.model_copy(update=updates)
    if settings.model is None:
        settings = settings.model_copy(update={"model": ensure_embedded_model(progress)})
    backend, reason = create_backend(settings, progress)
    backend.load(progress)
    return backend, reason


def run_tune(
    settings,
    prompts: Sequence[TunePrompt],
    plan: TunePlan,
    *,
    presets: dict | None = None,
    progress_stream: IO[str] | None = None,
    load_progress=None,
) -> TuneResult:
    """The whole sweep on `settings`' model; rows, per-task decisions and notes."""
    from engine.presets import load_presets

    started = time.perf_counter()
    presets = presets if presets is not None else load_presets()
    chosen = pick_prompts(prompts, plan)
    result = TuneResult()
    main_draft = settings.draft
    if main_draft == "none":
        main_draft = "ngram"
        result.notes.append("drafting is off in the settings: the K sweep drafts with n-gram lookup")
    other_draft = "ngram" if not is_draft_keyword(main_draft) else None  # a draft model: against n-gram
    if other_draft is None:
        result.notes.append(
            "no draft model configured (--draft FOLDER): the drafting sweep is n-gram vs none"
        )

    backend, reason = load_backend(settings, load_progress, draft=main_draft)
    result.backend, result.model = backend.name, backend.info.model
    result.notes.append(reason)
    cache_mode = resolve_cache_mode(settings.cache_mode, backend.name)
    other_cache = "fp16" if cache_mode != "fp16" else "q8"
    sweep_cache = plan.sweep_cache and other_cache in ("fp16", "q8")
    drafting = backend.info.draft_mode
    progress = ProgressBar(
        planned_runs(plan, chosen, plan.sweep_drafting and other_draft is not None, sweep_cache),
        progress_stream,
    )
    encoded = {
        task: [backend.encode_chat([{"role": "user", "content": text}]) for text in texts]
        for task, texts in chosen.items()
    }
    samplers = {task: presets[task].sampler() for task in chosen}
    best: dict[str, int] = {}
    try:
        for task, ids in encoded.items():
            sampler = samplers[task]
            cells = [_Cell(k, sampler, "fixed", f"tune:{task}:fixed-{k}") for k in plan.k_values if k > 0]
            plain = _Cell(0, sampler)
            # Adaptive K up to the preset's ceiling and up to the sweep's largest K, in the same rotation.
            ceilings = sorted({presets[task].k, max(plan.k_values)} - {0})
            adaptive = [_Cell(c, sampler, "adaptive", f"tune:{task}:adaptive-{c}") for c in ceilings]
            _measure(backend, ids, [plain, *cells, *adaptive], plan, progress, task)
            rows = [_row(task, "k", c, plain, drafting, cache_mode) for c in [plain, *cells]]
            adaptive_rows = [_row(task, "adaptive", c, plain, drafting, cache_mode) for c in adaptive]
            result.rows.extend(rows + adaptive_rows)
            winner = max(rows, key=lambda r: r.tokens_per_s)
            best[task] = winner.k
            result.decisions[task] = _decide_k(
                task, presets[task].k, winner, rows, adaptive_rows, presets[task].k_mode
            )
            # Temperatures and the ramp at the winning K. Their speedups divide by the plain row above: plain
            # decoding's speed per token does not depend on the sampler (only which tokens come out does).
            k = winner.k or max(plan.k_values)
            temps = [_Cell(k, _without_ramp(replace(sampler, temperature=t))) for t in plan.temperatures]
            _measure(backend, ids, temps, plan, progress, f"{task} temperature")
            result.rows.extend(_row(task, "temperature", c, plain, drafting, cache_mode) for c in temps)
            # The ramp, on (the preset's, or a default one) and off, measured side by side.
            on, off = _Cell(k, _with_ramp(sampler)), _Cell(k, _without_ramp(sampler))
            _measure(backend, ids, [on, off], plan, progress, f"{task} ramp")
            on_row = _row(task, "ramp", on, plain, drafting, cache_mode)
            off_row = _row(task, "ramp", off, plain, drafting, cache_mode)
            result.rows.extend([on_row, off_row])
            _decide_ramp(result.decisions[task], sampler, on.sampler, on_row, off_row)
    finally:
        backend.close()

    if plan.sweep_drafting and other_draft is not None:
        _second_load(
            result, settings, load_progress, texts_by_task=chosen, samplers=samplers, best=best, plan=plan,
            progress=progress, sweep="drafting", updates={"draft": other_draft}, cache_mode=cache_mode,
        )  # fmt: skip
    if sweep_cache:
        _second_load(
            result, settings, load_progress, texts_by_task=chosen, samplers=samplers, best=best, plan=plan,
            progress=progress, sweep="cache", updates={"draft": main_draft, "cache_mode": other_cache},
            cache_mode=other_cache,
        )  # fmt: skip
    progress.finish()
    result.seconds = time.perf_counter() - started
    return result


def _second_load(
    result: TuneResult,
    settings,
    load_progress,
    *,
    texts_by_task: dict[str, list[str]],
    samplers: dict[str, SamplerSettings],
    best: dict[str, int],
    plan: TunePlan,
    progress: ProgressBar,
    sweep: str,
    updates: dict[str, Any],
    cache_mode: str,
) -> None:
    """The winning K of each task on another load (the other drafter, or the other cache mode), against plain."""
    from engine.errors import UserError

    try:
        backend, _ = load_backend(settings, load_progress, **updates)
    except UserError as exc:  # e.g. an incompatible draft: the other rows still stand
        result.notes.append(f"{sweep} sweep skipped: {' '.join(str(exc).split())}")
        return
    try:
        for task, texts in texts_by_task.items():
            ids = [backend.encode_chat([{"role": "user", "content": text}]) for text in texts]
            k = best[task] or max(plan.k_values)
            cell, plain = _Cell(k, samplers[task]), _Cell(0, samplers[task])
            _measure(backend, ids, [cell, plain], plan, progress, f"{task} {sweep}")
            result.rows.append(_row(task, sweep, cell, plain, backend.info.draft_mode, cache_mode))
    finally:
        backend.close()


def _decide_k(
    task: str,
    preset_k: int,
    winner: TuneRow,
    rows: list[TuneRow],
    adaptive_rows: Sequence[TuneRow] = (),
    k_mode: str = "fixed",
) -> TaskDecision:
    """The K to write. A fixed preset: the fastest fixed K, unless it beats the preset's K only by noise. An
    adaptive preset (K is the ceiling): the faster of its own ceiling and the sweep's largest (its own unless the
    other wins by more than noise), or a fixed K where the fastest fixed K beats adaptive by more than noise."""
    if k_mode == "adaptive" and adaptive_rows:
        return _decide_ceiling(task, preset_k, winner, adaptive_rows)
    decision = TaskDecision(task, preset_k, winner.k, winner.measured_speedup, apply_k=winner.k)
    current = next((r for r in rows if r.k == preset_k), None)
    if winner.k == preset_k:
        decision.k_note = f"the preset's K {preset_k} is the best"
    elif current is None:
        decision.k_note = f"K {winner.k} is the best (the preset's K {preset_k} was not swept)"
    elif winner.tokens_per_s > current.tokens_per_s * (1 + NOISE_MARGIN):
        gain = winner.tokens_per_s / current.tokens_per_s - 1
        decision.k_note = f"K {winner.k} beats the preset's K {preset_k} by {gain:.0%}"
    else:
        gain = winner.tokens_per_s / current.tokens_per_s - 1
        decision.apply_k = preset_k
        decision.k_note = (
            f"K {winner.k} beats the preset's K {preset_k} by only {gain:.0%} (noise margin "
            f"{NOISE_MARGIN:.0%}): K {preset_k} stays"
        )
    return decision


def _decide_ceiling(
    task: str, preset_k: int, winner: TuneRow, adaptive_rows: Sequence[TuneRow]
) -> TaskDecision:
    current = next((r for r in adaptive_rows if r.k == preset_k), None)
    fastest = max(adaptive_rows, key=lambda r: r.tokens_per_s)
    if current is None or fastest.tokens_per_s > current.tokens_per_s * (1 + NOISE_MARGIN):
        chosen = fastest
    else:
        chosen = current
    decision = TaskDecision(task, preset_k, winner.k, winner.measured_speedup, apply_k=chosen.k)
    if winner.tokens_per_s > chosen.tokens_per_s * (1 + NOISE_MARGIN):
        gain = winner.tokens_per_s / chosen.tokens_per_s - 1
        decision.apply_k, decision.k_mode = winner.k, "fixed"
        decision.k_note = (
            f"fixed K {winner.k} beats adaptive K (up to {chosen.k}) by {gain:.0%}: k_mode fixed"
        )
    elif chosen.k == preset_k:
        decision.k_note = f"adaptive K up to {preset_k} stays ({_x(chosen.measured_speedup)} vs plain)"
    else:
        decision.k_note = (
            f"adaptive K up to {chosen.k} beats up to {preset_k} ({_x(chosen.measured_speedup)} vs plain): "
            f"ceiling {chosen.k}"
        )
    return decision


def _decide_ramp(
    decision: TaskDecision,
    preset_sampler: SamplerSettings,
    on: SamplerSettings,
    on_row: TuneRow,
    off_row: TuneRow,
) -> None:
    if on.temperature <= 0:
        decision.ramp_note = "greedy preset: no ramp to tune"
        return
    gain = on_row.tokens_per_s / off_row.tokens_per_s - 1 if off_row.tokens_per_s > 0 else 0.0
    had_ramp = preset_sampler.ramp_tokens > 0
    if gain > NOISE_MARGIN and not had_ramp:
        decision.ramp = (on.ramp_tokens, on.ramp_start)
        decision.ramp_note = f"a ramp pays ({gain:+.0%} tok/s): added"
    elif gain < -NOISE_MARGIN and had_ramp:
        decision.ramp = (0, 0.0)
        decision.ramp_note = f"the ramp costs speed ({gain:+.0%} tok/s): turned off"
    else:
        decision.ramp_note = f"ramp on vs off {gain:+.0%} tok/s: left as it is"


# --------------------------------------------------------------------------------------------------- output


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


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
            tpr = "-" if r.tokens_per_round is None else f"{r.tokens_per_round:.2f}"
            lines.append(
                f"  {r.k:>2} | {_pct(r.acceptance):>10} | {tpr:>12} | {r.tokens_per_s:>7.1f} | "
                f"{_x(r.predicted_speedup):>9} | {_x(r.measured_speedup):>8}{mark}"
            )
        for r in rows:
            if r.sweep == "adaptive":
                lines.append(
                    f"  adaptive K up to {r.k}: acceptance {_pct(r.acceptance)}, tokens/round "
                    f"{(r.tokens_per_round or 0):.2f}, {r.tokens_per_s:.1f} tok/s, {_x(r.measured_speedup)}"
                )
        temps = [r for r in rows if r.sweep == "temperature"]
        if temps:
            lines.append(
                f"  temperature at K {temps[0].k}: "
                + ", ".join(f"{r.temperature:g} {_pct(r.acceptance)} {_x(r.measured_speedup)}" for r in temps)
            )
        for r in rows:
            if r.sweep == "ramp":
                lines.append(
                    f"  ramp {'on ' if r.ramp else 'off'} at K {r.k}: acceptance {_pct(r.acceptance)}, "
                    f"{r.tokens_per_s:.1f} tok/s, {_x(r.measured_speedup)}"
                )
            elif r.sweep in ("drafting", "cache"):
                lines.append(
                    f"  {r.sweep}: {r.drafting} drafting, cache {r.cache_mode} at K {r.k}: acceptance "
                    f"{_pct(r.acceptance)}, {r.tokens_per_s:.1f} tok/s, {_x(r.measured_speedup)}"
                )
        lines.append(
            f"  best K {decision.best_k} ({_x(decision.best_speedup)} vs plain): {decision.k_note}; "
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
