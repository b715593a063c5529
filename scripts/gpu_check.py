"""GPU check: the real exllamav2 backend on the embedded SmolLM2, side by side (run by scripts/gpu_check.sh).

Loads the model with a Q8 cache three ways and asks each for the same greedy reply:
  (a) no drafting, (b) n-gram drafting, (c) a draft model (the same folder; its linear layers in Q4 when the
  installed exllamav2 supports `load_in_q4`, so the draft is cheaper and not a perfect copy), and (d) no drafting
  with an FP16 cache, for the Q8 cache's cost side by side.
With --random-from FOLDER (the offline check) the model is a random-weight one of FOLDER's shape.
Checks: the three replies are token-identical; live and final acceptance are reported where drafting is on;
K switches between two replies without rebuilding the generator (and the second reply reuses the prefix cache);
a cancel ends a reply with "cancelled" and leaves the generator idle. Prints one JSON summary with tokens/s of
each side by side and exits 1 when a check fails (2 when exllamav2 cannot run here at all).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.backends.exl2 import ExLlamaV2Backend, probe_exllamav2
from engine.decoding.acceptance import AcceptanceAccounting
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings

PROMPT = (
    "Copy this list exactly, then copy it once more: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, "
    "iota, kappa, lambda, mu."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: the embedded SmolLM2)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="draft length of the first reply")
    parser.add_argument("--k2", type=int, default=2, help="draft length after the switch")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--draft-fp16", action="store_true", help="load the draft model in FP16, not Q4")
    parser.add_argument(
        "--random-from",
        type=Path,
        default=None,
        help="build a random-weight model from this folder's config.json and tokenizer files (offline check)",
    )
    return parser.parse_args(argv)


RANDOM_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def random_model(source: Path, out: Path) -> Path:
    """A model of `source`'s shape with random FP16 weights (seed 0): speed does not depend on weight values."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(source)
    import transformers

    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_config(config, **{dtype_key: torch.float16})
    model.save_pretrained(out, safe_serialization=True)
    for name in RANDOM_MODEL_FILES[1:]:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out


def reply(
    backend: ExLlamaV2Backend, k: int, max_new_tokens: int, cancel_after: int | None = None
) -> dict[str, Any]:
    """One greedy reply; the chunks folded into live and final stats as the TUI would."""
    prompt = tuple(backend.encode_chat([{"role": "user", "content": PROMPT}]))
    request = GenerationRequest(
        prompt_ids=prompt,
        sampler=SamplerSettings(temperature=0.0, repetition_penalty=1.0),
        max_new_tokens=max_new_tokens,
        num_draft_tokens=k,
    )
    cancel = threading.Event()
    t_start = time.monotonic()
    accounting = AcceptanceAccounting(t_start=t_start)
    chunks: list[Chunk] = []
    live_rates: list[float] = []
    done: Done | None = None
    for event in backend.generate(request, cancel):
        if isinstance(event, Done):
            done = event
            break
        chunks.append(event)
        accounting.add(event)
        if accounting.live.acceptance_rate is not None:
            live_rates.append(accounting.live.acceptance_rate)
        if cancel_after is not None and len(chunks) >= cancel_after:
            cancel.set()
    assert done is not None, "generate() ended without Done"
    t_end = time.monotonic()
    stats = accounting.finish(
        done,
        t_end,
        preset="gpu-check",
        num_draft_tokens=k,
        temperature=0.0,
        draft_mode=backend.draft_mode,
        backend=backend.name,
        model=backend.model_dir.name,
        cache_mode=backend.cache_mode,
    )
    return {
        "tokens": [t for c in chunks for t in c.token_ids],
        "text": "".join(c.text for c in chunks),
        "chunks": chunks,
        "done": done,
        "stats": stats,
        "live_rates": live_rates,
    }


