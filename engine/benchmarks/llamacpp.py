"""`specchat bench`, llama.cpp part: our loop on llama.cpp against llama.cpp's own generate, side by side.

Every prompt is decoded at temperature 0 four ways on the same GGUF, threads and cache type, in rotating order
so that machine noise hits all of them alike (each variant's time is the best of its repeats):
  ours-plain   our loop, drafting off, exact (the same tokens as ours-ngram: single-token steps where the kernel
               probe finds them equal to batch rows, as on specchat's patched build; else padded to 2 rows)
  ours-fast    our loop, drafting off, llama.cpp's single-token kernels, unprobed (the `fast_plain` option)
  ours-ngram   our loop with n-gram drafting (K from the prompt's preset)
  lcpp-plain   llama-cpp-python's own high-level `Llama.generate` (single-token steps, its greedy sampler)
Ratios come from the same run; nothing is compared to a stored number.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.events import Chunk, percent
from engine.request import GenerationRequest, SamplerSettings

VARIANTS = ("ours-plain", "ours-fast", "ours-ngram", "lcpp-plain")
TARGETS = {
    "plain_vs_lcpp_total": 0.85,
    "ngram_vs_lcpp_total": 1.0,
    "ngram_vs_plain_total": 1.15,
}


@dataclass
class LlamaPromptResult:
    category: str
    k: int
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    identical: bool = True  # ours-plain == ours-ngram (the exactness rule)
    same_as_llama: bool = True  # ours-plain == llama.cpp's own (not required: other kernels)

    def tps(self, variant: str) -> float:
        return self.tokens[variant] / min(self.seconds[variant])


def _ours(
    backend, prompt_ids: list[int], k: int, max_new: int
) -> tuple[list[int], float, tuple[int, int, int]]:
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
        k_mode="adaptive",  # the built-in presets' mode
    )
    ids: list[int] = []
    drafted = accepted = rounds = 0
    t0 = time.perf_counter()
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            ids.extend(event.token_ids)
            drafted += event.drafted
            accepted += event.accepted
            rounds += 1
    return ids, time.perf_counter() - t0, (drafted, accepted, rounds)


def _llama_own(llm, prompt_ids: list[int], stop_ids: frozenset[int], max_new: int) -> tuple[list[int], float]:
    ids: list[int] = []
    t0 = time.perf_counter()
    if max_new > 0:
        for token in llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            if token in stop_ids:
                break
            ids.append(token)
            if len(ids) >= max_new:
                break
    return ids, time.perf_counter() - t0


@dataclass
class _Contenders:
    """The three engines a llama.cpp bench times on one GGUF: ours exact, ours unprobed, llama.cpp's own."""

    exact: Any
    fast: Any
    llm: Any

    def close(self) -> None:
        self.llm.close()
        self.fast.close()
        self.exact.close()


def run_llamacpp_bench(
    model_path: Path,
    quick: bool = False,
    out=sys.stdout,
    *,
    prompts: list[dict[str, str]] | None = None,
    prompt_set: str | None = None,
    max_new_tokens: int | None = None,
    cache_mode: str = "fp16",
    max_context: int = 4096,
    threads: int | None = None,
    model_name: str | None = None,
) -> dict:
    import llama_cpp

    from engine.backends.llamacpp import patched_build
    from engine.benchmarks.runner import chat_presets, load_prompt_set

    max_new = max_new_tokens or (96 if quick else 192)
    repeats = 2 if quick else 3
    engines = _load(model_path, cache_mode, max_context, threads)
    exact = engines.exact
    prompts = prompts if prompts is not None else load_prompt_set(prompt_set)
    presets = chat_presets()
    k_by_category = {name: presets[name].k for name in ("code", "qa", "creative") if name in presets}
    print(
        f"specchat bench (llama.cpp {llama_cpp.__version__}, {'patched' if patched_build() else 'stock'} build, "
        f"plain steps {'padded to 2 rows' if exact.pad_plain_steps else 'single-token'}): "
        f"{len(prompts)} prompts ({prompt_set or 'given'}), "
        "temperature 0, "
        f"max {max_new} new tokens, {repeats} repeat(s), {exact.threads} threads, cache {cache_mode}, "
        f"model {model_name or exact.model_path.name}",
        file=out,
    )
    results: list[LlamaPromptResult] = []
    try:
        for idx, item in enumerate(prompts):
            k = k_by_category.get(item["category"], 5)
            res = _run_prompt(engines, idx, item, k, repeats, max_new)
            results.append(res)
            _print_row(out, idx, res)
    finally:
        engines.close()
    summary = _summarise(results)
    summary["threads"] = exact.threads
    _print_summary(out, summary)
    return summary


