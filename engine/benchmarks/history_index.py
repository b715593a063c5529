"""The history drafter's index: build time, memory and lookup cost at a given corpus size (docs/performance.md,
"History drafting"). Not a timed test: a measurement to run on a quiet machine and write down.

    .venv/bin/python -m engine.benchmarks.history_index 1000000 10000000
    .venv/bin/python -m engine.benchmarks.history_index --regenerate
    .venv/bin/python -m engine.benchmarks.history_index --idle prompts_code_heldout [--prompts 16]

`--regenerate`: the embedded model on llama.cpp (measured costs, greedy, code preset's K 6 adaptive), one coding
prompt answered plainly, with n-gram drafting, with n-gram and an unrelated 0.7M-token history (nothing to offer),
and with n-gram and a history holding the earlier reply (a regenerate), interleaved, three times; tokens per second
and whether each equals plain decoding.

`--idle FAMILY`: where history has little or nothing to offer: a held-out prompt family (prompts_heldout,
prompts_code_heldout), the embedded model with n-gram drafting (adaptive K 8, greedy, 160 tokens), history drafting
off and on (its corpus this checkout's docs and sources, ~0.44M tokens), off/on/on/off per prompt so a busy machine
slows both alike; whether each reply with history equals the one without, and the ratio of tokens per second.

The corpus is synthetic but shaped like a chat history: documents of 200-900 tokens drawn from a Zipf law over a
49k vocabulary (SmolLM2's size), a third of them near-copies of an earlier one (regenerations, the same task asked
again), so the suffix sort runs all its doubling steps, as it does on real replies.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from pathlib import Path

import numpy as np

from engine.decoding.drafters.history import SORT_DEPTH, TokenIndex, _PartMatch

VOCAB = 49152


def synthetic_documents(total: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    picks = random.Random(seed)
    documents: list[np.ndarray] = []
    size = 0
    while size < total:
        length = picks.randrange(200, 900)
        if documents and picks.random() < 1 / 3:
            doc = documents[picks.randrange(len(documents))][:length].copy()
            edits = rng.integers(0, len(doc), size=max(1, len(doc) // 100))
            doc[edits] = rng.integers(0, VOCAB, size=len(edits))
        else:
            doc = (rng.zipf(1.2, size=length) % VOCAB).astype(np.int32)
        documents.append(doc)
        size += len(doc) + 1
    return documents


def measure(total: int) -> dict[str, float]:
    documents = synthetic_documents(total)
    tracemalloc.start()
    start = time.perf_counter()
    index = TokenIndex.from_documents(documents)
    build_s = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Lookups as a reply makes them: a tail that follows a document (one search per round), and one that does not.
    doc = documents[len(documents) // 2]
    follow, miss = _PartMatch(index), _PartMatch(index)
    tail = list(doc[:SORT_DEPTH])
    rounds = 200
    start = time.perf_counter()
    for i in range(rounds):
        tail = [*tail[1:], int(doc[(SORT_DEPTH + i) % len(doc)])]
        follow.grow(1)
        length, lo, hi = follow.match(tail)
        if length:
            index.walk(length, lo, hi, 8, VOCAB)
    follow_us = (time.perf_counter() - start) / rounds * 1e6
    noise = random.Random(1)
    tail = [noise.randrange(VOCAB) for _ in range(SORT_DEPTH)]
    start = time.perf_counter()
    for _ in range(rounds):
        tail = [*tail[1:], noise.randrange(VOCAB)]
        miss.grow(1)
        miss.match(tail)
    miss_us = (time.perf_counter() - start) / rounds * 1e6
    return {
        "tokens": len(index),
        "build_s": build_s,
        "index_mb": index.nbytes / 2**20,
        "build_peak_mb": peak / 2**20,
        "lookup_following_us": follow_us,
        "lookup_miss_us": miss_us,
    }


REGENERATE_PROMPT = (
    "Write a Python function that checks whether a number is prime, with a docstring and a few tests."
)
# The unrelated history's words: common English ones, so that nothing in it follows the coding reply.
COMMON_WORDS = [
    "the",
    "of",
    "and",
    "a",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
]


def regenerate(reps: int = 3, max_new: int = 160) -> None:
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf
    from engine.request import CorpusPart, HistoryCorpus

    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=2048)
    backend.load()
    prompt = backend.encode_chat([{"role": "user", "content": REGENERATE_PROMPT}])
    _, plain, _ = _timed_reply(backend, prompt, max_new, 0, "plain")
    earlier = HistoryCorpus((CorpusPart("earlier", lambda: [backend.decode(plain)]),))
    ways = (("plain", 0, None), ("ngram", 6, None), ("ngram + unrelated history", 6, _unrelated_history()))
    for rep in range(reps):
        for name, k, history in (*ways, ("ngram + history (regenerate)", 6, earlier)):
            speed, reply, accepted = _timed_reply(backend, prompt, max_new, k, f"{name}-{rep}", history)
            print(
                f"{rep} {name:30s} {speed:6.1f} tok/s  equals plain: {reply == plain}  accepted: {accepted}"
            )
    backend.close()


def _unrelated_history():
    """A history of 1000 documents of 700 common words (about 0.7M tokens) with nothing to offer the reply."""
    from engine.request import CorpusPart, HistoryCorpus

    picks = random.Random(0)
    return HistoryCorpus(
        (
            CorpusPart(
                "unrelated",
                lambda: [" ".join(picks.choice(COMMON_WORDS) for _ in range(700)) for _ in range(1000)],
            ),
        )
    )


def idle(family: str, count: int, max_new: int = 160) -> None:
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf

    rows = (Path(__file__).parent / f"{family}.jsonl").read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(row)["prompt"] for row in rows][:count]
    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=4096)
    backend.load()
    history = _checkout_history()
    seconds = {False: 0.0, True: 0.0}
    tokens = {False: 0, True: 0}
    for number, text in enumerate(prompts, 1):
        prompt = backend.encode_chat([{"role": "user", "content": text}])
        replies: dict[bool, list[int]] = {}
        for on in (False, True, True, False):
            speed, reply, _ = _timed_reply(backend, prompt, max_new, 8, "idle", history if on else None)
            seconds[on] += len(reply) / speed
            tokens[on] += len(reply)
            replies.setdefault(on, reply)
        print(
            f"{number:3d}  off {seconds[False]:6.1f} s  on {seconds[True]:6.1f} s  "
            f"equal={replies[False] == replies[True]}"
        )
    ratio = (tokens[True] / seconds[True]) / (tokens[False] / seconds[False])
    print(f"{family}: history on / off {ratio:.3f}x tokens per second ({len(prompts)} prompts)")
    backend.close()


def _checkout_history():
    """This checkout's docs and sources (~0.44M SmolLM2 tokens) as one part of past chats: unrelated to the
    held-out prompts, though its Python idioms may be accepted in code replies."""
    from engine.request import CorpusPart, HistoryCorpus

    root = Path(__file__).resolve().parents[2]
    paths = [
        *sorted(root.glob("docs/*.md")),
        *sorted(root.glob("engine/**/*.py")),
        *sorted(root.glob("tui/**/*.py")),
    ]
    texts = [path.read_text(encoding="utf-8") for path in paths]
    return HistoryCorpus((CorpusPart("checkout", lambda: list(texts)),))


def _timed_reply(
    backend, prompt: list[int], max_new: int, k: int, key: str, history=None
) -> tuple[float, list[int], dict[str, int]]:
    """One greedy reply (adaptive K up to `k`, its own tuning key): tokens per second, the reply, and the tokens
    accepted from each drafter. Where a history is given, its index is built first: this measures drafting, not
    the build."""
    import threading

    from engine.events import Chunk
    from engine.request import GenerationRequest, SamplerSettings

    if history is not None:
        backend.history_view(
            GenerationRequest((1,), SamplerSettings(), 1, 4, k_mode="adaptive", history=history)
        )
        assert backend.history_indexes is not None and backend.history_indexes.wait()
    request = GenerationRequest(
        tuple(prompt),
        SamplerSettings(),
        max_new,
        k,
        k > 0,
        seed=1,
        k_mode="adaptive",
        tuning_key=key,
        history=history,
    )
    start = time.perf_counter()
    chunks = [e for e in backend.generate(request, threading.Event()) if isinstance(e, Chunk)]
    seconds = time.perf_counter() - start
    accepted: dict[str, int] = {}
    for chunk in chunks:
        if chunk.drafter:
            accepted[chunk.drafter] = accepted.get(chunk.drafter, 0) + chunk.accepted
    reply = [t for c in chunks for t in c.token_ids]
    return len(reply) / seconds, reply, accepted


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1_000_000, 10_000_000])
    parser.add_argument(
        "--regenerate", action="store_true", help="a regenerate on the embedded model instead"
    )
    parser.add_argument("--idle", metavar="FAMILY", help="history on/off on a held-out family instead")
    parser.add_argument("--prompts", type=int, default=16, help="with --idle: the first N prompts")
    args = parser.parse_args(argv)
    if args.regenerate:
        regenerate()
        return
    if args.idle:
        idle(args.idle, args.prompts)
        return
    for total in args.sizes:
        figures = measure(total)
        print(
            f"{figures['tokens']:>11,} tokens: build {figures['build_s']:.2f} s, index "
            f"{figures['index_mb']:.0f} MB, peak while building {figures['build_peak_mb']:.0f} MB; a round's "
            f"lookup {figures['lookup_following_us']:.0f} us following a document, "
            f"{figures['lookup_miss_us']:.0f} us where nothing matches"
        )


if __name__ == "__main__":
    main()
