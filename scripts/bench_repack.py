"""llama.cpp's weight repacking on and off, side by side in one process, on one GGUF.

    .venv/bin/python scripts/bench_repack.py MODEL.gguf [--tokens 96] [--repeats 2]

Loads the model twice with the llama.cpp backend (repacking on: llama.cpp's default; off: what specchat does on
CPUs with AMX), reports each one's kernel-probe verdict (single-token plain steps, or padded to two rows where
one token and a batch row round differently), and times plain and n-gram replies on the same prompts,
alternating on/off so that a busy machine slows both alike. Greedy, so every reply must be token-identical within
each load; the on/off texts may differ only where repacking changes the arithmetic.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.events import Chunk  # noqa: E402
from engine.request import GenerationRequest, SamplerSettings  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and two examples.",
    "Explain in three sentences why the sky is blue.",
    "Rewrite this sentence in the passive voice, then in the future tense: The committee approved the plan.",
    "List the planets of the solar system in order, one per line, with one fact each.",
]


def run(backend: LlamaCppBackend, ids: list[int], k: int, tokens: int) -> tuple[list[int], float]:
    request = GenerationRequest(
        prompt_ids=tuple(ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=tokens,
        num_draft_tokens=k,
        drafting=k > 0,
    )
    out: list[int] = []
    start = time.perf_counter()
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            out.extend(event.token_ids)
    return out, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    loads = {}
    for label, flag in (("on", "on"), ("off", "off")):
        os.environ["SPECCHAT_LLAMA_REPACK"] = flag
        backend = LlamaCppBackend(
            args.model, draft="ngram", cache_mode="fp16", threads=args.threads, max_context=2048
        )
        start = time.perf_counter()
        backend.load()
        loads[label] = backend
        print(
            f"repack {label}: load {time.perf_counter() - start:.1f} s (trial {backend.trial_seconds:.2f} s), "
            f"plain steps {'padded to 2 rows' if backend.pad_plain_steps else 'single-token'}, "
            f"{backend.threads} threads"
        )
    totals = {(label, mode): [0, 0.0] for label in loads for mode in ("plain", "ngram")}
    texts: dict[tuple[str, int], list[int]] = {}
    for rep in range(args.repeats):
        for i, prompt in enumerate(PROMPTS):
            order = ("on", "off") if (rep + i) % 2 == 0 else ("off", "on")
            for label in order:
                backend = loads[label]
                ids = backend.encode_chat([{"role": "user", "content": prompt}])
                plain, t_plain = run(backend, ids, 0, args.tokens)
                ngram, t_ngram = run(backend, ids, 5, args.tokens)
                assert plain == ngram, f"n-gram differs from plain (repack {label}, prompt {i})"
                texts[(label, i)] = plain
                totals[(label, "plain")][0] += len(plain)
                totals[(label, "plain")][1] += t_plain
                totals[(label, "ngram")][0] += len(ngram)
                totals[(label, "ngram")][1] += t_ngram
    rate = {key: n / s for key, (n, s) in totals.items()}
    for label in loads:
        print(
            f"repack {label}: plain {rate[(label, 'plain')]:.1f} tok/s, n-gram {rate[(label, 'ngram')]:.1f} tok/s "
            f"(n-gram/plain {rate[(label, 'ngram')] / rate[(label, 'plain')]:.2f}x)"
        )
    same = sum(texts[("on", i)] == texts[("off", i)] for i in range(len(PROMPTS)))
    print(
        f"off/on: plain {rate[('off', 'plain')] / rate[('on', 'plain')]:.2f}x, "
        f"n-gram {rate[('off', 'ngram')] / rate[('on', 'ngram')]:.2f}x; "
        f"greedy text identical on/off on {same}/{len(PROMPTS)} prompts; n-gram == plain on every reply"
    )
    for backend in loads.values():
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