def _load(model_path: Path, cache_mode: str, max_context: int, threads: int | None) -> _Contenders:
    """Ours exact (probed, n-gram drafting where asked), ours unprobed on the same threads, and llama.cpp's own
    generate() on the same file, context, threads and cache type."""
    import llama_cpp

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.backends.llamacpp.native import choose_repack, model_defaults
    from engine.benchmarks.runner import keep_load_threads

    exact = LlamaCppBackend(
        model_path, draft="ngram", cache_mode=cache_mode, max_context=max_context, threads=threads
    )
    exact.load()
    keep_load_threads(exact)
    fast = LlamaCppBackend(
        model_path,
        draft="none",
        cache_mode=cache_mode,
        max_context=max_context,
        threads=threads,
        thread_choice=exact.thread_control.thread_choice,  # the count exact's load measured, guard and all
        fast_plain=True,
    )
    fast.load()
    cache_type = {"fp16": llama_cpp.GGML_TYPE_F16, "q4": llama_cpp.GGML_TYPE_Q4_0}.get(
        cache_mode, llama_cpp.GGML_TYPE_Q8_0
    )
    # llama.cpp's own generate() at its default, weight repacking on, except where its AMX path crashes.
    with model_defaults(choose_repack(exact=False)):
        llm = llama_cpp.Llama(
            model_path=str(exact.model_path),
            n_ctx=exact.max_context,
            n_batch=512,
            n_threads=exact.threads,
            n_threads_batch=exact.threads,
            type_k=cache_type,
            type_v=cache_type,
            flash_attn=True,  # as ours on the CPU (and needed by a quantized V cache)
            verbose=False,
        )
    return _Contenders(exact, fast, llm)


def _run_prompt(
    engines: _Contenders, idx: int, item: dict, k: int, repeats: int, max_new: int
) -> LlamaPromptResult:
    """One prompt, every variant `repeats` times in an order that rotates with the prompt and the repeat; then
    whether ours agree with each other and with llama.cpp's own."""
    exact = engines.exact
    prompt_ids = exact.encode_chat([{"role": "user", "content": item["prompt"]}])
    res = LlamaPromptResult(item["category"], k, seconds={v: [] for v in VARIANTS})
    outputs: dict[str, list[int]] = {}
    for rep in range(repeats):
        shift = (idx + rep) % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            if variant == "lcpp-plain":
                ids, secs = _llama_own(engines.llm, prompt_ids, exact.stop_token_ids, max_new)
            else:
                backend = engines.fast if variant == "ours-fast" else exact
                ids, secs, counts = _ours(backend, prompt_ids, k if variant == "ours-ngram" else 0, max_new)
                if variant == "ours-ngram" and rep == 0:
                    res.drafted, res.accepted, res.rounds = counts
            outputs[variant] = ids
            res.tokens[variant] = max(1, len(ids))
            res.seconds[variant].append(secs)
    res.identical = outputs["ours-plain"] == outputs["ours-ngram"]
    res.same_as_llama = outputs["ours-plain"] == outputs["lcpp-plain"]
    return res


def runs_other_local_models(backend: str) -> bool:
    """Whether `--backend` names an engine of the registry that runs local models but no GGUF file (a row that loads
    neither GGUF nor an endpoint): the llama.cpp bench is not its bench. `auto` is not one."""
    from engine.backends import registry

    if backend == "auto":
        return False
    row = registry.engine(backend)
    return "gguf" not in row.loads and "endpoint" not in row.loads


def bench_llamacpp_if_usable(
    settings, quick: bool = False, out=sys.stdout, prompt_set: str | None = None
) -> dict | None:
    """The llama.cpp part of `specchat bench`, where it applies: a GGUF model (or the embedded one, whose
    GGUF is kept) and bindings that import; else one line saying why it was skipped."""
    from engine.backends.llamacpp import probe_llamacpp
    from engine.backends.select import is_gguf_path, uses_embedded_model

    if runs_other_local_models(settings.backend):
        return None
    usable, reason = probe_llamacpp()
    if not usable:
        print(f"llama.cpp bench skipped: {reason}", file=out)
        return None
    if uses_embedded_model(settings):
        from engine.models import EMBEDDED_MODEL_NAME, ensure_embedded_gguf, print_progress

        path, name = ensure_embedded_gguf(print_progress), EMBEDDED_MODEL_NAME
    elif is_gguf_path(Path(settings.model)):
        path, name = Path(settings.model), None
    else:
        print("llama.cpp bench skipped: the model is not a GGUF file", file=out)
        return None
    summary = run_llamacpp_bench(
        path,
        quick=quick,
        out=out,
        prompt_set=prompt_set,
        max_context=settings.max_context,
        threads=getattr(settings, "threads", None),
        model_name=name,
    )
    from engine.benchmarks.remote import bench_llama_server_peer
    from engine.benchmarks.runner import load_prompt_set

    print(
        "\nllama.cpp's own server on the same GGUF (decode tok/s measured here over HTTP, first token to last):",
        file=out,
    )
    bench_llama_server_peer(
        path,
        load_prompt_set(prompt_set),
        96 if quick else 192,
        out,
        threads=summary.get("threads"),
        context=settings.max_context,
    )
    return summary


