"""`specchat plan`: the memory plan (weights + KV cache + draft) against a GPU budget, with tier advice."""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.cli.common import CliError, add_model_flags, cli_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--budget-gb", type=float, help="GPU memory to plan against, in GiB (e.g. 24)")
    parser.add_argument(
        "--bpw", type=float, help="bits per weight of a quantized model (e.g. 4.0 for EXL2 4bpw)"
    )


def run(args: argparse.Namespace) -> int:
    import json

    from engine.backends.registry import resolve_cache_mode
    from engine.memory_plan import MemoryPlanError, format_bytes, plan_memory
    from engine.models import ensure_embedded_model, validate_model_folder

    settings = cli_settings(args)
    gguf_bits: dict[str, float] = {}

    def read_config(path: Path) -> dict:
        if path.suffix.lower() == ".gguf":  # a llama.cpp model: its shape and bits per weight from the file
            from engine.models import gguf_config

            config, gguf_bits[str(path)] = gguf_config(path)
            return config
        return json.loads((validate_model_folder(path) / "config.json").read_text(encoding="utf-8"))

    model_dir = Path(settings.model) if settings.model else validate_model_folder(ensure_embedded_model())
    draft_config = None
    from engine.decoding.drafters import is_draft_keyword

    if not is_draft_keyword(settings.draft):
        draft_config = read_config(Path(settings.draft))
    if args.budget_gb is not None and args.budget_gb <= 0:
        raise CliError(f"--budget-gb must be positive (got {args.budget_gb})")
    budget = int(args.budget_gb * 2**30) if args.budget_gb else None
    try:
        plan = plan_memory(
            read_config(model_dir),
            resolve_cache_mode(settings.cache_mode, "exllamav2"),
            settings.max_context,
            draft_config,
            resolve_cache_mode(settings.draft_cache_mode, "exllamav2"),
            budget_bytes=budget,
            bits_per_weight=args.bpw or gguf_bits.get(str(model_dir)),
            draft_bits_per_weight=gguf_bits.get(str(settings.draft)),
        )
    except MemoryPlanError as exc:
        raise CliError(str(exc)) from exc
    print(f"model          {model_dir}")
    print(f"weights        {format_bytes(plan.weights_bytes)}")
    print(
        f"KV cache       {format_bytes(plan.kv_cache_bytes)}  ({plan.cache_mode}, {plan.max_context} tokens)"
    )
    if draft_config is not None:
        print(f"draft weights  {format_bytes(plan.draft_weights_bytes)}")
        print(f"draft KV cache {format_bytes(plan.draft_kv_cache_bytes)}  ({plan.draft_cache_mode})")
    print(f"total          {format_bytes(plan.total_bytes)}")
    if plan.headroom_bytes is not None:
        verdict = "fits" if plan.fits else "does NOT fit"
        print(
            f"budget         {format_bytes(plan.budget_bytes)}: {verdict}, headroom {format_bytes(plan.headroom_bytes)}"
        )
    if plan.advice:
        print(f"advice         {plan.advice}")
    return 0
