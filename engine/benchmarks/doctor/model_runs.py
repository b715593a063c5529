"""`specchat doctor`'s checks that run the model: the load (its warnings captured), llama.cpp's kernel probe, whether
drafting pays, the greedy baseline on a fixed prompt, the context ladder, one prompt per task type, and a second
load that must give the same greedy text."""

from __future__ import annotations

import logging
import re
import time
import warnings
from typing import Any

from engine.benchmarks.doctor.report import DoctorReport
from engine.benchmarks.ladder import default_ladder, ladder_prompt, ladder_verdict
from engine.errors import UserError
from engine.events import fmt, percent
from engine.request import SamplerSettings

FIXED_PROMPT = (
    "Write a Python function is_prime(n) that returns True when n is a prime number. Give it a docstring, "
    "then show is_prime(2), is_prime(9) and is_prime(13) with their results."
)
LOAD_FAILURE_WORDS = ("newly initialized", "newly initialised", "not initialized", "were not used")


class _CapturedLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def load_capturing_warnings(settings, progress=None):
    """(backend, reason, captured warning lines, seconds): warnings and library log warnings raised while loading."""
    from engine.benchmarks.tune import load_backend

    handler = _CapturedLogs()
    loggers = [logging.getLogger(name) for name in ("transformers", "torch", "llama-cpp-python", "exllamav2")]
    for logger in loggers:
        logger.addHandler(handler)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            backend, reason = load_backend(settings, progress)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    lines = [summarise_warning(line) for line in [str(w.message) for w in caught] + handler.lines]
    return backend, reason, [line for line in lines if line], time.perf_counter() - start


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MISSING = re.compile(r"^\s*(\S+)\s*\|\s*MISSING\b", re.MULTILINE)


def summarise_warning(text: str) -> str:
    """One line for a captured warning; transformers' load report becomes the weights it had to make up."""
    text = _ANSI.sub("", text)
    missing = _MISSING.findall(text)
    if missing and "newly initialized" in text:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return (
            f"{len(missing)} weight(s) missing from the checkpoint were newly initialized (random): {shown}"
        )
    line = " ".join(text.split())
    return line if len(line) <= 240 else line[:237] + "..."


def run_reply(
    backend,
    prompt_ids: list[int],
    k: int,
    max_new: int,
    sampler: SamplerSettings | None = None,
    k_mode: str = "fixed",
) -> dict:
    """One reply through the bench's runner. Fixed K by default: the baseline and the ladder judge the drafts
    themselves, not the adaptive choice of when to draft (which follows the machine's load)."""
    from engine.benchmarks.runner import timed_reply

    ids, seconds, accounting, _done = timed_reply(
        backend, prompt_ids, k, max_new, sampler, k_mode, f"doctor-{k_mode}"
    )
    live = accounting.live
    return {
        "token_ids": ids,
        "tokens": len(ids),
        "seconds": seconds,
        "drafted": live.drafted,
        "accepted": live.accepted,
        "acceptance": live.acceptance_rate,
        "tau": live.mean_accepted_length,
        "tokens_per_s": live.tokens_per_s,
        "ttft_s": live.ttft_s,
    }


def fixed_prompt_ids(backend) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": FIXED_PROMPT}])


def check_load(report: DoctorReport, settings, progress=None):
    """The model loads (the backend, or None where it did not), with the warnings printed while loading: a warning
    that breaks the model (weights made up at random) fails."""
    try:
        backend, reason, captured, load_s = load_capturing_warnings(settings, progress)
    except UserError as exc:
        report.add("load", "fail", " ".join(str(exc).split()))
        return None
    info = backend.info
    report.backend, report.model = info.backend, info.model
    load_details = {"reason": reason, "seconds": load_s, "warnings": captured, "notes": list(info.notes)}
    bad = [line for line in captured if any(word in line.lower() for word in LOAD_FAILURE_WORDS)]
    if bad:
        report.add(
            "load",
            "fail",
            f"{info.backend} loaded with a warning that breaks the model: {bad[0]}",
            **load_details,
        )
    elif captured:
        report.add(
            "load",
            "warn",
            f"{info.backend} loaded with {len(captured)} warning(s), first: {captured[0]}",
            **load_details,
        )
    else:
        report.add(
            "load", "pass", f"{info.backend} in {load_s:.1f} s, no warnings ({reason})", **load_details
        )
    return backend


def check_kernel_probe(report: DoctorReport, backend, info) -> None:
    """llama.cpp's kernel probe: which verify widths compute their rows as plain steps do, and the drafts cap."""
    probe = getattr(backend, "probe", None)
    if probe is not None:
        report.add(
            "kernel_probe",
            "pass" if probe.cap_note() is None else "warn",
            f"{info.model}: {probe.describe()}",
            pad=probe.pad,
            widest=probe.widest,
            checked=probe.checked,
            max_drafts=probe.max_drafts,
        )
    else:
        report.add("kernel_probe", "skip", f"{info.backend}: no kernel probe on this engine")