def summary_of(result: dict[str, Any], load_s: float) -> dict[str, Any]:
    stats, done = result["stats"], result["done"]
    return {
        "new_tokens": stats.new_tokens,
        "decode_tokens_per_s": round(stats.decode_tokens_per_s or 0.0, 1),
        "total_s": round(stats.total_s, 3),
        "acceptance_rate": None if stats.acceptance_rate is None else round(stats.acceptance_rate, 3),
        "mean_accepted_length": None
        if stats.mean_accepted_length is None
        else round(stats.mean_accepted_length, 3),
        "rounds": stats.rounds,
        "drafted": stats.drafted_tokens,
        "accepted": stats.accepted_tokens,
        "cost_ratio": None if stats.cost_ratio is None else round(stats.cost_ratio, 4),
        "stop_reason": done.stop_reason,
        "cached_tokens": done.cached_tokens,
        "load_s": round(load_s, 2),
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    usable, reason = probe_exllamav2()
    if not usable:
        print(json.dumps({"ok": False, "error": f"exllamav2 unusable: {reason}"}))
        return 2
    model_dir = args.model
    not_verified: list[str] = []
    if args.random_from is not None:
        model_dir = random_model(
            args.random_from, Path(args.model or args.random_from.parent / "random-model")
        )
        not_verified.append(
            "acceptance and speedup on real text: the weights are random (n-gram acceptance depends on the text; "
            "the model as its own draft should accept nearly everything)"
        )
        args.draft_fp16 = True  # Q4 of random weights says nothing; the draft is the same model in FP16
    elif model_dir is None:
        from engine.models import ensure_embedded_model, print_progress

        model_dir = ensure_embedded_model(print_progress)

    failures: list[str] = []
    summary: dict[str, Any] = {"probe": reason, "model": str(model_dir), "runs": {}}

    def check(condition: bool, message: str) -> None:
        if not condition:
            failures.append(message)

    setups = {
        "a_none": {"draft": "none"},
        "b_ngram": {"draft": "ngram"},
        "c_draft_model": {"draft": str(model_dir), "draft_load_in_q4": not args.draft_fp16},
        "d_none_fp16_cache": {"draft": "none", "cache_mode": "fp16"},  # the Q8 cache's cost, side by side
    }
    outputs: dict[str, list[int]] = {}
    for name, extra in setups.items():
        options = {"cache_mode": "q8", "draft_cache_mode": "q8", **extra}
        backend = ExLlamaV2Backend(
            model_dir, max_context=args.max_context, num_draft_tokens=args.k, **options
        )
        t0 = time.monotonic()
        try:
            backend.load()
        except BackendError as exc:
            failures.append(f"{name}: load failed: {exc}")
            continue
        load_s = time.monotonic() - t0
        try:
            k = 0 if extra.get("draft") == "none" else args.k
            first = reply(backend, k, args.max_new_tokens)
            outputs[name] = first["tokens"]
            run = summary_of(first, load_s)
            run["notes"] = list(backend.info.notes)
            run["paged"] = backend._m.paged if backend._m else None
            summary["runs"][name] = run
            check(first["stats"].new_tokens > 0, f"{name}: empty reply")
            run["cache_mode"] = backend.cache_mode
            if k:
                check(first["stats"].drafted_tokens > 0, f"{name}: nothing was drafted")
                check(bool(first["live_rates"]), f"{name}: no live acceptance while streaming")
                check(first["stats"].acceptance_rate is not None, f"{name}: no final acceptance rate")
            if name == "c_draft_model":
                check(first["stats"].accepted_tokens > 0, f"{name}: the draft (same model) never accepted")
                check(
                    first["done"].draft_step_s > 0 and first["done"].target_step_s > 0,
                    f"{name}: no step timing",
                )

            if k:
                # K switch between two replies: same generator object, resized draft buffer, prefix reused.
                generator = backend._m.generator
                second = reply(backend, args.k2, args.max_new_tokens)
                check(backend._m.generator is generator, f"{name}: generator rebuilt on K switch")
                check(generator.num_draft_tokens == args.k2, f"{name}: num_draft_tokens not switched")
                if name == "c_draft_model":
                    check(
                        tuple(generator.draft_ids_pinned.shape)[1] == args.k2,
                        f"{name}: draft buffer not resized ({tuple(generator.draft_ids_pinned.shape)})",
                    )
                check(
                    max((c.drafted for c in second["chunks"]), default=0) == args.k2,
                    f"{name}: second reply did not draft K={args.k2}",
                )
                check(second["done"].cached_tokens > 0, f"{name}: second reply reused no prefix cache")
                check(second["tokens"] == first["tokens"], f"{name}: reply changed after the K switch")
                run["after_k_switch"] = summary_of(second, 0.0)

                cancelled = reply(backend, args.k, args.max_new_tokens, cancel_after=2)
                check(cancelled["done"].stop_reason == "cancelled", f"{name}: cancel ignored")
                check(generator.num_remaining_jobs() == 0, f"{name}: cancelled job left in the generator")
        except BackendError as exc:
            failures.append(f"{name}: {exc}")
        finally:
            backend.close()

    baseline = outputs.get("a_none")
    for name in ("b_ngram", "c_draft_model"):
        if baseline is not None and name in outputs:
            diff = first_difference(baseline, outputs[name])
            check(diff is None, f"{name}: greedy output differs from no drafting at token {diff}")

    runs = summary["runs"]
    base_tps = runs.get("a_none", {}).get("decode_tokens_per_s") or 0.0
    summary["tokens_per_s_side_by_side"] = {name: run["decode_tokens_per_s"] for name, run in runs.items()}
    summary["acceptance_side_by_side"] = {name: run["acceptance_rate"] for name, run in runs.items()}
    summary["speedup_vs_no_drafting"] = {
        name: round(run["decode_tokens_per_s"] / base_tps, 3) if base_tps else None
        for name, run in runs.items()
    }
    if baseline is not None and "d_none_fp16_cache" in outputs:
        diff = first_difference(baseline, outputs["d_none_fp16_cache"])
        summary["q8_vs_fp16_cache_same_tokens_until"] = diff  # None: identical; not required to be
    if not any(run.get("paged") for run in runs.values()):
        not_verified.append("paged attention (flash-attn not installed): the unpaged generator was checked")
    not_verified.append("a prebuilt exllamav2 extension wheel: the check uses the one built on this machine")
    summary["not_verified"] = not_verified
    summary["failures"] = failures
    summary["ok"] = not failures
    print(json.dumps(summary, indent=2))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
