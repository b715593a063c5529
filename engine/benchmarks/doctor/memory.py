"""`specchat doctor`'s memory check: the memory plan (weights, KV cache, draft) against the free GPU memory, with
advice for 24 / 16 / 12 / 8 GB cards."""

from __future__ import annotations

import json
from pathlib import Path

from engine.backends.registry import resolve_cache_mode
from engine.benchmarks.doctor.report import DoctorReport

GPU_TIERS_GB = (24, 16, 12, 8)


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
