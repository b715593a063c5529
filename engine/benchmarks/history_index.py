"""The history drafter's index: build time, memory and lookup cost at a given corpus size (docs/performance.md,
"History drafting"). Not a timed test: a measurement to run on a quiet machine and write down.

    .venv/bin/python -m engine.benchmarks.history_index 1000000 10000000

The corpus is synthetic but shaped like a chat history: documents of 200-900 tokens drawn from a Zipf law over a
49k vocabulary (SmolLM2's size), a third of them near-copies of an earlier one (regenerations, the same task asked
again), so the suffix sort runs all its doubling steps, as it does on real replies.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1_000_000, 10_000_000])
    args = parser.parse_args(argv)
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