def check_architecture(report: DoctorReport, backend) -> None:
    """How the model speculates (its memory drops drafts by rollback, checkpoints or the KV cache), MoE or dense,
    MTP layers: the line the chat's load notes show (engine/backends/llamacpp/architecture.py)."""
    shape = getattr(backend, "shape", None)
    if shape is None:
        report.add("architecture", "skip", f"{backend.info.backend}: the engine does not say")
        return
    report.add(
        "architecture",
        "pass",
        shape.describe(),
        arch=shape.arch,
        memory=shape.memory,
        rollback_depth=shape.rollback_depth,
        experts=shape.experts,
        experts_used=shape.experts_used,
        mtp_layers=shape.mtp_layers,
    )


def check_draft_pays(
    report: DoctorReport, backend, info, presets: dict, history_drafting: bool = True
) -> None:
    """The chat shows this same verdict at load (engine.decoding.verdict.machine_verdict): the same costs, the
    same K, history counted or not as the `history_drafting` setting says."""
    from engine.decoding.verdict import machine_verdict

    verdict = machine_verdict(backend, info.draft_mode, presets, history_drafting)
    report.add("draft_pays", verdict.status, verdict.doctor_line())


def check_baseline(report: DoctorReport, backend, k: int, max_new: int) -> tuple[dict[str, Any], list[int]]:
    """The fixed prompt, greedy, twice (the best speed kept): (the figures, the first run's tokens)."""
    ids = fixed_prompt_ids(backend)
    runs = [run_reply(backend, ids, k, max_new) for _ in range(2)]
    base = dict(runs[0])
    base["tokens_per_s"] = max((r["tokens_per_s"] or 0.0) for r in runs) or None
    base["ttft_s"] = min((r["ttft_s"] or 0.0) for r in runs)
    first_text = base.pop("token_ids")
    status = "pass" if base["tokens"] else "fail"
    if status == "pass" and k and not base["drafted"]:
        status = "warn"
    tps = base["tokens_per_s"]
    report.add(
        "baseline",
        status,
        f"K {k}, greedy, {base['tokens']} tokens: acceptance {percent(base['acceptance'])}, tau "
        f"{fmt(base['tau'], '{:.2f}')}, {fmt(tps)} tok/s, TTFT {base['ttft_s'] * 1000:.0f} ms"
        + ("; nothing was drafted" if status == "warn" else "")
        + ("; no tokens came out" if status == "fail" else ""),
        k=k,
        **base,
    )
    return base, first_text


def check_context_ladder(
    report: DoctorReport, backend, k: int, max_new: int, ladder: tuple[int, ...] | None
) -> None:
    """The same message after filler of each length: acceptance must hold up (engine.benchmarks.ladder's rule)."""
    rungs = []
    room = backend.max_context - max_new - 16
    lengths = sorted({min(r, room) for r in (ladder or default_ladder(backend.max_context)) if room > 0})
    for length in lengths:
        run = run_reply(backend, ladder_prompt(backend, length), k, max_new)
        run.pop("token_ids")
        rungs.append({"context": length, **run})
    status, reason_text = ladder_verdict(rungs)
    report.add("context_ladder", status, reason_text, rungs=rungs)


def check_tasks(report: DoctorReport, backend, info, presets: dict, max_new: int) -> None:
    """One code, one Q&A and one creative prompt of the public set, each with its preset."""
    from engine.benchmarks.runner import load_prompt_set

    tasks = {}
    for item in load_prompt_set("public"):
        task = item["category"]
        if task in tasks or task not in presets:
            continue
        preset = presets[task]
        task_ids = backend.encode_chat([{"role": "user", "content": item["prompt"]}])
        run = run_reply(
            backend,
            task_ids,
            preset.k if info.draft_mode != "none" else 0,
            max_new,
            preset.sampler(),
            preset.k_mode,
        )
        run.pop("token_ids")
        tasks[task] = run
    empty = [t for t, r in tasks.items() if not r["tokens"]]
    text = ", ".join(
        f"{t} {percent(r['acceptance'])} {fmt(r['tokens_per_s'])} tok/s" for t, r in tasks.items()
    )
    if empty:
        report.add("tasks", "fail", f"no reply for {', '.join(empty)} ({text})", tasks=tasks)
    else:
        report.add("tasks", "pass", text, tasks=tasks)


def check_restart(
    report: DoctorReport, settings, progress, k: int, max_new: int, first_text: list[int]
) -> None:
    """A second load gives the same greedy text for the fixed prompt as the baseline's first run."""
    try:
        again, _, _, again_s = load_capturing_warnings(settings, progress)
        rerun = run_reply(again, fixed_prompt_ids(again), k, max_new)
        again.close()
    except UserError as exc:
        report.add("restart", "fail", f"the second load failed: {' '.join(str(exc).split())}")
        return
    same = rerun["token_ids"] == first_text
    details = {"seconds": again_s, "acceptance": rerun["acceptance"], "same_text": same}
    if same:
        report.add(
            "restart",
            "pass",
            f"second load in {again_s:.1f} s, same greedy text (acceptance {percent(rerun['acceptance'])})",
            **details,
        )
    else:
        report.add(
            "restart",
            "fail",
            "the second load gave a different greedy text for the fixed prompt",
            **details,
        )
