"""`specchat bench`: speculative vs plain decoding vs the transformers peer, side by side in one run.

It runs the configuration a user gets: the settings' cache mode (default `auto`: full precision on the
transformers backend), each prompt's preset K, and for the sampled runs each preset's own sampler (temperature,
ramp, top-p ...) with a fixed seed. Every prompt is decoded these ways, in rotating order so that machine noise
hits all of them alike (each variant's time is the best of its repeats: on a shared machine the fastest run is
the one least disturbed by others):
  ours-plain    our loop, drafting off, greedy
  ours-ngram    our loop, n-gram drafting with adaptive K up to the preset's K (what the built-ins do), greedy
  fixed-2 / fixed-5 / fixed-8 / fixed-preset   our loop, n-gram drafting with a fixed K (2, 5, 8, the preset's):
                the adaptive K's yardstick (each keeps its own acceptance estimates, apart from the adaptive one's)
  hf-plain      transformers' generate(do_sample=False), on a stock copy of the model
  hf-lookup     transformers' generate(prompt_lookup_num_tokens=K), same copy
  plain-sampled / ngram-sampled   our loop with the preset's sampler and seed, without and with drafting
Ratios are computed from the same run; nothing here is compared to a stored number. Two prompt sets ship:
`public` (engine/benchmarks/prompts.jsonl, the one the drafter's priors were measured on) and `heldout`
(engine/benchmarks/prompts_heldout.jsonl, never used to tune anything): report the held-out figures.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from engine.benchmarks.runner import chat_presets, load_prompt_set, timed_reply
from engine.decoding.acceptance import AcceptanceAccounting
from engine.events import Done, fmt, percent

GREEDY_VARIANTS = ("ours-plain", "ours-ngram", "hf-plain", "hf-lookup")
FIXED_KS = (2, 5, 8)
K_VARIANTS = tuple(f"fixed-{k}" for k in FIXED_KS) + ("fixed-preset",)
SAMPLED_VARIANTS = ("plain-sampled", "ngram-sampled")
VARIANTS = GREEDY_VARIANTS + K_VARIANTS + SAMPLED_VARIANTS
TARGETS = {
    "ngram_vs_plain_total": 1.15,
    "ngram_vs_plain_each": 0.95,
    "ngram_vs_hf_lookup_total": 1.15,
    "plain_vs_hf_plain_total": 1.0,
    "adaptive_vs_best_fixed_total": 0.97,
    "adaptive_vs_preset_fixed_total": 1.0,
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
    predicted_speedup: float | None = None
    identical: bool = True  # greedy: ours-plain == ours-ngram == hf-plain == hf-lookup
    matches_peer: bool = True  # ours-plain == hf-plain
    sampled_identical: bool = True  # plain-sampled == ngram-sampled

    def tps(self, variant: str) -> float:
        """Tokens per second (best run); nan for a variant that was not run."""
        if variant not in self.tokens:
            return float("nan")
        return self.tokens[variant] / min(self.seconds[variant])


def _peer(model, stop_ids: list[int], prompt_ids: list[int], k: int, max_new: int) -> tuple[list[int], float]:
    import torch

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


def _predicted(accounting: AcceptanceAccounting, done: Done | None) -> float | None:
    live = accounting.live
    if done is None or not done.round_cost or not live.rounds:
        return None
    return (live.new_tokens / live.rounds) / done.round_cost


@dataclass
class _BenchRun:
    """What one `specchat bench` run holds while it times its prompts."""

    backend: Any
    peer: Any  # transformers' stock copy of the model (None without peers)
    stop_ids: list[int]
    variants: tuple[str, ...]
    max_new: int
    repeats: int
    costs: Any  # the verify cost model load measured (None where it measured none)


def run_bench(
    settings,
    quick: bool = False,
    out=sys.stdout,
    *,
    prompts: list[dict[str, str]] | None = None,
    prompt_set: str | None = None,
    max_new_tokens: int | None = None,
    sampled: bool = True,
    cache_speed: bool = True,
    cache_context: int | None = None,
    k_sweep: bool = True,
    peers: bool = True,
) -> dict:
    """`peers=False` leaves transformers' own generate() out (a shorter run for the adaptive-K comparison)."""
    from engine.models import ensure_embedded_model, print_progress

    model_dir = settings.model or ensure_embedded_model(print_progress)
    max_new = max_new_tokens or (96 if quick else 192)
    run = _load(settings, model_dir, max_new, 2 if quick else 3, _variants(sampled, k_sweep, peers), peers)
    prompts = prompts if prompts is not None else load_prompt_set(prompt_set)
    presets = chat_presets()
    print(
        f"specchat bench: {len(prompts)} prompts ({prompt_set or 'given'}), max {max_new} new tokens, "
        f"{run.repeats} repeat(s), cache {run.backend.info.cache_mode}, model {model_dir}",
        file=out,
    )
    if run.costs is not None:
        curve = " ".join(f"r({w})={r:.2f}" for w, r in run.costs.as_dict().items())
        print(f"verify cost at load (plain step = 1): {curve}", file=out)
    results: list[PromptResult] = []
    for idx, item in enumerate(prompts):
        res = _run_prompt(run, idx, item, presets.get(item["category"]) or presets["qa"], sampled, peers)
        results.append(res)
        _print_row(out, idx, res, sampled, k_sweep)
    summary = _summarise(results, sampled, k_sweep, peers)
    if run.costs is not None:
        summary["verify_cost"] = run.costs.as_dict()
    summary["kv_cache_bytes"] = _cache_memory(run.backend, positions=1024 if quick else 2048)
    if cache_speed:
        summary["cache_speed"] = _cache_speed(model_dir, run.backend, context=cache_context or 2048)
    _print_summary(out, summary)
    return summary


