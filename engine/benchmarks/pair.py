"""`specchat bench --model M.gguf --draft D.gguf`: draft-model speculation on a real pair, against llama-server.

Contract. Every prompt is decoded at temperature 0, side by side in one run, in rotating order (machine noise hits
every variant alike; each variant's time is its best repeat):
  ours-plain      our loop, drafting off
  ours-draft      our loop, the draft model, adaptive K (the product: it drafts where the cost model says it pays)
  ours-draft-fixed our loop, the draft model drafting K = 4 tokens every round (fewer where the kernel probe caps it) (measures the pair's acceptance per
                  position, c and r(k) as they run; and what forcing the draft costs)
  ours-ngram      our loop, n-gram drafting, adaptive K
  server-plain    llama-server on the target, no drafting
  server-draft    llama-server -md DRAFT --spec-type draft-simple
Speeds are decode speeds (first chunk to last, engine.rates), the same measure for ours and the server's stream.
Then: acceptance, τ, c, r(k); predicted vs measured speedup of each of our modes on this machine; and the
prediction for machines we do not have (engine.benchmarks.draft_prediction), from the per-position acceptance measured here.
Greedy exactness (every drafting mode == ours-plain) is checked on every prompt. Nothing is compared with a stored
number.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.decoding.rates import decode_tokens_per_s
from engine.events import DASH, Chunk, Done, fmt
from engine.request import GenerationRequest, SamplerSettings

FIXED_K = 4
OURS = ("ours-plain", "ours-draft", "ours-draft-fixed", "ours-ngram")
SERVER = ("server-plain", "server-draft")
TARGETS = {
    "plain_vs_server_plain": 0.95,
    "draft_vs_plain": 1.0,
    "draft_vs_server_draft": 1.25,
    "ngram_vs_plain": 1.0,
}


@dataclass
class VariantFigures:
    tokens: int = 0
    seconds: float = 0.0  # decode time, summed over prompts (best repeat of each)
    drafted: int = 0
    accepted: int = 0
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round, first repeat
    round_tokens: int = 0  # tokens those rounds emitted (tau's numerator)
    draft_step_s: list[float] = field(default_factory=list)
    target_step_s: list[float] = field(default_factory=list)
    verify_cost: tuple[float, ...] = ()

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        """Emitted tokens / rounds, as engine.decoding.acceptance counts them (a round that emitted no token,
        the stop token alone, is not a round): >= 1."""
        if not self.rounds:
            return None
        return self.round_tokens / len(self.rounds)

    def per_position(self, k: int) -> list[float]:
        """r_i: rounds that accepted at least i / rounds that drafted at least i, i = 1..k."""
        rates = []
        for i in range(1, k + 1):
            tried = [a for d, a in self.rounds if d >= i]
            rates.append(sum(1 for a in tried if a >= i) / len(tried) if tried else 0.0)
        return rates

    @property
    def c(self) -> float | None:
        pairs = [
            (d, t) for d, t in zip(self.draft_step_s, self.target_step_s, strict=True) if d > 0 and t > 0
        ]
        if not pairs:
            return None
        return sum(d for d, _ in pairs) / sum(t for _, t in pairs)


def _ours(backend, prompt_ids: list[int], k: int, mode: str, max_new: int, key: str):
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
        k_mode=mode,
        tuning_key=key,
    )
    ids: list[int] = []
    rounds: list[tuple[int, int]] = []
    empty: list[
        tuple[int, int]
    ] = []  # rounds without a token: counted only where tokens follow (acceptance.py)
    first = last = None
    first_tokens = 0
    done: Done | None = None
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            if first is None:
                first, first_tokens = event.t, len(event.token_ids)
            last = event.t
            ids.extend(event.token_ids)
            if event.token_ids:
                rounds.extend(empty)
                empty = []
                rounds.append((event.drafted, event.accepted))
            else:
                empty.append((event.drafted, event.accepted))
        else:
            done = event
    rate = decode_tokens_per_s(len(ids) - first_tokens, first, last)
    seconds = (len(ids) - first_tokens) / rate if rate else 0.0
    return ids, len(ids) - first_tokens, seconds, rounds, done


def _server(backend, prompt: str, max_new: int) -> tuple[int, float]:
    from engine.benchmarks.remote import stream_timed

    reply = stream_timed(backend, ({"role": "user", "content": prompt},), max_new)
    return reply.tokens, reply.decode_s


@dataclass
class _PairRun:
    """What a pair bench holds while it times its prompts: our two backends, the servers, how each prompt runs."""

    plain: Any
    drafted: Any
    fixed_k: int
    k_by_category: dict[str, int]
    max_new: int
    repeats: int
    servers: dict = field(default_factory=dict)
    variants: tuple[str, ...] = ()


def run_pair_bench(
    target_path: Path,
    draft_path: Path,
    prompts: list[dict[str, str]],
    *,
    max_new: int = 128,
    repeats: int = 1,
    out=sys.stdout,
    threads: int | None = None,
    max_context: int = 4096,
    with_server: bool = True,
) -> dict:
    from engine.backends.llamacpp import patched_build

    started = time.perf_counter()
    run = _load_pair(target_path, draft_path, threads, max_context, max_new, repeats)
    plain = run.plain
    run.servers, server_note = _start_servers(
        target_path, draft_path, plain.threads, max_context, with_server
    )
    run.variants = OURS + tuple(name for name in SERVER if name in run.servers)
    print(
        f"specchat bench, draft-model pair: target {target_path.name}, draft {draft_path.name}; "
        f"{len(prompts)} prompts, temperature 0, max {max_new} new tokens, {repeats} repeat(s), "
        f"{plain.threads} threads, {'patched' if patched_build() else 'stock'} llama.cpp, plain steps "
        f"{'padded' if plain.pad_plain_steps else 'single-token'}",
        file=out,
    )
    if server_note:
        print(server_note, file=out)
    figures = {name: VariantFigures() for name in run.variants}
    same = {name: 0 for name in OURS[1:]}
    try:
        print(
            f"{'#':>2} {'cat':<8} " + " ".join(f"{name.replace('ours-', ''):>12}" for name in run.variants),
            file=out,
        )
        for index, item in enumerate(prompts):
            _run_prompt(run, index, item, figures, same, out)
    finally:
        costs, one_token_s = _close(run)
    summary = _summarise(figures, same, len(prompts), costs, one_token_s, plain.threads, run.fixed_k)
    summary["seconds"] = time.perf_counter() - started
    _print_summary(out, figures, summary)
    return summary


def _load_pair(
    target_path: Path, draft_path: Path, threads: int | None, max_context: int, max_new: int, repeats: int
) -> _PairRun:
    """Ours plain (n-gram drafting where asked) and ours with the draft model, on the same threads."""
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.benchmarks.runner import chat_presets, keep_load_threads

    plain = LlamaCppBackend(target_path, draft="ngram", max_context=max_context, threads=threads)
    plain.load()
    keep_load_threads(plain)
    # The same threads as ours-plain, and the same busy-CPU guard: the count its load measured, taken as measured.
    drafted = LlamaCppBackend(
        target_path,
        draft=str(draft_path),
        max_context=max_context,
        threads=threads,
        thread_choice=plain.thread_control.thread_choice,
    )
    drafted.load()
    presets = chat_presets()
    # The fixed-K run drafts FIXED_K, or as many as the exact kernels reach (engine/backends/llamacpp/backend.py's probe).
    fixed_k = min(FIXED_K, (drafted.max_verify_width or FIXED_K + 1) - 1)
    k_by_category = {name: presets[name].k for name in ("code", "qa", "creative") if name in presets}
    return _PairRun(plain, drafted, fixed_k, k_by_category, max_new, repeats)


def _run_prompt(run: _PairRun, index: int, item: dict, figures: dict, same: dict, out) -> None:
    """One prompt: every variant `repeats` times in an order that rotates with the prompt and the repeat; each
    variant's best repeat added to its figures; whether each drafting mode equals ours-plain; the prompt's line."""
    variants = run.variants
    k = run.k_by_category.get(item["category"], 5)
    prompt_ids = run.plain.encode_chat([{"role": "user", "content": item["prompt"]}])
    best: dict[str, tuple[int, float]] = {}
    outputs: dict[str, list[int]] = {}
    for rep in range(run.repeats):
        shift = (index + rep) % len(variants)
        for name in variants[shift:] + variants[:shift]:
            tokens, seconds = _time_variant(run, name, rep, item, prompt_ids, k, figures, outputs)
            if tokens > 0 and seconds > 0 and (name not in best or seconds < best[name][1]):
                best[name] = (tokens, seconds)
    for name, (tokens, seconds) in best.items():
        figures[name].tokens += tokens
        figures[name].seconds += seconds
    for name in same:
        same[name] += outputs.get(name) == outputs.get("ours-plain")
    rates = " ".join(f"{(best[n][0] / best[n][1]) if n in best else 0.0:>12.2f}" for n in variants)
    print(f"{index + 1:>2} {item['category']:<8} {rates}", file=out, flush=True)


def _time_variant(
    run: _PairRun,
    name: str,
    rep: int,
    item: dict,
    prompt_ids: list[int],
    k: int,
    figures: dict,
    outputs: dict,
) -> tuple[int, float]:
    """One timed reply of variant `name`: its decode tokens and seconds (ours keep their output, and their first
    repeat's rounds count in their figures)."""
    if name in run.servers:
        return _server(run.servers[name][1], item["prompt"], run.max_new)
    backend = run.drafted if "draft" in name else run.plain
    ask = 0 if name == "ours-plain" else run.fixed_k if name == "ours-draft-fixed" else k
    mode = "fixed" if name == "ours-draft-fixed" else "adaptive"
    # Adaptive K learns per preset, as in the chat (one tuner per preset); the fixed-K
    # run keeps its own, so its rounds never teach the adaptive one.
    key = f"bench-pair-{item['category']}" + ("-fixed" if mode == "fixed" else "")
    ids, tokens, seconds, rounds, done = _ours(backend, prompt_ids, ask, mode, run.max_new, key)
    outputs[name] = ids
    if rep == 0:
        fig = figures[name]
        fig.rounds.extend(rounds)
        fig.round_tokens += len(ids)
        fig.drafted += sum(d for d, _ in rounds)
        fig.accepted += sum(a for _, a in rounds)
        if done is not None:
            fig.draft_step_s.append(done.draft_step_s)
            fig.target_step_s.append(done.target_step_s)
            fig.verify_cost = done.verify_cost or fig.verify_cost
    return tokens, seconds


def _close(run: _PairRun) -> tuple[dict, float | None]:
    """Close the servers and both backends; the draft backend's verify costs and one-token step, read first."""
    for _, (server, backend) in run.servers.items():
        backend.close()
        server.close()
    drafted = run.drafted
    costs = drafted.target.costs.as_dict() if drafted.target and drafted.target.costs else {}
    one_token_s = drafted.target.costs.one_token_s if drafted.target and drafted.target.costs else None
    drafted.close()
    run.plain.close()
    return costs, one_token_s


def _start_servers(
    target: Path, draft: Path, threads: int, context: int, wanted: bool
) -> tuple[dict, str | None]:
    """Both llama-servers at once (an idle one costs no CPU), so their prompts alternate like ours."""
    if not wanted:
        return {}, None
    from engine.backends.remote import RemoteBackend
    from engine.benchmarks.llama_server import LlamaServer, draft_simple_args, llama_server_binary
    from engine.errors import BackendError

    binary, why = llama_server_binary()
    if binary is None:
        return {}, f"llama-server peer skipped: {why}"
    servers: dict = {}
    extra = {
        "server-plain": (),
        "server-draft": draft_simple_args(draft),
    }
    try:
        for name in SERVER:
            server = LlamaServer(target, spec=False, threads=threads, context=context, extra=extra[name])
            server.start()
            backend = RemoteBackend(server.url)
            servers[name] = (server, backend)
            backend.load()
    except (RuntimeError, BackendError) as exc:
        for server, backend in servers.values():
            backend.close()
            server.close()
        return {}, f"llama-server peer skipped: {' '.join(str(exc).split())[:300]}"
    return servers, None


def _summarise(figures, same, prompts, costs, one_token_s, threads, fixed_k) -> dict:
    """The measured figures and ratios; where c was measured, the predictions beside them."""

    def tps(name):
        return figures[name].tokens_per_s if name in figures else None

    def ratio(a, b):
        x, y = tps(a), tps(b)
        return x / y if x and y else None

    fixed = figures["ours-draft-fixed"]
    per_position = fixed.per_position(fixed_k)
    curve = _verify_curve(costs)
    c = fixed.c
    summary: dict = {
        "tokens_per_s": {name: tps(name) for name in figures},
        "acceptance": {name: figures[name].acceptance for name in figures},
        "tau": {name: figures[name].tau for name in figures},
        "per_position": per_position,
        "c": c,
        "verify_curve": {w: round(curve[w - 1], 3) for w in range(1, fixed_k + 6)},
        "same_as_plain": same,
        "prompts": prompts,
        "threads": threads,
        "plain_vs_server_plain": ratio("ours-plain", "server-plain"),
        "draft_vs_plain": ratio("ours-draft", "ours-plain"),
        "draft_fixed_vs_plain": ratio("ours-draft-fixed", "ours-plain"),
        "fixed_k": fixed_k,
        "draft_vs_server_draft": ratio("ours-draft", "server-draft"),
        "ngram_vs_plain": ratio("ours-ngram", "ours-plain"),
        "server_draft_vs_server_plain": ratio("server-draft", "server-plain"),
    }
    if c is not None:
        summary.update(_predictions(figures, per_position, curve, c, one_token_s, threads, fixed_k))
    return summary


def _verify_curve(costs: dict) -> list[float]:
    """r(1..17): the verify costs measured at load, widths it did not time extended by the last step."""
    curve = [costs.get(1, 1.0)]
    for width in range(2, 18):
        curve.append(costs.get(width) or (curve[-1] + (curve[-1] - curve[-2] if len(curve) > 1 else 0.1)))
    return curve


def _predictions(figures, per_position, curve, c, one_token_s, threads, fixed_k) -> dict:
    """What the measured acceptance and costs predict: each of our modes here, the best K here, and (where a
    one-token step was timed) this machine fitted and the machines we do not have."""
    from engine.benchmarks.draft_prediction import (
        DESKTOP_8_CORE,
        GPU_24GB,
        QWEN_0_5B,
        QWEN_1_5B,
        QWEN_7B,
        best_draft_k,
        draft_speedup,
        fit_machine,
        predict,
        repriced_speedup,
        with_throughput_of,
    )

    best_k, best = best_draft_k(per_position, curve, c)
    found: dict = {
        "predicted": {
            "ours-draft-fixed": draft_speedup(per_position, curve, c, fixed_k),
            "ours-draft": best,
            "ours-ngram": repriced_speedup(figures["ours-ngram"].rounds, curve),
        },
        "best_k_here": best_k,
    }
    rows = []
    if one_token_s:
        here = fit_machine(
            f"this machine ({threads} threads)",
            QWEN_1_5B,
            one_token_s,
            dict(enumerate(curve, 1)),
            threads,
        )
        rows.append(
            predict(here, QWEN_1_5B, QWEN_0_5B, per_position, figures["ours-ngram"].rounds,
                    measured_curve=curve, measured_c=c)
        )  # fmt: skip
        for machine in (with_throughput_of(DESKTOP_8_CORE, here), GPU_24GB):
            for target in (QWEN_1_5B, QWEN_7B):
                rows.append(predict(machine, target, QWEN_0_5B, per_position, figures["ours-ngram"].rounds))
    found["prediction_rows"] = rows
    return found


def _print_summary(out, figures, s: dict) -> None:
    from engine.benchmarks.draft_prediction import prediction_table

    print("\nvariant          tok/s  acceptance    τ", file=out)
    for name, fig in figures.items():
        print(
            f"{name:<15} {fmt(fig.tokens_per_s, '{:6.2f}')}  {fmt(fig.acceptance, '{:>9.0%}')}  "
            f"{fmt(fig.tau, '{:.2f}')}",
            file=out,
        )
    curve = "  ".join(f"r({w}) {r:.2f}" for w, r in s["verify_curve"].items() if w > 1)
    print(
        f"\ncost ratio c (0.5B step / 1.5B step, as they run): {fmt(s['c'], '{:.3f}')};  verify cost {curve}",
        file=out,
    )
    pp = "  ".join(f"r{i} {r:.2f}" for i, r in enumerate(s["per_position"], 1))
    print(f"per-position acceptance (ours-draft-fixed: K={s['fixed_k']} every round): {pp}", file=out)
    predicted = s.get("predicted", {})
    measured = {
        "ours-draft-fixed": s["draft_fixed_vs_plain"],
        "ours-draft": s["draft_vs_plain"],
        "ours-ngram": s["ngram_vs_plain"],
    }
    print("\nspeedup vs ours-plain   predicted  measured", file=out)
    for name, value in measured.items():
        note = f"  (best K here: {s.get('best_k_here', 0)}; 0 = do not draft)" if name == "ours-draft" else ""
        print(f"{name:<22} {fmt(predicted.get(name), '{:>8.2f}x')} {fmt(value, '{:>8.2f}x')}{note}", file=out)
    checks = [
        ("our plain vs llama-server plain", s["plain_vs_server_plain"], TARGETS["plain_vs_server_plain"]),
        ("our draft model vs our plain", s["draft_vs_plain"], TARGETS["draft_vs_plain"]),
        (
            "our draft model vs llama-server draft",
            s["draft_vs_server_draft"],
            TARGETS["draft_vs_server_draft"],
        ),
        ("our n-gram vs our plain", s["ngram_vs_plain"], TARGETS["ngram_vs_plain"]),
    ]
    print("", file=out)
    for label, value, target in checks:
        verdict = DASH if value is None else "meets" if value >= target else "MISSES"
        print(f"{label:<40} {fmt(value, '{:5.2f}x')}  (target >= {target:.2f}x: {verdict})", file=out)
    if s["server_draft_vs_server_plain"] is not None:
        print(f"llama-server draft vs its plain        {s['server_draft_vs_server_plain']:5.2f}x", file=out)
    for name, count in s["same_as_plain"].items():
        print(f"greedy {name} == ours-plain: {count}/{s['prompts']} prompts", file=out)
    if s.get("prediction_rows"):
        print(
            "\nprediction (per-position acceptance measured here; pass cost = per-layer overhead + weights / "
            "bandwidth + tokens x compute; see docs/performance.md):",
            file=out,
        )
        print(prediction_table(s["prediction_rows"]), file=out)
