"""History drafting where history has little or nothing to offer: the held-out chat and code prompts, ours with
history drafting on (its corpus: this checkout's docs and sources, ~0.44M tokens of unrelated "past chats") and
off, on one backend, alternating off/on/on/off per prompt so a busy machine slows both alike.

    .venv/bin/python scripts/bench_history_idle.py [--family prompts_heldout|prompts_code_heldout] [--prompts N]
                                                  [--model MODEL.gguf] [--draft ngram|MODEL.gguf]

Greedy, adaptive K (the presets' default), K 8, 160 new tokens; every reply with history must equal the one
without (printed per prompt). The last line is the ratio of tokens per second, on / off.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.events import Chunk  # noqa: E402
from engine.models import ensure_embedded_gguf  # noqa: E402
from engine.request import CorpusPart, GenerationRequest, HistoryCorpus, SamplerSettings  # noqa: E402


def corpus() -> HistoryCorpus:
    paths = (
        sorted(ROOT.glob("docs/*.md"))
        + sorted(ROOT.glob("engine/**/*.py"))
        + sorted(ROOT.glob("tui/**/*.py"))
    )
    texts = [p.read_text(encoding="utf-8") for p in paths]
    return HistoryCorpus(parts=(CorpusPart("checkout", lambda: list(texts)),))


def reply(backend: LlamaCppBackend, ids: list[int], history: HistoryCorpus | None) -> tuple[float, list[int]]:
    request = GenerationRequest(
        prompt_ids=tuple(ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=160,
        num_draft_tokens=8,
        seed=0,
        k_mode="adaptive",
        tuning_key="bench",
        history=history,
    )
    tokens: list[int] = []
    start = time.perf_counter()
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            tokens += event.token_ids
    return time.perf_counter() - start, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="prompts_code_heldout")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--draft", default="ngram")
    args = parser.parse_args()
    rows = (ROOT / "engine" / "benchmarks" / f"{args.family}.jsonl").read_text().splitlines()
    prompts = [json.loads(row)["prompt"] for row in rows][: args.prompts]
    backend = LlamaCppBackend(args.model or ensure_embedded_gguf(), draft=args.draft, max_context=4096)
    backend.load()
    history = corpus()
    reply(backend, backend.encode_chat([{"role": "user", "content": "hello"}]), history)
    backend.history_indexes.wait(600)  # the index is built in the background; a chat never waits for it
    print(f"history index: {backend.history_indexes.tokens_indexed} tokens")
    seconds = {False: 0.0, True: 0.0}
    tokens = {False: 0, True: 0}
    for n, text in enumerate(prompts, 1):
        ids = backend.encode_chat([{"role": "user", "content": text}])
        texts: dict[bool, list[int]] = {}
        for on in (False, True, True, False):
            took, out = reply(backend, ids, history if on else None)
            seconds[on] += took
            tokens[on] += len(out)
            texts.setdefault(on, out)
        print(
            f"{n:3d}  off {seconds[False]:6.1f} s  on {seconds[True]:6.1f} s  equal={texts[False] == texts[True]}"
        )
    ratio = (tokens[True] / seconds[True]) / (tokens[False] / seconds[False])
    print(f"{args.family}: history on / off {ratio:.3f}x tokens per second ({len(prompts)} prompts)")
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