def _load(
    settings, model_dir, max_new: int, repeats: int, variants: tuple[str, ...], peers: bool
) -> _BenchRun:
    """Our backend as the settings ask, with n-gram drafting, and (with `peers`) transformers' stock copy."""
    from transformers import AutoModelForCausalLM

    from engine.backends.transformers import TransformersBackend
    from engine.models import progress_printer

    backend = TransformersBackend(
        model_dir,
        draft="ngram",
        cache_mode=settings.cache_mode,
        max_context=settings.max_context,
    )
    backend.load(progress_printer(settings.model))
    # stock kernels
    peer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=backend.dtype).eval() if peers else None
    stop_ids = sorted(backend.stop_token_ids)
    return _BenchRun(backend, peer, stop_ids, variants, max_new, repeats, backend.target.costs)


def _run_prompt(run: _BenchRun, idx: int, item: dict, preset, sampled: bool, peers: bool) -> PromptResult:
    """One prompt, every variant `repeats` times in an order that rotates with the prompt and the repeat (the
    sampled ones once); then whether their outputs agree."""
    sampler = preset.sampler()
    prompt_ids = run.backend.encode_chat([{"role": "user", "content": item["prompt"]}])
    res = PromptResult(item["category"], item["prompt"], preset.k, seconds={v: [] for v in run.variants})
    timed_reply(run.backend, prompt_ids, 0, 8)  # warm-up: allocator, caches
    outputs: dict[str, list[int]] = {}
    variants = run.variants
    for rep in range(run.repeats):
        shift = (idx + rep) % len(variants)
        order = variants[shift:] + variants[:shift]
        for variant in order:
            if variant in SAMPLED_VARIANTS and rep > 0:
                continue  # one sampled run each: they check exactness and give a ratio
            ids, secs = _run_variant(run, variant, rep, res, preset, sampler, prompt_ids)
            outputs[variant] = ids
            res.tokens[variant] = max(len(ids), 1)
            res.seconds[variant].append(secs)
    reference = outputs["hf-plain" if peers else "ours-plain"]
    res.identical = all(outputs[v] == reference for v in variants if v not in SAMPLED_VARIANTS)
    res.matches_peer = outputs["ours-plain"] == reference
    if sampled:
        res.sampled_identical = outputs["plain-sampled"] == outputs["ngram-sampled"]
    return res


