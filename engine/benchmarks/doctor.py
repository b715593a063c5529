"""`specchat doctor`: the validation routine to run after every change, each check pass / warn / fail in one line.

The checks, in order (a check that cannot run because an earlier one failed is "skip"):
  environment    torch, CUDA, the exllamav2 and exllamav3 builds, flash-attn, the llama.cpp bindings
  memory         free GPU memory and the memory plan, with advice for 24 / 16 / 12 / 8 GB cards
  compatibility  draft vs target: vocabulary sizes, differing token strings, special tokens, tokenizer file
                 hashes, chat templates (the rule that fails is named)
  load           the backend loads; warnings printed while loading are captured and shown
  draft_pays     whether drafting can pay on this machine, and why: the verify cost r(2) and the draft step c
                 measured at load, priced at 90% acceptance (a warning where no K could pay)
  baseline       a fixed prompt, greedy: acceptance, tau, tok/s, TTFT
  context        the ladder 512, 2k, 4k ... up to max_context, the same message to repeat after filler of each
                 length: acceptance must stay within 5 points of the first rung, and a larger drop fails only
                 beyond the noise of the rungs' drafts (too few drafts to judge are a warning, not a verdict)
  tasks          one code, one Q&A and one creative prompt with their presets
  restart        a second load gives the same greedy text
  regression     against the last saved baseline of this fingerprint (model + draft + tokenizer files) on the
                 same backend, cache and drafting: a drop of 8+ acceptance points or 15%+ tok/s fails (the rule
                 of `specchat metrics --check`)
A run without failures is saved as the new baseline (`<data dir>/doctor/<fingerprint>.json`). Drives a backend
through the bench's runner; nothing imports this module back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.backends import registry
from engine.backends.registry import resolve_cache_mode
from engine.benchmarks.ladder import MIN_DRAFTED_TO_JUDGE, default_ladder, ladder_prompt, ladder_verdict
from engine.errors import UserError
from engine.request import SamplerSettings
from engine.storage.metrics import ACCEPTANCE_DROP_POINTS, TOKENS_PER_S_DROP, fingerprint

STATUSES = ("pass", "warn", "fail", "skip")
CHECK_NAMES = (
    "torch",
    "cuda",
    *(row.check for row in registry.ENGINES if row.check and row.gpu),
    "flash_attn",
    *(row.check for row in registry.ENGINES if row.check and not row.gpu),
    "cpu_kernels",
    "memory",
    "compatibility",
    "load",
    "kernel_probe",
    "draft_pays",
    "baseline",
    "context_ladder",
    "tasks",
    "restart",
    "regression",
)
GPU_TIERS_GB = (24, 16, 12, 8)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")
FIXED_PROMPT = (
    "Write a Python function is_prime(n) that returns True when n is a prime number. Give it a docstring, "
    "then show is_prime(2), is_prime(9) and is_prime(13) with their results."
)
LOAD_FAILURE_WORDS = ("newly initialized", "newly initialised", "not initialized", "were not used")


class DoctorError(UserError, ValueError):
    """Doctor cannot run at all (exit 2); one line."""


@dataclass(slots=True)
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class DoctorOptions:
    max_new_tokens: int = 96
    ladder: tuple[int, ...] | None = None  # prompt lengths; None: 512, 2048, 4096 ... up to max_context
    save_baseline: bool = True
    force_save: bool = False


@dataclass(slots=True)
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    fingerprint: str = ""
    backend: str = ""
    model: str = ""
    baseline_file: str = ""
    baseline_saved: bool = False

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def add(self, name: str, status: str, reason: str, /, **details: Any) -> Check:
        assert status in STATUSES, status
        check = Check(name, status, " ".join(reason.split()), details)
        self.checks.append(check)
        return check

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "fingerprint": self.fingerprint,
            "backend": self.backend,
            "model": self.model,
            "baseline_file": self.baseline_file,
            "baseline_saved": self.baseline_saved,
            "checks": [c.to_dict() for c in self.checks],
        }


# --------------------------------------------------------------------------------------------------- rules


def compare_baseline(previous: dict[str, Any] | None, now: dict[str, Any]) -> tuple[str, str]:
    """(status, reason): the regression rule against the last saved baseline."""
    if previous is None:
        return "pass", "no earlier baseline for this fingerprint, backend, cache and drafting"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(previous.get("timestamp", 0)))
    problems = []
    before_acc, now_acc = previous.get("acceptance"), now.get("acceptance")
    if (
        before_acc is not None
        and now_acc is not None
        and min(previous.get("drafted", 0), now.get("drafted", 0)) >= MIN_DRAFTED_TO_JUDGE
    ):
        drop = round((before_acc - now_acc) * 100, 6)
        if drop >= ACCEPTANCE_DROP_POINTS:
            problems.append(
                f"acceptance {before_acc * 100:.0f}% -> {now_acc * 100:.0f}% ({drop:.0f} points, "
                f"rule: a drop of {ACCEPTANCE_DROP_POINTS:.0f}+ points fails)"
            )
    before_tps, now_tps = previous.get("tokens_per_s"), now.get("tokens_per_s")
    if before_tps and now_tps is not None:
        slower = round(1 - now_tps / before_tps, 6)
        if slower >= TOKENS_PER_S_DROP:
            problems.append(
                f"tok/s {before_tps:.1f} -> {now_tps:.1f} ({slower * 100:.0f}% slower, "
                f"rule: {TOKENS_PER_S_DROP * 100:.0f}%+ fails)"
            )
    if problems:
        return "fail", f"since the baseline of {when}: " + "; ".join(problems)
    return "pass", f"within the rules of the baseline of {when}"


def tier_advice(config: dict, cache_mode: str, max_context: int, draft_config: dict | None, bits=None):
    """For each of 24/16/12/8 GB: (fits, one line)."""
    from engine.memory_plan import plan_memory

    tiers = {}
    for gb in GPU_TIERS_GB:
        plan = plan_memory(
            config,
            cache_mode,
            max_context,
            draft_config,
            cache_mode,
            budget_bytes=gb * 2**30,
            bits_per_weight=bits,
        )
        tiers[f"{gb} GB"] = {"fits": bool(plan.fits), "advice": plan.advice}
    return tiers


# --------------------------------------------------------------------------------------------------- environment


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_engine(report: DoctorReport, row: registry.Engine, cuda: bool) -> None:
    """An engine of the registry: whether it runs here (a GPU engine is probed only where CUDA is)."""
    version = _version(row.distribution) if row.distribution else None
    if not row.gpu:
        usable, reason = registry.probe(row)
        if usable and row.detail:
            reason += registry.entry_point(row.detail)()
        report.add(row.check, "pass" if usable else "warn", reason)
        return
    usable, reason = registry.probe(row) if cuda else (False, "no CUDA GPU")
    if usable:
        report.add(row.check, "pass", reason, version=version)
    elif cuda and (version or not row.install_hint):
        report.add(row.check, "fail", f"{row.name} cannot run on this GPU: {reason}", version=version)
    elif cuda:
        report.add(row.check, "warn", f"not installed: {registry.entry_point(row.install_hint)}")
    else:
        report.add(
            row.check, "warn", f"not usable without CUDA ({version or 'not installed'})", version=version
        )


def check_environment(report: DoctorReport) -> bool:
    """torch, CUDA, the registry's engines (the GPU ones, flash-attn, the CPU ones), the row-invariant kernel;
    returns whether a CUDA GPU is visible."""
    try:
        import torch
    except Exception as exc:  # a broken install: everything after this needs torch
        report.add("torch", "fail", f"torch does not import ({exc}): run make install")
        return False
    report.add("torch", "pass", f"torch {torch.__version__}", version=torch.__version__)
    cuda = False
    try:
        cuda = bool(torch.cuda.is_available())
    except Exception as exc:
        report.add("cuda", "warn", f"CUDA check failed ({exc}): the CPU backends run")
    else:
        if cuda:
            name = torch.cuda.get_device_name(0)
            report.add(
                "cuda", "pass", f"CUDA {torch.version.cuda} on {name}", device=name, cuda=torch.version.cuda
            )
        else:
            why = "a CPU build of torch" if torch.version.cuda is None else "no CUDA GPU visible"
            report.add("cuda", "warn", f"{why}: ExLlamaV2 cannot run; the CPU backends run (slower)")
    gpu_engines = [row for row in registry.ENGINES if row.check and row.gpu]
    for row in gpu_engines:
        check_engine(report, row, cuda)
    flash = _version("flash-attn") or _version("flash_attn")
    if flash:
        report.add("flash_attn", "pass", f"flash-attn {flash}", version=flash)
    elif cuda:
        report.add(
            "flash_attn", "warn", "flash-attn is not installed: exllamav2 runs without it, prefill is slower"
        )
    else:
        report.add("flash_attn", "pass", "not needed without CUDA")
    for row in registry.ENGINES:
        if row.check and not row.gpu:
            check_engine(report, row, cuda)
    from engine.backends.transformers import rowlin

    kernel, why = rowlin.load()
    if kernel is not None:
        report.add(
            "cpu_kernels",
            "pass",
            f"row-invariant C kernel built ({kernel.lanes} float lanes): exact and fast speculation on the CPU",
            path=str(kernel.path),
            lanes=kernel.lanes,
        )
    else:
        report.add("cpu_kernels", "warn", f"{why} (install a C compiler for ~1.2x faster CPU decoding)")
    return cuda


def _read_config(path: Path) -> tuple[dict, float | None]:
    if path.suffix.lower() == ".gguf":
        from engine.models import gguf_config

        return gguf_config(path)
    return json.loads((path / "config.json").read_text(encoding="utf-8")), None


def check_memory(report: DoctorReport, settings, model_dir: Path, draft_dir: Path | None, cuda: bool) -> None:
    from engine.memory_plan import MemoryPlanError, format_bytes, plan_memory

    try:
        config, bits = _read_config(model_dir)
        draft_config = _read_config(draft_dir)[0] if draft_dir is not None else None
        mode = resolve_cache_mode(settings.cache_mode, "exllamav2")
        plan = plan_memory(config, mode, settings.max_context, draft_config, mode, bits_per_weight=bits)
        tiers = tier_advice(config, mode, settings.max_context, draft_config, bits)
    except (OSError, ValueError, KeyError, MemoryPlanError) as exc:
        report.add("memory", "warn", f"no memory plan: {' '.join(str(exc).split())}")
        return
    need = format_bytes(plan.total_bytes)
    smallest = next((t for t in reversed(list(tiers)) if tiers[t]["fits"]), None)
    tier_text = (
        f"fits {smallest} cards and up" if smallest else f"needs more than 24 GB: {tiers['24 GB']['advice']}"
    )
    details = {
        "total_bytes": plan.total_bytes,
        "cache_mode": mode,
        "max_context": settings.max_context,
        "tiers": tiers,
    }
    if not cuda:
        report.add(
            "memory",
            "pass",
            f"GPU plan {need} (exllamav2, {mode} cache, {settings.max_context} context); {tier_text}",
            **details,
        )
        return
    import torch

    free, total = torch.cuda.mem_get_info()
    details.update(free_bytes=free, device_total_bytes=total)
    now = plan_memory(
        config, mode, settings.max_context, draft_config, mode, budget_bytes=free, bits_per_weight=bits
    )
    status = "pass" if now.fits else "fail"
    report.add(
        "memory",
        status,
        f"free {format_bytes(free)} of {format_bytes(total)}; GPU plan {need}: {now.advice}; {tier_text}",
        **details,
    )


# --------------------------------------------------------------------------------------------------- compatibility


def file_hashes(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()[:16]
        for name in TOKENIZER_FILES
        if (folder / name).is_file()
    }


def check_compatibility(report: DoctorReport, model_dir: Path, draft_dir: Path | None) -> bool:
    """The draft/target specifics; returns False when the draft cannot draft (the rule named)."""
    if draft_dir is None:
        hashes = file_hashes(model_dir) if model_dir.is_dir() else {}
        report.add("compatibility", "pass", "n-gram drafting: no draft model to check", target_hashes=hashes)
        return True
    if not model_dir.is_dir() or not draft_dir.is_dir():
        report.add(
            "compatibility", "pass", "GGUF files: checked by the backend at load", draft=str(draft_dir)
        )
        return True
    from transformers import AutoTokenizer

    from engine.chat_template import ChatTemplate
    from engine.decoding.draft_compat import (
        DraftIncompatibleError,
        VocabView,
        check_draft_compatible,
        special_token_ids,
    )

    views, templates, sizes = {}, {}, {}
    for who, folder in (("target", model_dir), ("draft", draft_dir)):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        template = ChatTemplate.from_folder(folder)
        templates[who] = template
        views[who] = VocabView(
            folder.name, len(tokenizer), special_token_ids(tokenizer, template.end_of_turn), tokenizer
        )
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        sizes[who] = {"tokenizer": len(tokenizer), "embedding": config.get("vocab_size")}
    shared = min(views["target"].tokenizer_size, views["draft"].tokenizer_size)
    ids = list(range(shared))
    target_tokens = views["target"].tokenizer.convert_ids_to_tokens(ids)
    draft_tokens = views["draft"].tokenizer.convert_ids_to_tokens(ids)
    differing = sum(a != b for a, b in zip(target_tokens, draft_tokens, strict=True))
    hashes = {"target": file_hashes(model_dir), "draft": file_hashes(draft_dir)}
    same_files = hashes["target"].get("tokenizer.json") == hashes["draft"].get("tokenizer.json")
    same_template = templates["target"].source == templates["draft"].source
    details = {
        "vocab_sizes": sizes,
        "differing_token_strings": differing,
        "compared_ids": shared,
        "special_tokens": {"target": views["target"].special_ids, "draft": views["draft"].special_ids},
        "tokenizer_hashes": hashes,
        "same_tokenizer_file": same_files,
        "same_chat_template": same_template,
    }
    try:
        check_draft_compatible(views["target"], views["draft"])
    except DraftIncompatibleError as exc:
        report.add(
            "compatibility", "fail", f"{exc} ({differing} of {shared} token strings differ)", **details
        )
        return False
    notes = []
    if differing:
        notes.append(f"{differing} of {shared} token strings differ outside the sampled ids")
    if not same_files:
        notes.append("the tokenizer files differ (another tokenizer version?)")
    if not same_template:
        notes.append("the chat templates differ")
    if notes:
        status = "fail" if differing else "warn"
        report.add(
            "compatibility", status, "compatible by the sampled rules, but " + "; ".join(notes), **details
        )
        return not differing
    report.add(
        "compatibility",
        "pass",
        f"vocabulary {sizes['target']['tokenizer']} = {sizes['draft']['tokenizer']}, all token strings, special "
        "tokens, tokenizer file and chat template the same",
        **details,
    )
    return True


# --------------------------------------------------------------------------------------------------- model runs


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


def _run(
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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _fixed_prompt_ids(backend) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": FIXED_PROMPT}])


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
    later = (
        "load",
        "kernel_probe",
        "draft_pays",
        "baseline",
        "context_ladder",
        "tasks",
        "restart",
        "regression",
    )
    if not compatible:
        for name in later:
            report.add(
                name, "skip", "not run: the draft model cannot draft for this model (see compatibility)"
            )
        return report

    say("loading the model")
    try:
        backend, reason, captured, load_s = load_capturing_warnings(settings, progress)
    except UserError as exc:
        report.add("load", "fail", " ".join(str(exc).split()))
        for name in later[1:]:
            report.add(name, "skip", "not run: the model did not load")
        return report
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

    # llama.cpp's kernel probe: which verify widths compute their rows as plain steps do, and the drafts cap.
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
    presets = load_presets()
    max_new = options.max_new_tokens
    k = presets["code"].k if info.draft_mode != "none" else 0
    # The chat shows this same verdict at load (engine.decoding.verdict): the same costs, the same K.
    from engine.decoding.verdict import draft_verdict, verdict_k_max, verify_costs_of

    verdict = draft_verdict(verify_costs_of(backend), info.draft_mode, verdict_k_max(presets.values()))
    report.add("draft_pays", verdict.status, verdict.doctor_line())
    try:
        say("baseline")
        ids = _fixed_prompt_ids(backend)
        runs = [_run(backend, ids, k, max_new) for _ in range(2)]
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
            f"K {k}, greedy, {base['tokens']} tokens: acceptance {_pct(base['acceptance'])}, tau "
            f"{(base['tau'] or 0):.2f}, {(tps or 0):.1f} tok/s, TTFT {base['ttft_s'] * 1000:.0f} ms"
            + ("; nothing was drafted" if status == "warn" else "")
            + ("; no tokens came out" if status == "fail" else ""),
            k=k,
            **base,
        )

        say("context ladder")
        rungs = []
        room = backend.max_context - max_new - 16
        lengths = sorted(
            {min(r, room) for r in (options.ladder or default_ladder(backend.max_context)) if room > 0}
        )
        for length in lengths:
            run = _run(backend, ladder_prompt(backend, length), k, max_new)
            run.pop("token_ids")
            rungs.append({"context": length, **run})
        status, reason_text = ladder_verdict(rungs)
        report.add("context_ladder", status, reason_text, rungs=rungs)

        say("task types")
        from engine.benchmarks.runner import load_prompt_set

        tasks = {}
        for item in load_prompt_set("public"):
            task = item["category"]
            if task in tasks or task not in presets:
                continue
            preset = presets[task]
            task_ids = backend.encode_chat([{"role": "user", "content": item["prompt"]}])
            run = _run(
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
            f"{t} {_pct(r['acceptance'])} {(r['tokens_per_s'] or 0):.1f} tok/s" for t, r in tasks.items()
        )
        if empty:
            report.add("tasks", "fail", f"no reply for {', '.join(empty)} ({text})", tasks=tasks)
        else:
            report.add("tasks", "pass", text, tasks=tasks)
    except UserError as exc:
        report.add("baseline", "fail", f"generation failed: {' '.join(str(exc).split())}")
        backend.close()
        return report
    backend.close()

    say("restart")
    try:
        again, _, _, again_s = load_capturing_warnings(settings, progress)
        rerun = _run(again, _fixed_prompt_ids(again), k, max_new)
        again.close()
    except UserError as exc:
        report.add("restart", "fail", f"the second load failed: {' '.join(str(exc).split())}")
    else:
        same = rerun["token_ids"] == first_text
        details = {"seconds": again_s, "acceptance": rerun["acceptance"], "same_text": same}
        if same:
            report.add(
                "restart",
                "pass",
                f"second load in {again_s:.1f} s, same greedy text (acceptance {_pct(rerun['acceptance'])})",
                **details,
            )
        else:
            report.add(
                "restart",
                "fail",
                "the second load gave a different greedy text for the fixed prompt",
                **details,
            )

    say("baseline comparison")
    entry = {
        "timestamp": time.time(),
        "backend": info.backend,
        "cache_mode": info.cache_mode,
        "draft_mode": info.draft_mode,
        "k": k,
        "max_new_tokens": max_new,
        "acceptance": base["acceptance"],
        "drafted": base["drafted"],
        "tau": base["tau"],
        "tokens_per_s": base["tokens_per_s"],
        "ttft_s": base["ttft_s"],
    }
    path = data_dir / "doctor" / f"{report.fingerprint}.json"
    report.baseline_file = str(path)
    history = read_baselines(path)
    previous = next(
        (
            e
            for e in reversed(history)
            if all(
                e.get(key) == entry[key]
                for key in ("backend", "cache_mode", "draft_mode", "k", "max_new_tokens")
            )
        ),
        None,
    )
    status, reason_text = compare_baseline(previous, entry)
    report.add("regression", status, reason_text, previous=previous, now=entry)
    if options.force_save or (options.save_baseline and report.ok):
        history.append(entry)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(orjson.dumps(history, option=orjson.OPT_INDENT_2) + b"\n")
            report.baseline_saved = True
        except OSError as exc:
            report.add("regression", "warn", f"could not save the baseline to {path}: {exc.strerror or exc}")
    return report


def read_baselines(path: Path) -> list[dict[str, Any]]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def format_report(report: DoctorReport) -> str:
    width = max(len(c.name) for c in report.checks) if report.checks else 10
    lines = [f"{c.status.upper():<4}  {c.name:<{width}}  {c.reason}" for c in report.checks]
    failed = [c.name for c in report.checks if c.status == "fail"]
    lines.append("")
    lines.append("all checks passed" if not failed else f"failed: {', '.join(failed)}")
    if report.baseline_saved:
        lines.append(f"saved as the baseline for {report.fingerprint} ({report.baseline_file})")
    return "\n".join(lines)
