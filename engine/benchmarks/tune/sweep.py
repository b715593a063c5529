"""`specchat tune`'s sweep: per task, every K (fixed and adaptive) in one rotation, then the temperatures and the
ramp at the winning K, then the other drafter and the other cache mode on a second load; the rows and decisions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

from engine.backends.registry import resolve_cache_mode
from engine.benchmarks.tune.decide import decide_k, decide_ramp
from engine.benchmarks.tune.measure import Cell, ProgressBar, measure, tune_row, with_ramp, without_ramp
from engine.benchmarks.tune.plan import TunePlan, TunePrompt, pick_prompts
from engine.benchmarks.tune.results import TuneResult
from engine.decoding.drafters import is_draft_keyword
from engine.request import SamplerSettings


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


@dataclass
class _Sweep:
    """What each task's sweep on the main load shares: the backend, the plan, the progress bar, the result."""

    backend: Any
    plan: TunePlan
    progress: ProgressBar
    drafting: str  # the backend's draft mode, as its rows name it
    cache_mode: str
    result: TuneResult

    def row(self, task: str, sweep: str, cell: Cell, plain: Cell):
        return tune_row(task, sweep, cell, plain, self.drafting, self.cache_mode)


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
    main_draft, other_draft = _drafters(settings.draft, result)
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
    sweep = _Sweep(backend, plan, progress, drafting, cache_mode, result)
    try:
        for task, ids in encoded.items():
            best[task] = _sweep_task(sweep, task, ids, samplers[task], presets[task])
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


def _drafters(draft: str, result: TuneResult) -> tuple[str, str | None]:
    """The drafter the K sweep drafts with, and the one the drafting sweep sets against it (None: n-gram against
    none); a note for each choice the settings did not make."""
    main_draft = draft
    if main_draft == "none":
        main_draft = "ngram"
        result.notes.append("drafting is off in the settings: the K sweep drafts with n-gram lookup")
    other_draft = "ngram" if not is_draft_keyword(main_draft) else None  # a draft model: against n-gram
    if other_draft is None:
        result.notes.append(
            "no draft model configured (--draft FOLDER): the drafting sweep is n-gram vs none"
        )
    return main_draft, other_draft


def _sweep_task(sweep: _Sweep, task: str, ids: list[list[int]], sampler: SamplerSettings, preset) -> int:
    """One task on the main load: every K, then the temperatures and the ramp at the winning K. Returns the
    winning fixed K (0: plain won)."""
    plain, winner = _sweep_k(sweep, task, ids, sampler, preset)
    _sweep_sampler(sweep, task, ids, sampler, plain, winner.k or max(sweep.plan.k_values))
    return winner.k


def _sweep_k(sweep: _Sweep, task: str, ids: list[list[int]], sampler: SamplerSettings, preset):
    """Plain, every fixed K and adaptive K in one rotation; the task's K decision. Returns the plain cell and the
    winning row."""
    plan, result = sweep.plan, sweep.result
    cells = [Cell(k, sampler, "fixed", f"tune:{task}:fixed-{k}") for k in plan.k_values if k > 0]
    plain = Cell(0, sampler)
    # Adaptive K up to the preset's ceiling and up to the sweep's largest K, in the same rotation.
    ceilings = sorted({preset.k, max(plan.k_values)} - {0})
    adaptive = [Cell(c, sampler, "adaptive", f"tune:{task}:adaptive-{c}") for c in ceilings]
    measure(sweep.backend, ids, [plain, *cells, *adaptive], plan, sweep.progress, task)
    rows = [sweep.row(task, "k", c, plain) for c in [plain, *cells]]
    adaptive_rows = [sweep.row(task, "adaptive", c, plain) for c in adaptive]
    result.rows.extend(rows + adaptive_rows)
    winner = max(rows, key=lambda r: r.tokens_per_s)
    result.decisions[task] = decide_k(task, preset.k, winner, rows, adaptive_rows, preset.k_mode)
    return plain, winner


def _sweep_sampler(
    sweep: _Sweep, task: str, ids: list[list[int]], sampler: SamplerSettings, plain: Cell, k: int
) -> None:
    """The temperatures and the ramp at K; the task's ramp decision. Their speedups divide by the plain row of the
    K sweep: plain decoding's speed per token does not depend on the sampler (only which tokens come out does)."""
    plan, result = sweep.plan, sweep.result
    temps = [Cell(k, without_ramp(replace(sampler, temperature=t))) for t in plan.temperatures]
    measure(sweep.backend, ids, temps, plan, sweep.progress, f"{task} temperature")
    result.rows.extend(sweep.row(task, "temperature", c, plain) for c in temps)
    # The ramp, on (the preset's, or a default one) and off, measured side by side.
    on, off = Cell(k, with_ramp(sampler)), Cell(k, without_ramp(sampler))
    measure(sweep.backend, ids, [on, off], plan, sweep.progress, f"{task} ramp")
    on_row = sweep.row(task, "ramp", on, plain)
    off_row = sweep.row(task, "ramp", off, plain)
    result.rows.extend([on_row, off_row])
    decide_ramp(result.decisions[task], sampler, on.sampler, on_row, off_row)


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
            cell, plain = Cell(k, samplers[task]), Cell(0, samplers[task])
            measure(backend, ids, [cell, plain], plan, progress, f"{task} {sweep}")
            result.rows.append(tune_row(task, sweep, cell, plain, backend.info.draft_mode, cache_mode))
    finally:
        backend.close()