def _run_variant(
    run: _BenchRun, variant: str, rep: int, res: PromptResult, preset, sampler, prompt_ids: list[int]
) -> tuple[list[int], float]:
    """One timed reply of `variant`: its tokens and seconds (ours-ngram's first run also fills the drafts)."""
    k, max_new = preset.k, run.max_new
    if variant.startswith("hf-"):
        return _peer(run.peer, run.stop_ids, prompt_ids, k if variant == "hf-lookup" else 0, max_new)
    if variant in K_VARIANTS:
        fixed_k = k if variant == "fixed-preset" else int(variant.removeprefix("fixed-"))
        # Its own estimates: what fixed runs learn must not help the adaptive one.
        key = f"{variant}:{preset.name}"
        ids, secs, _, _ = timed_reply(run.backend, prompt_ids, fixed_k, max_new, None, "fixed", key)
        return ids, secs
    drafting = variant in ("ours-ngram", "ngram-sampled")
    ids, secs, acc, done = timed_reply(
        run.backend,
        prompt_ids,
        k if drafting else 0,
        max_new,
        sampler if variant in SAMPLED_VARIANTS else None,
        "adaptive",
        preset.name,
    )
    if variant == "ours-ngram" and rep == 0:
        res.drafted, res.accepted, res.rounds = (
            acc.live.drafted,
            acc.live.accepted,
            acc.live.rounds,
        )
        res.predicted_speedup = _predicted(acc, done)
    return ids, secs