def _ratio(res: LlamaPromptResult, a: str, b: str) -> float:
    return res.tps(a) / res.tps(b)


def _print_row(out, idx: int, r: LlamaPromptResult) -> None:
    if idx == 0:
        print(
            f"{'#':>2} {'cat':<8} {'K':>2} {'tok':>4} {'plain':>7} {'fast':>7} {'ngram':>7} {'llama':>7} "
            f"{'pl/ll':>6} {'ng/ll':>6} {'ng/pl':>6} {'accept':>7} same ll-same",
            file=out,
        )
    acc = percent(r.accepted / r.drafted if r.drafted else None)
    print(
        f"{idx + 1:>2} {r.category:<8} {r.k:>2} {r.tokens['ours-ngram']:>4} {r.tps('ours-plain'):>7.1f} "
        f"{r.tps('ours-fast'):>7.1f} {r.tps('ours-ngram'):>7.1f} {r.tps('lcpp-plain'):>7.1f} "
        f"{_ratio(r, 'ours-plain', 'lcpp-plain'):>6.2f} {_ratio(r, 'ours-ngram', 'lcpp-plain'):>6.2f} "
        f"{_ratio(r, 'ours-ngram', 'ours-plain'):>6.2f} {acc:>7} {'yes' if r.identical else 'NO':>4} "
        f"{'yes' if r.same_as_llama else 'no':>7}",
        file=out,
        flush=True,
    )


def _total_tps(results: list[LlamaPromptResult], variant: str) -> float:
    tokens = sum(r.tokens[variant] for r in results)
    seconds = sum(min(r.seconds[variant]) for r in results)
    return tokens / seconds


def _summarise(results: list[LlamaPromptResult]) -> dict:
    totals = {v: _total_tps(results, v) for v in VARIANTS}
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    return {
        "tokens_per_s": totals,
        "plain_vs_lcpp_total": totals["ours-plain"] / totals["lcpp-plain"],
        "fast_vs_lcpp_total": totals["ours-fast"] / totals["lcpp-plain"],
        "ngram_vs_lcpp_total": totals["ours-ngram"] / totals["lcpp-plain"],
        "ngram_vs_plain_total": totals["ours-ngram"] / totals["ours-plain"],
        "acceptance_rate": accepted / drafted if drafted else None,
        "all_identical": all(r.identical for r in results),
        "same_as_llama": sum(r.same_as_llama for r in results),
        "prompts": len(results),
    }


def _print_summary(out, s: dict) -> None:
    t = s["tokens_per_s"]
    print(
        f"\nllama.cpp total tok/s: ours-plain {t['ours-plain']:.1f}  ours-fast {t['ours-fast']:.1f}  "
        f"ours-ngram {t['ours-ngram']:.1f}  llama.cpp's own {t['lcpp-plain']:.1f}",
        file=out,
    )
    acc = s["acceptance_rate"]
    print(f"acceptance {acc:.0%}" if acc is not None else "acceptance -", file=out)
    checks = [
        ("plain (exact) vs llama.cpp's own plain", s["plain_vs_lcpp_total"], TARGETS["plain_vs_lcpp_total"]),
        ("n-gram vs llama.cpp's own plain", s["ngram_vs_lcpp_total"], TARGETS["ngram_vs_lcpp_total"]),
        ("n-gram vs our exact plain", s["ngram_vs_plain_total"], TARGETS["ngram_vs_plain_total"]),
    ]
    for label, value, target in checks:
        verdict = "meets" if value >= target else "MISSES"
        print(f"{label:<40} {value:5.2f}x  (target >= {target:.2f}x: {verdict})", file=out)
    print(
        f"fast plain (single-token kernels) vs llama.cpp's own plain {s['fast_vs_lcpp_total']:5.2f}x",
        file=out,
    )
    print(f"greedy n-gram output identical to our plain: {'yes' if s['all_identical'] else 'NO'}", file=out)
    print(
        f"our plain identical to llama.cpp's own: {s['same_as_llama']}/{s['prompts']} prompts "
        "(not required: another sampler, and stock single-token kernels round differently from batched ones)",
        file=out,
    )
