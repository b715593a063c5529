"""GPU check: the real exllamav2 and exllamav3 backends on the embedded SmolLM2, side by side (run by
scripts/gpu_check.sh).

For each engine, loads the model with a Q8 cache three ways and asks each for the same greedy reply:
  (a) no drafting, (b) n-gram drafting, (c) a draft model (the same folder; on exllamav2 its linear layers in Q4
  when the installed exllamav2 supports `load_in_q4`, so the draft is cheaper and not a perfect copy), and (d) no
  drafting with an FP16 cache, for the Q8 cache's cost side by side.
With --random-from FOLDER (the offline check) the model is a random-weight one of FOLDER's shape.
Checks: the three replies are token-identical; live and final acceptance are reported where drafting is on;
K switches between two replies without rebuilding the generator (and the second reply reuses the prefix cache);
a cancel ends a reply with "cancelled" and leaves the generator idle. exllamav3 adds its four open points: the reply
is exactly max_new_tokens long (1.6.5 stops there), the Chunks' counts add up to the job's accepted/rejected
counters, what drafting does after a reply at K = 0 (why the backend floors K at 1 with a draft model), and how
long the extension took to build or import. Prints one JSON summary (exllamav2's runs at the top level, exllamav3's
under "exllamav3") and exits 1 when a check fails (2 when exllamav2, or the engine asked for, cannot run here).

    --engine exllamav2|exllamav3|both   default: both where exllamav3 is installed, else exllamav2
    --dry-run                           print the steps and their expected times, run nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.backends import registry
from engine.backends.exllamav2 import ExLlamaV2Backend, probe_exllamav2
from engine.backends.exllamav3 import ExLlamaV3Backend, probe_exllamav3
from engine.decoding.acceptance import AcceptanceAccounting
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings

# The GPU engines of the registry (engine/backends/registry.py), in its order: the first one's runs are the JSON's
# top level, the others' each under its name.
GPU_ENGINES = tuple(row.name for row in registry.ENGINES if row.gpu)
PROMPT = (
    "Copy this list exactly, then copy it once more: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, "
    "iota, kappa, lambda, mu."
)
PROMPT_B = "Write the numbers from one to twenty in words, separated by commas."
PROMPT_C = "Write the days of the week and then the months of the year, separated by commas."


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
        "--engine",
        choices=[*GPU_ENGINES, "both"],
        default=None,
        help=f"engines to check; both: {' and '.join(GPU_ENGINES)} (default: {GPU_ENGINES[0]}, and the others "
        "where they are installed)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the steps and expected times; run nothing"
    )
    parser.add_argument(
        "--offline-bundle", action="store_true", help=argparse.SUPPRESS
    )  # set by gpu_check.sh
    parser.add_argument(
        "--prebuilt-ext", action="store_true", help=argparse.SUPPRESS
    )  # gpu_check.sh: the bundle carries the extensions
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
    backend: ExLlamaV2Backend | ExLlamaV3Backend,
    k: int,
    max_new_tokens: int,
    cancel_after: int | None = None,
    prompt_text: str = PROMPT,
    history: tuple[dict[str, str], ...] = (),
) -> dict[str, Any]:
    """One greedy reply; the chunks folded into live and final stats as the TUI would."""
    prompt = tuple(backend.encode_chat([*history, {"role": "user", "content": prompt_text}]))
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


def check_exllamav2(args: argparse.Namespace, model_dir: Path, reason: str, not_verified: list[str]):
    """exllamav2's runs and checks; (summary, failures)."""
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
    return summary, failures


