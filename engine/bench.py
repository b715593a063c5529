"""`specchat bench`: speculative vs plain decoding vs the transformers peer, side by side in one run.

Every prompt of the public set (bench/prompts.jsonl) is decoded at temperature 0 four ways, in rotating order
so that machine noise hits all of them alike (each variant's time is the best of its repeats: on a shared
machine the fastest run is the one least disturbed by others):
  ours-plain   our loop with drafting off
  ours-ngram   our loop with n-gram drafting (K from the prompt's preset)
  hf-plain     transformers' generate(do_sample=False)
  hf-lookup    transformers' generate(prompt_lookup_num_tokens=K)
Ratios are computed from the same run; nothing here is compared to a stored number.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from engine.backends.base import GenerationRequest, SamplerSettings
from engine.events import Chunk
from engine.speculation import AcceptanceAccounting

VARIANTS = ("ours-plain", "ours-ngram", "hf-plain", "hf-lookup")
TARGETS = {
    "ngram_vs_plain_total": 1.15,
    "ngram_vs_plain_each": 0.95,
    "ngram_vs_hf_lookup_total": 1.15,
    "plain_vs_hf_plain_total": 1.0,
}


@dataclass
class PromptResult:
    category: str
    prompt: str
    k: int
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    identical: bool = True

    def tps(self, variant: str) -> float:
        return self.tokens[variant] / min(self.seconds[variant])


def load_prompt_set(path: Path | None = None) -> list[dict[str, str]]:
    if path is None:
        text = (Path(__file__).resolve().parent.parent / "bench" / "prompts.jsonl").read_text(
            encoding="utf-8"
        )
    else:
        text = path.read_text(encoding="utf-8")
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def _builtin_k() -> dict[str, int]:
    from engine.presets import load_presets

    presets = load_presets(None)
    return {name: presets[name].k for name in ("code", "qa", "creative")}


def _ours(
    backend, prompt_ids: list[int], k: int, max_new: int
) -> tuple[list[int], float, AcceptanceAccounting]:
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
    )
    t0 = time.perf_counter()
    accounting = AcceptanceAccounting(t_start=t0)
    ids: list[int] = []
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            accounting.add(event)
            ids.extend(event.token_ids)
    return ids, time.perf_counter() - t0, accounting


def _peer(backend, prompt_ids: list[int], k: int, max_new: int) -> tuple[list[int], float]:
    import torch

    model = backend.model
    stop_ids = sorted(backend.stop_token_ids)
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    kwargs = dict(
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=stop_ids,
        pad_token_id=stop_ids[0],
        attention_mask=torch.ones_like(input_ids),
    )
    if k > 0:
        kwargs["prompt_lookup_num_tokens"] = k
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, **kwargs)
    seconds = time.perf_counter() - t0
    new = out[0, len(prompt_ids) :].tolist()
    # generate() includes the stop token in its output; our loop does not emit it.
    if new and new[-1] in stop_ids:
        new = new[:-1]
    return new, seconds


def run_bench(
    settings,
    quick: bool = False,
    out=sys.stdout,
    *,
    prompts: list[dict[str, str]] | None = None,
    max_new_tokens: int | None = None,
) -> dict:
    from engine.backends.hf import TransformersBackend
    from engine.models import ensure_embedded_model, print_progress

    model_dir = settings.model or ensure_embedded_model(print_progress)
    max_new = max_new_tokens or (96 if quick else 192)
    repeats = 2 if quick else 3
    backend = TransformersBackend(
        model_dir, draft="ngram", cache_mode="fp16", max_context=settings.max_context
    )
    backend.load(print_progress)
    prompts = prompts if prompts is not None else load_prompt_set()
    k_by_category = _builtin_k()
    print(
        f"specchat bench: {len(prompts)} prompts, temperature 0, max {max_new} new tokens, {repeats} repeat(s), "
        f"model {model_dir}",
        file=out,
    )
    results: list[PromptResult] = []
    for idx, item in enumerate(prompts):
        k = k_by_category.get(item["category"], 5)
        prompt_ids = backend.encode_chat([{"role": "user", "content": item["prompt"]}])
        res = PromptResult(item["category"], item["prompt"], k, seconds={v: [] for v in VARIANTS})
        _ours(backend, prompt_ids, 0, 8)  # warm-up: allocator, caches
        outputs: dict[str, list[int]] = {}
        for rep in range(repeats):
            order = VARIANTS[(idx + rep) % 4 :] + VARIANTS[: (idx + rep) % 4]
            for variant in order:
                if variant.startswith("ours"):
                    ids, secs, acc = _ours(backend, prompt_ids, k if variant == "ours-ngram" else 0, max_new)
                    if variant == "ours-ngram" and rep == 0:
                        res.drafted, res.accepted, res.rounds = (
                            acc.live.drafted,
                            acc.live.accepted,
                            acc.live.rounds,
                        )
                else:
                    ids, secs = _peer(backend, prompt_ids, k if variant == "hf-lookup" else 0, max_new)
                outputs[variant] = ids
                res.tokens[variant] = len(ids)
                res.seconds[variant].append(secs)
        res.identical = all(outputs[v] == outputs["hf-plain"] for v in VARIANTS)
        results.append(res)
        _print_row(out, idx, res)
    summary = _summarise(results)
    summary["kv_cache_bytes"] = _cache_memory(backend, positions=1024 if quick else 2048)
    _print_summary(out, summary)
    return summary


def _cache_memory(backend, positions: int) -> dict[str, int]:
    """Bytes of the KV cache after `positions` tokens: fp32 (what the CPU runs), fp16 and our int8 `q8` cache."""
    import torch

    from engine.kv_cache import SpecCache, full_precision_bytes

    ids = torch.arange(positions, dtype=torch.long).remainder(1000).add(100).unsqueeze(0)
    kwarg = backend.target.cache_kwarg
    sizes: dict[str, int] = {}
    for mode in ("fp16", "q8"):
        cache = SpecCache(mode)
        with torch.inference_mode():
            for start in range(0, positions, 256):
                backend.model(input_ids=ids[:, start : start + 256], **{kwarg: cache, "use_cache": True})
        if mode == "fp16":  # our full-precision cache holds the model's own dtype (fp32 on the CPU)
            sizes["fp32"] = full_precision_bytes(cache, torch.float32)
            sizes["fp16"] = full_precision_bytes(cache, torch.float16)
        else:
            sizes["q8"] = cache.storage_bytes()
    sizes["positions"] = positions
    return sizes


def _ratio(res: PromptResult, a: str, b: str) -> float:
    return res.tps(a) / res.tps(b)


def _print_row(out, idx: int, r: PromptResult) -> None:
    if idx == 0:
        print(
            f"{'#':>2} {'cat':<8} {'K':>2} {'tok':>4} {'plain':>7} {'ngram':>7} {'hf':>7} {'hf-look':>7} "
            f"{'ng/pl':>6} {'ng/hfl':>6} {'pl/hf':>6} {'accept':>7} {'tau':>5} same",
            file=out,
        )
    acc = f"{r.accepted / r.drafted:.0%}" if r.drafted else "-"
    tau = (r.tokens["ours-ngram"] / r.rounds) if r.rounds else 0.0
    print(
        f"{idx + 1:>2} {r.category:<8} {r.k:>2} {r.tokens['ours-ngram']:>4} {r.tps('ours-plain'):>7.1f} "
        f"{r.tps('ours-ngram'):>7.1f} {r.tps('hf-plain'):>7.1f} {r.tps('hf-lookup'):>7.1f} "
        f"{_ratio(r, 'ours-ngram', 'ours-plain'):>6.2f} {_ratio(r, 'ours-ngram', 'hf-lookup'):>6.2f} "
        f"{_ratio(r, 'ours-plain', 'hf-plain'):>6.2f} {acc:>7} {tau:>5.2f} {'yes' if r.identical else 'NO'}",
        file=out,
        flush=True,
    )


def _total_tps(results: list[PromptResult], variant: str) -> float:
    tokens = sum(r.tokens[variant] for r in results)
    seconds = sum(min(r.seconds[variant]) for r in results)
    return tokens / seconds


def _summarise(results: list[PromptResult]) -> dict:
    totals = {v: _total_tps(results, v) for v in VARIANTS}
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    rounds = sum(r.rounds for r in results)
    return {
        "tokens_per_s": totals,
        "ngram_vs_plain_total": totals["ours-ngram"] / totals["ours-plain"],
        "ngram_vs_plain_each_min": min(_ratio(r, "ours-ngram", "ours-plain") for r in results),
        "ngram_vs_hf_lookup_total": totals["ours-ngram"] / totals["hf-lookup"],
        "plain_vs_hf_plain_total": totals["ours-plain"] / totals["hf-plain"],
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": sum(r.tokens["ours-ngram"] for r in results) / rounds if rounds else None,
        "all_identical": all(r.identical for r in results),
        "prompts": [
            {
                "category": r.category,
                "k": r.k,
                "tokens": r.tokens,
                "tokens_per_s": {v: r.tps(v) for v in VARIANTS},
                "acceptance_rate": r.accepted / r.drafted if r.drafted else None,
            }
            for r in results
        ],
    }


def _print_summary(out, s: dict) -> None:
    t = s["tokens_per_s"]
    print(
        f"\ntotal tok/s: ours-plain {t['ours-plain']:.1f}  ours-ngram {t['ours-ngram']:.1f}  "
        f"hf-plain {t['hf-plain']:.1f}  hf-lookup {t['hf-lookup']:.1f}",
        file=out,
    )
    acc = s["acceptance_rate"]
    print(
        f"acceptance {acc:.0%}  mean accepted length {s['mean_accepted_length']:.2f}"
        if acc is not None
        else "acceptance -",
        file=out,
    )
    checks = [
        ("n-gram vs plain, whole set", s["ngram_vs_plain_total"], TARGETS["ngram_vs_plain_total"]),
        ("n-gram vs plain, worst prompt", s["ngram_vs_plain_each_min"], TARGETS["ngram_vs_plain_each"]),
        (
            "n-gram vs transformers prompt lookup",
            s["ngram_vs_hf_lookup_total"],
            TARGETS["ngram_vs_hf_lookup_total"],
        ),
        ("plain vs transformers plain", s["plain_vs_hf_plain_total"], TARGETS["plain_vs_hf_plain_total"]),
    ]
    for label, value, target in checks:
        verdict = "meets" if value >= target else "MISSES"
        print(f"{label:<40} {value:5.2f}x  (target >= {target:.2f}x: {verdict})", file=out)
    print(f"greedy outputs identical across all four: {'yes' if s['all_identical'] else 'NO'}", file=out)
    kv = s.get("kv_cache_bytes")
    if kv:
        mib = 2**20
        print(
            f"KV cache at {kv['positions']} tokens: fp32 {kv['fp32'] / mib:.1f} MiB, fp16 {kv['fp16'] / mib:.1f} MiB, "
            f"q8 {kv['q8'] / mib:.1f} MiB ({kv['fp32'] / kv['q8']:.2f}x smaller than fp32, "
            f"{kv['fp16'] / kv['q8']:.2f}x than fp16)",
            file=out,
        )
