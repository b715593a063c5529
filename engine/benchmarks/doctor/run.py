"""`run_doctor`: `specchat doctor`'s checks in their order (the package's docstring lists them), each area's in its
own module; a check that cannot run because an earlier one failed is "skip"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.benchmarks.doctor.baseline import check_regression
from engine.benchmarks.doctor.compatibility import check_compatibility
from engine.benchmarks.doctor.environment import check_environment
from engine.benchmarks.doctor.memory import check_memory
from engine.benchmarks.doctor.model_runs import (
    check_architecture,
    check_baseline,
    check_context_ladder,
    check_draft_pays,
    check_kernel_probe,
    check_load,
    check_restart,
    check_tasks,
)
from engine.benchmarks.doctor.report import DoctorOptions, DoctorReport
from engine.errors import UserError
from engine.storage.metrics import fingerprint

# The checks after the compatibility check: skipped where the draft cannot draft, or the model did not load.
MODEL_CHECKS = (
    "load",
    "kernel_probe",
    "architecture",
    "draft_pays",
    "baseline",
    "context_ladder",
    "tasks",
    "restart",
    "regression",
)


def run_doctor(
    settings,
    options: DoctorOptions | None = None,
    *,
    data_dir: Path,
    progress: Callable[[str, float | None], None] | None = None,
    step: Callable[[str], None] | None = None,
) -> DoctorReport:
    from engine.decoding.drafters import is_draft_keyword
    from engine.models import ensure_embedded_model
    from engine.presets import load_presets

    options = options or DoctorOptions()
    say = step or (lambda text: None)
    report = DoctorReport()
    if settings.model is None:
        settings = settings.model_copy(update={"model": ensure_embedded_model(progress)})
    model_dir = Path(settings.model)
    draft_dir = Path(settings.draft) if not is_draft_keyword(settings.draft) else None
    report.fingerprint = fingerprint(model_dir, draft_dir if draft_dir is not None else settings.draft)

    say("environment")
    cuda = check_environment(report)
    check_memory(report, settings, model_dir, draft_dir, cuda)
    say("draft compatibility")
    compatible = check_compatibility(report, model_dir, draft_dir)
    if not compatible:
        _skip(report, MODEL_CHECKS, "the draft model cannot draft for this model (see compatibility)")
        return report

    say("loading the model")
    backend = check_load(report, settings, progress)
    if backend is None:
        _skip(report, MODEL_CHECKS[1:], "the model did not load")
        return report
    info = backend.info
    check_kernel_probe(report, backend, info)
    check_architecture(report, backend)
    presets = load_presets()
    max_new = options.max_new_tokens
    k = presets["code"].k if info.draft_mode != "none" else 0
    check_draft_pays(report, backend, info, presets, settings.history_drafting)
    generated = _generation_checks(report, backend, info, presets, k, options, say)
    backend.close()
    if generated is None:
        return report
    base, first_text = generated

    say("restart")
    check_restart(report, settings, progress, k, max_new, first_text)
    say("baseline comparison")
    check_regression(report, options, data_dir, info, k, max_new, base)
    return report


def _skip(report: DoctorReport, names, why: str) -> None:
    for name in names:
        report.add(name, "skip", f"not run: {why}")


def _generation_checks(
    report: DoctorReport, backend, info, presets: dict, k: int, options: DoctorOptions, say
):
    """The checks that generate on the loaded model: the baseline, the context ladder, the task types. Returns
    the baseline's figures and first text, or None where generating failed (reported as the baseline's fail)."""
    max_new = options.max_new_tokens
    try:
        say("baseline")
        base, first_text = check_baseline(report, backend, k, max_new)
        say("context ladder")
        check_context_ladder(report, backend, k, max_new, options.ladder)
        say("task types")
        check_tasks(report, backend, info, presets, max_new)
    except UserError as exc:
        report.add("baseline", "fail", f"generation failed: {' '.join(str(exc).split())}")
        return None
    return base, first_text