def check_exllamav3(args: argparse.Namespace, model_dir: Path, reason: str, not_verified: list[str]):
    """exllamav3's runs, checks and open points; (summary, failures)."""
    failures: list[str] = []
    summary: dict[str, Any] = {"probe": reason, "runs": {}}

    def check(condition: bool, message: str) -> None:
        if not condition:
            failures.append(message)

    setups = {
        "a_none": {"draft": "none"},
        "b_ngram": {"draft": "ngram"},
        "c_draft_model": {
            "draft": str(model_dir)
        },  # the model as its own draft: every draft should be accepted
        "d_none_fp16_cache": {"draft": "none", "cache_mode": "fp16"},
    }
    from engine.backends.exllamav3 import has_mtp_head

    if has_mtp_head(model_dir):
        setups["e_mtp"] = {"draft": "mtp"}
    else:
        not_verified.append(
            "exllamav3's MTP head: the check's model has none (a Qwen3.5/3.6 EXL3 folder does)"
        )
    outputs: dict[str, list[int]] = {}
    for name, extra in setups.items():
        options = {"cache_mode": "q8", "draft_cache_mode": "q8", **extra}
        backend = ExLlamaV3Backend(
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
            run["notes"] = list(backend.info.notes) + list(first["done"].notes)
            run["cache_mode"] = backend.cache_mode
            summary["runs"][name] = run
            generator = backend._m.generator
            # Open point 1, the reply's length: 1.6.5 stops exactly at max_new_tokens (no +K as on exllamav2).
            n = first["stats"].new_tokens
            check(n > 0, f"{name}: empty reply")
            if first["done"].stop_reason == "max_new_tokens":
                check(n == args.max_new_tokens, f"{name}: reply is {n} tokens, asked {args.max_new_tokens}")
            run["reply_length"] = {"asked": args.max_new_tokens, "got": n, "stop": first["done"].stop_reason}
            if k:
                check(first["stats"].drafted_tokens > 0, f"{name}: nothing was drafted")
                check(bool(first["live_rates"]), f"{name}: no live acceptance while streaming")
                # Open point 3, counters adding up: the Chunks against the job's own counters.
                counted = counters_of(backend, first)
                run["counters"] = counted
                check(
                    counted["accepted_match"],
                    f"{name}: Chunk accepted != job.accepted_draft_tokens {counted}",
                )
                check(
                    counted["drafted_gap_ok"],
                    f"{name}: Chunk drafted vs job counters off by more than K {counted}",
                )
            if name == "c_draft_model":
                check(first["stats"].accepted_tokens > 0, f"{name}: the draft (same model) never accepted")
            if k:
                second = reply(backend, args.k2, args.max_new_tokens)
                check(backend._m.generator is generator, f"{name}: generator rebuilt on K switch")
                check(generator.num_draft_tokens == args.k2, f"{name}: num_draft_tokens not switched")
                check(
                    max((c.drafted for c in second["chunks"]), default=0) <= args.k2,
                    f"{name}: second reply drafted more than K={args.k2}",
                )
                check(second["done"].cached_tokens > 0, f"{name}: second reply reused no prefix cache")
                check(second["tokens"] == first["tokens"], f"{name}: reply changed after the K switch")
                run["after_k_switch"] = summary_of(second, 0.0)
                cancelled = reply(backend, args.k, args.max_new_tokens, cancel_after=2)
                check(cancelled["done"].stop_reason == "cancelled", f"{name}: cancel ignored")
                check(generator.num_remaining_jobs() == 0, f"{name}: cancelled job left in the generator")
            if name == "c_draft_model":
                # Open point 2: drafting after a reply at K = 0 (the backend floors K at 1; this bypasses it).
                summary["drafting_after_k0"] = drafting_after_k0(backend, args)
        except BackendError as exc:
            failures.append(f"{name}: {exc}")
        finally:
            backend.close()

    baseline = outputs.get("a_none")
    for name in ("b_ngram", "c_draft_model", "e_mtp"):
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
        summary["q8_vs_fp16_cache_same_tokens_until"] = first_difference(
            baseline, outputs["d_none_fp16_cache"]
        )
    return summary, failures


def counters_of(backend: ExLlamaV3Backend, result: dict[str, Any]) -> dict[str, Any]:
    """The reply's Chunks against its job's own counters (the backend keeps the last job's)."""
    chunks = result["chunks"]
    accepted = sum(c.accepted for c in chunks)
    drafted = sum(c.drafted for c in chunks)
    job_accepted, job_rejected = backend.last_job_counters
    gap = job_accepted + job_rejected - drafted
    k = max((c.k or 0 for c in chunks), default=0)
    return {
        "chunk_accepted": accepted,
        "chunk_drafted": drafted,
        "job_accepted": job_accepted,
        "job_rejected": job_rejected,
        "accepted_match": accepted == job_accepted,
        # A round whose only sample is the stop token drafted K (1.6.5 counts them rejected) and has no Chunk.
        "drafted_gap_ok": 0 <= gap <= k,
    }


def drafting_after_k0(backend: ExLlamaV3Backend, args: argparse.Namespace) -> dict[str, Any]:
    """Acceptance of a follow-up reply after a first reply at K 4 and after one at K 0 (the draft skipped).

    The follow-up's prompt holds the first reply, so its pages come from the prefix cache: after K 0 the draft
    cache has nothing for them. Measured, not asserted: it says whether the floor at K 1 is needed."""
    results: dict[str, Any] = {}
    for label, first_k, text in (("after_k4", args.k, PROMPT_B), ("after_k0", 0, PROMPT_C)):
        if first_k == 0:  # bypass the floor: a whole reply with no draft forward
            backend._m.generator.num_draft_tokens = 0
            first = raw_greedy_reply(backend, text, args.max_new_tokens // 2)
        else:
            first = reply(backend, first_k, args.max_new_tokens // 2, prompt_text=text)
        history = ({"role": "user", "content": text}, {"role": "assistant", "content": first["text"]})
        follow = reply(
            backend, args.k, args.max_new_tokens, prompt_text="Once more, the same.", history=history
        )
        stats = follow["stats"]
        results[label] = {
            "acceptance_rate": None if stats.acceptance_rate is None else round(stats.acceptance_rate, 3),
            "cached_tokens": follow["done"].cached_tokens,
        }
    a, b = results["after_k4"]["acceptance_rate"], results["after_k0"]["acceptance_rate"]
    results["degraded"] = None if a is None or b is None else b < a - 0.1
    return results


def raw_greedy_reply(backend: ExLlamaV3Backend, text: str, max_new_tokens: int) -> dict[str, Any]:
    """One greedy reply driven on the generator itself, at whatever num_draft_tokens it holds."""
    import torch

    from engine.backends.exllamav3.sampling import build_sampler

    ex, m = backend._ex, backend._m
    ids = backend.encode_chat([{"role": "user", "content": text}])
    job = ex.Job(
        input_ids=torch.tensor([ids], dtype=torch.long),
        max_new_tokens=max_new_tokens,
        sampler=build_sampler(ex.ComboSampler, SamplerSettings(temperature=0.0), 0.0),
        stop_conditions=[t for t in (m.eos_id, m.end_of_turn_id) if t is not None],
    )
    m.generator.enqueue(job)
    tokens: list[int] = []
    while m.generator.num_remaining_jobs():
        for r in m.generator.iterate():
            if r.get("job") is job and r.get("token_ids") is not None:
                tokens.extend(int(t) for t in r["token_ids"].view(-1).tolist())
    return {"tokens": tokens, "text": backend.decode(tokens)}


# Expected seconds per step on the device (one H200, 16 cores): estimates from the sizes involved, not measurements
# (no GPU was lent when they were written); the check's JSON reports the real figures (load_s, import_s).
EXPECTED_S = {
    "install": 20,
    "exllamav2_import_prebuilt": 5,
    "exllamav2_build": 240,  # ~50 C++/CUDA files, MAX_JOBS=16
    "exllamav3_import_prebuilt": 10,
    "exllamav3_build": 900,  # ~194 C++/CUDA files, MAX_JOBS=16: longer than one run's budget
    "random_model": 15,
    "setup": 12,  # one load of the 135M model and its 1-3 replies of 128 tokens
    "k0_experiment": 8,
}
SETUP_NAMES = ("a_none", "b_ngram", "c_draft_model", "d_none_fp16_cache")


def chosen_engines(args: argparse.Namespace) -> list[str]:
    if args.engine == "both":
        return list(GPU_ENGINES)
    if args.engine:
        return [args.engine]
    if args.dry_run:  # gpu_check.sh installs exllamav3 before the real run: the dry run shows what that runs
        return list(GPU_ENGINES)
    import importlib.util

    # The first always (where it cannot run, the check says so and exits 2); the others where they are installed.
    rows = [registry.engine(name) for name in GPU_ENGINES]
    return [
        row.name
        for row in rows
        if row is rows[0] or (row.distribution and importlib.util.find_spec(row.distribution))
    ]


def dry_run_steps(args: argparse.Namespace, engines: list[str]) -> list[tuple[str, int]]:
    """(what, expected seconds) of every step the check would run."""
    import importlib.util

    steps: list[tuple[str, int]] = []
    if args.offline_bundle:
        steps.append(
            (
                "install the bundle's wheels into a private target (no index, no network)",
                EXPECTED_S["install"],
            )
        )
    for engine in engines:
        ext = f"{engine}_ext"
        prebuilt = args.prebuilt_ext or importlib.util.find_spec(ext) is not None
        if prebuilt:
            steps.append(
                (f"import {engine} with the prebuilt {ext} (sm_90)", EXPECTED_S[f"{engine}_import_prebuilt"])
            )
        else:
            steps.append(
                (
                    f"build {ext} with torch's JIT loader, then import (time for 16 cores; MAX_JOBS={args.jobs} here)",
                    EXPECTED_S[f"{engine}_build"],
                )
            )
    if args.random_from is not None:
        steps.append(
            (
                f"random-weight model of {args.random_from}'s shape (FP16 safetensors, seed 0)",
                EXPECTED_S["random_model"],
            )
        )
    else:
        steps.append(
            (
                "fetch the embedded SmolLM2-135M-Instruct (cached after the first run)",
                EXPECTED_S["random_model"],
            )
        )
    for engine in engines:
        for name in SETUP_NAMES:
            what = {
                "a_none": "no drafting, q8 cache",
                "b_ngram": f"n-gram drafting K={args.k} then K={args.k2}, cancel",
                "c_draft_model": f"the model as its own draft K={args.k} then K={args.k2}, cancel, q8/q8",
                "d_none_fp16_cache": "no drafting, fp16 cache",
            }[name]
            steps.append(
                (
                    f"{engine} {name}: load, greedy reply of {args.max_new_tokens} tokens; {what}",
                    EXPECTED_S["setup"],
                )
            )
        if engine == "exllamav3":
            steps.append(
                (
                    "exllamav3: drafting after a reply at K 0 vs after one at K 4 (follow-up acceptance)",
                    EXPECTED_S["k0_experiment"],
                )
            )
            steps.append(
                (
                    "exllamav3 checks: spec == plain greedy, reply length exact, counters add up, live counters",
                    0,
                )
            )
        else:
            steps.append(
                (
                    "exllamav2 checks: spec == plain greedy, K switch resizes the draft buffer, live counters",
                    0,
                )
            )
    return steps


def dry_run(args: argparse.Namespace, engines: list[str]) -> int:
    steps = dry_run_steps(args, engines)
    print(f"gpu-check dry run: engines {', '.join(engines)}; nothing is run")
    total = 0
    for i, (what, seconds) in enumerate(steps, 1):
        total += seconds
        print(f"  {i:2d}. {what}" + (f"  ~{seconds} s" if seconds else ""))
    print(f"  expected total ~{total} s ({total / 60:.1f} min; estimates, the JSON reports the real times)")
    if total > 360:
        print(
            "  over the 6-minute budget: build the extensions ahead (make gpu-bundle with --build-ext), or run"
        )
        print("  twice on one warm machine (the first run builds, the second checks)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    engines = chosen_engines(args)
    if args.dry_run:
        return dry_run(args, engines)
    reason = "not checked"
    if "exllamav2" in engines:
        usable, reason = probe_exllamav2()
        if not usable:
            print(json.dumps({"ok": False, "error": f"exllamav2 unusable: {reason}"}))
            return 2
    reason3 = None
    import_s = None
    if "exllamav3" in engines:
        t0 = time.monotonic()
        from engine.models import print_progress

        usable3, reason3 = probe_exllamav3(print_progress)  # open point 4: the build (or import) time
        import_s = time.monotonic() - t0
        if not usable3 and engines == ["exllamav3"]:
            print(json.dumps({"ok": False, "error": f"exllamav3 unusable: {reason3}"}))
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

    summary: dict[str, Any] = {"probe": reason, "model": str(model_dir), "runs": {}}
    failures: list[str] = []
    if "exllamav2" in engines:
        summary, failures = check_exllamav2(args, model_dir, reason, not_verified)
    if "exllamav3" in engines:
        if usable3:
            summary3, failures3 = check_exllamav3(args, model_dir, reason3, not_verified)
        else:
            summary3, failures3 = {"probe": reason3, "runs": {}}, [f"unusable: {reason3}"]
        summary3["import_s"] = None if import_s is None else round(import_s, 1)
        summary["exllamav3"] = summary3
        failures += [f"exllamav3 {f}" for f in failures3]
    summary["not_verified"] = not_verified
    summary["failures"] = failures
    summary["ok"] = not failures
    print(json.dumps(summary, indent=2))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