def _cache_speed(model_dir, reference, context: int, new_tokens: int = 24) -> dict[str, float]:
    """Plain decode tokens/s after `context` tokens, full-precision cache vs q8, side by side (best of 2)."""
    from engine.backends.transformers import TransformersBackend

    text_ids = reference.encode_chat([{"role": "user", "content": load_prompt_set()[0]["prompt"]}])
    prompt = (text_ids * (context // len(text_ids) + 1))[:context]
    backends = {}
    for mode in ("fp16", "q8"):
        backends[mode] = TransformersBackend(
            model_dir, draft="none", cache_mode=mode, max_context=context + new_tokens + 16
        )
        backends[mode].load()
    best: dict[str, float] = {}
    for _ in range(2):
        for mode, backend in backends.items():
            backend.target.new_cache()  # a fresh prefill each time: no prefix reuse between the two
            _, _, acc, _ = timed_reply(backend, prompt, 0, new_tokens)
            span = (acc.t_last or 0.0) - (acc.t_first or 0.0)
            tps = (acc.live.new_tokens - acc.first_chunk_tokens) / span if span > 0 else 0.0
            best[mode] = max(best.get(mode, 0.0), tps)
    for backend in backends.values():
        backend.close()
    return {
        "context": context,
        "full": best["fp16"],
        "q8": best["q8"],
        "q8_vs_full": best["q8"] / best["fp16"],
    }


def _cache_memory(backend, positions: int) -> dict[str, int]:
    """Bytes of the KV cache after `positions` tokens: fp32 (what the CPU runs), fp16 and our int8 `q8` cache."""
    import torch

    from engine.backends.transformers.cache import SpecCache, full_precision_bytes

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


def _variants(sampled: bool, k_sweep: bool, peers: bool = True) -> tuple[str, ...]:
    return tuple(
        v
        for v in VARIANTS
        if (sampled or v not in SAMPLED_VARIANTS)
        and (k_sweep or v not in K_VARIANTS)
        and (peers or not v.startswith("hf-"))
    )


def _print_row(out, idx: int, r: PromptResult, sampled: bool, k_sweep: bool = False) -> None:
    if idx == 0:
        header = (
            f"{'#':>2} {'cat':<8} {'K':>2} {'tok':>4} {'plain':>6} {'ngram':>6} {'hf':>6} {'hf-lk':>6} "
            f"{'ng/pl':>6} {'pred':>5} {'ng/hfl':>6} {'pl/hf':>6} {'accept':>6} {'tau':>5} same"
        )
        if sampled:
            header += "  smp-ng/pl smp-same"
        if k_sweep:
            header += "  " + " ".join(f"{'K' + str(k):>6}" for k in FIXED_KS) + f" {'Kfix':>6}"
        print(header, file=out)
    acc = percent(r.accepted / r.drafted if r.drafted else None)
    tau = fmt(r.tokens["ours-ngram"] / r.rounds if r.rounds else None, "{:.2f}")  # no rounds: nothing ran
    pred = fmt(r.predicted_speedup, "{:.2f}")
    line = (
        f"{idx + 1:>2} {r.category:<8} {r.k:>2} {r.tokens['ours-ngram']:>4} {r.tps('ours-plain'):>6.1f} "
        f"{r.tps('ours-ngram'):>6.1f} {r.tps('hf-plain'):>6.1f} {r.tps('hf-lookup'):>6.1f} "
        f"{_ratio(r, 'ours-ngram', 'ours-plain'):>6.2f} {pred:>5} {_ratio(r, 'ours-ngram', 'hf-lookup'):>6.2f} "
        f"{_ratio(r, 'ours-plain', 'hf-plain'):>6.2f} {acc:>6} {tau:>5} {'yes' if r.identical else 'NO'}"
    )
    if sampled:
        line += f"  {_ratio(r, 'ngram-sampled', 'plain-sampled'):>9.2f} {'yes' if r.sampled_identical else 'NO':>8}"
    if k_sweep:  # fixed-K tok/s beside the adaptive "ngram" column
        line += "  " + " ".join(f"{r.tps(v):>6.1f}" for v in K_VARIANTS)
    print(line, file=out, flush=True)


def _total_tps(results: list[PromptResult], variant: str) -> float:
    tokens = sum(r.tokens[variant] for r in results)
    seconds = sum(min(r.seconds[variant]) for r in results)
    return tokens / seconds


def _summarise(results: list[PromptResult], sampled: bool, k_sweep: bool = False, peers: bool = True) -> dict:
    variants = _variants(sampled, k_sweep, peers)
    totals = {v: _total_tps(results, v) for v in variants}
    for v in ("hf-plain", "hf-lookup"):
        totals.setdefault(v, float("nan"))  # not run
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    rounds = sum(r.rounds for r in results)
    summary = {
        "tokens_per_s": totals,
        "ngram_vs_plain_total": totals["ours-ngram"] / totals["ours-plain"],
        "ngram_vs_plain_each_min": min(_ratio(r, "ours-ngram", "ours-plain") for r in results),
        "ngram_vs_hf_lookup_total": totals["ours-ngram"] / totals["hf-lookup"],
        "plain_vs_hf_plain_total": totals["ours-plain"] / totals["hf-plain"],
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": sum(r.tokens["ours-ngram"] for r in results) / rounds if rounds else None,
        "all_identical": all(r.identical for r in results),
        "identical_count": sum(r.identical for r in results),
        "matches_peer_count": sum(r.matches_peer for r in results),
        "prompts": [
            {
                "category": r.category,
                "k": r.k,
                "tokens": r.tokens,
                "tokens_per_s": {v: r.tps(v) for v in variants},
                "ngram_vs_plain": _ratio(r, "ours-ngram", "ours-plain"),
                "predicted_speedup": r.predicted_speedup,
                "acceptance_rate": r.accepted / r.drafted if r.drafted else None,
                "identical": r.identical,
                "sampled_identical": r.sampled_identical,
            }
            for r in results
        ],
    }
    if k_sweep:
        best = max(FIXED_KS, key=lambda k: totals[f"fixed-{k}"])
        summary["best_fixed_k"] = best
        summary["adaptive_vs_fixed_total"] = {v: totals["ours-ngram"] / totals[v] for v in K_VARIANTS}
        summary["adaptive_vs_best_fixed_total"] = totals["ours-ngram"] / totals[f"fixed-{best}"]
        summary["adaptive_vs_preset_fixed_total"] = totals["ours-ngram"] / totals["fixed-preset"]
    if sampled:
        summary["sampled_ngram_vs_plain_total"] = totals["ngram-sampled"] / totals["plain-sampled"]
        summary["sampled_identical_count"] = sum(r.sampled_identical for r in results)
    return summary


def _print_summary(out, s: dict) -> None:
    """Totals and acceptance, each ratio against its target, the exactness counts, then the cache's figures."""
    t = s["tokens_per_s"]
    print("\ntotal tok/s: " + "  ".join(f"{v} {tps:.1f}" for v, tps in t.items()), file=out)
    acc = s["acceptance_rate"]
    print(
        f"acceptance {acc:.0%}  mean accepted length {s['mean_accepted_length']:.2f}"
        if acc is not None
        else "acceptance - (nothing drafted)",
        file=out,
    )
    for label, value, target in _target_checks(s):
        verdict = "meets" if value >= target else "MISSES"
        print(f"{label:<40} {value:5.2f}x  (target >= {target:.2f}x: {verdict})", file=out)
    if "sampled_ngram_vs_plain_total" in s:
        print(
            f"{'n-gram vs plain, sampled (presets)':<40} {s['sampled_ngram_vs_plain_total']:5.2f}x", file=out
        )
    n = len(s["prompts"])
    print(
        f"greedy outputs identical across all four: {s['identical_count']}/{n}; "
        f"ours == transformers greedy: {s['matches_peer_count']}/{n}"
        + (
            f"; sampled identical with and without drafting: {s['sampled_identical_count']}/{n}"
            if "sampled_identical_count" in s
            else ""
        ),
        file=out,
    )
    _print_cache_figures(out, s)


def _target_checks(s: dict) -> list[tuple[str, float, float]]:
    """(label, ratio, target) for each ratio the bench holds to a target."""
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
    if "adaptive_vs_best_fixed_total" in s:
        best = s["best_fixed_k"]
        checks += [
            (
                f"adaptive K vs best fixed K ({best})",
                s["adaptive_vs_best_fixed_total"],
                TARGETS["adaptive_vs_best_fixed_total"],
            ),
            (
                "adaptive K vs the presets' fixed K",
                s["adaptive_vs_preset_fixed_total"],
                TARGETS["adaptive_vs_preset_fixed_total"],
            ),
        ]
    return checks


def _print_cache_figures(out, s: dict) -> None:
    """q8 against full precision: decode speed at a long context, and the KV cache's size."""
    speed = s.get("cache_speed")
    if speed:
        verdict = "meets" if speed["q8_vs_full"] >= 0.9 else "MISSES"
        print(
            f"decode at {speed['context']} tokens of context: full precision {speed['full']:.1f} tok/s, "
            f"q8 {speed['q8']:.1f} tok/s ({speed['q8_vs_full']:.2f}x; target >= 0.90x: {verdict})",
            file=out,
        )
    kv = s.get("kv_cache_bytes")
    if kv:
        mib = 2**20
        print(
            f"KV cache at {kv['positions']} tokens: fp32 {kv['fp32'] / mib:.1f} MiB, fp16 {kv['fp16'] / mib:.1f} MiB, "
            f"q8 {kv['q8'] / mib:.1f} MiB ({kv['fp32'] / kv['q8']:.2f}x smaller than fp32, "
            f"{kv['fp16'] / kv['q8']:.2f}x than fp16)",
            file=out,
        )
