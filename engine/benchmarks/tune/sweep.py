"""`specchat tune`'s sweep: per task, every K (fixed and adaptive) in one rotation, then the temperatures and the
ramp at the winning K, then the other drafter and the other cache mode on a second load; the rows and decisions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
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
            cells = [Cell(k, sampler, "fixed", f"tune:{task}:fixed-{k}") for k in plan.k_values if k > 0]
            plain = Cell(0, sampler)
            # Adaptive K up to the preset's ceiling and up to the sweep's largest K, in the same rotation.
            ceilings = sorted({presets[task].k, max(plan.k_values)} - {0})
            adaptive = [Cell(c, sampler, "adaptive", f"tune:{task}:adaptive-{c}") for c in ceilings]
            measure(backend, ids, [plain, *cells, *adaptive], plan, progress, task)
            rows = [tune_row(task, "k", c, plain, drafting, cache_mode) for c in [plain, *cells]]
            adaptive_rows = [tune_row(task, "adaptive", c, plain, drafting, cache_mode) for c in adaptive]
            result.rows.extend(rows + adaptive_rows)
            winner = max(rows, key=lambda r: r.tokens_per_s)
            best[task] = winner.k
            result.decisions[task] = decide_k(
                task, presets[task].k, winner, rows, adaptive_rows, presets[task].k_mode
            )
            # Temperatures and the ramp at the winning K. Their speedups divide by the plain row above: plain
            # decoding's speed per token does not depend on the sampler (only which tokens come out does).
            k = winner.k or max(plan.k_values)
            temps = [Cell(k, without_ramp(replace(sampler, temperature=t))) for t in plan.temperatures]
            measure(backend, ids, temps, plan, progress, f"{task} temperature")
            result.rows.extend(tune_row(task, "temperature", c, plain, drafting, cache_mode) for c in temps)
            # The ramp, on (the preset's, or a default one) and off, measured side by side.
            on, off = Cell(k, with_ramp(sampler)), Cell(k, without_ramp(sampler))
            measure(backend, ids, [on, off], plan, progress, f"{task} ramp")
            on_row = tune_row(task, "ramp", on, plain, drafting, cache_mode)
            off_row = tune_row(task, "ramp", off, plain, drafting, cache_mode)
            result.rows.extend([on_row, off_row])
            decide_ramp(result.decisions[task], sampler, on.sampler, on_row, off_row)
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
            cell, plain = Cell(k, samplers[task]), Cell(0, samplers[task])
            measure(backend, ids, [cell, plain], plan, progress, f"{task} {sweep}")
            result.rows.append(tune_row(task, sweep, cell, plain, backend.info.draft_mode, cache_mode))
    finally:
        backend.close()
