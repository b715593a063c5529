"""`specchat bench --remote URL`, and llama.cpp's own server as the CPU peer of `specchat bench`.

Every prompt goes through the remote backend at temperature 0; tokens/s is measured here (tokens after the first
chunk over the time from the first chunk to the last), acceptance is the server's own count. Where the server
takes K per request, each prompt runs with drafting off and on (alternating, so load drifts hit both); where it
fixes K, one run, and the line says how to compare (start the server without drafting and run again).
The llama.cpp peer starts the `llama-server` that `make llama-server` built twice on the same GGUF, without
drafting and with `--spec-type ngram-mod`, and runs the same prompts through both.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.backends.remote import RemoteBackend
from engine.decoding.rates import decode_tokens_per_s
from engine.errors import BackendError
from engine.events import Chunk, Done, fmt, percent
from engine.request import GenerationRequest, SamplerSettings


@dataclass
class RemoteFigures:
    tokens: int = 0
    decode_s: float = 0.0  # summed over prompts: first chunk to last
    drafted: int = 0
    accepted: int = 0
    replies: int = 0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class TimedReply:
    """One streamed reply's decode figures: tokens after the first chunk, first-to-last chunk time, the server's
    own drafted / accepted counts."""

    tokens: int = 0
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0


def stream_timed(
    backend: RemoteBackend,
    messages,
    max_new: int,
    k: int = 0,
    sampler: SamplerSettings | None = None,
    seed: int = 0,
) -> TimedReply:
    """Stream one reply to `messages` through `backend` (greedy unless `sampler` is given) and time its decode."""
    request = GenerationRequest(
        prompt_ids=(),
        sampler=sampler or SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=seed,
        messages=tuple(messages),
    )
    first = last = None
    first_tokens = tokens = 0
    done: Done | None = None
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            if first is None:
                first, first_tokens = event.t, event.n_tokens
            last = event.t
            tokens += event.n_tokens
        else:
            done = event
    decode = tokens - first_tokens
    rate = decode_tokens_per_s(decode, first, last)
    server = done.server if done is not None else None
    return TimedReply(
        decode if rate else 0,
        decode / rate if rate else 0.0,
        (server.drafted or 0) if server is not None else 0,
        (server.accepted or 0) if server is not None else 0,
    )


def run_prompt(backend: RemoteBackend, prompt: str, max_new: int, k: int, figures: RemoteFigures) -> None:
    reply = stream_timed(backend, ({"role": "user", "content": prompt},), max_new, k)
    figures.tokens += reply.tokens
    figures.decode_s += reply.decode_s
    figures.drafted += reply.drafted
    figures.accepted += reply.accepted
    figures.replies += 1


def run_remote_bench(
    settings, url: str, quick: bool = False, prompt_set: str | None = None, out=sys.stdout
) -> dict[str, RemoteFigures]:
    from engine.benchmarks.runner import chat_presets, load_prompt_set

    prompts = load_prompt_set(prompt_set)
    if quick:
        prompts = prompts[: max(3, len(prompts) // 3)]
    max_new = 96 if quick else 192
    backend = RemoteBackend(
        url,
        api_key_env=getattr(settings, "api_key_env", None),
        model=getattr(settings, "remote_model", None),
        max_context=settings.max_context,
    )
    try:
        backend.load()
        profile = backend.profile
        assert profile is not None
        presets = chat_presets()
        print(
            f"specchat bench --remote {backend.base}: {profile.summary()}; {len(prompts)} prompts "
            f"({prompt_set or 'heldout'}), temperature 0, max {max_new} new tokens",
            file=out,
        )
        if backend.warning:
            print(backend.warning, file=out)
        variants = ("server-plain", "server-spec") if profile.k_per_request else ("server",)
        results = {name: RemoteFigures() for name in variants}
        for index, item in enumerate(prompts):
            k = presets[item["category"]].k if item["category"] in presets else 4
            order = variants if index % 2 == 0 else tuple(reversed(variants))
            for name in order:
                run_prompt(
                    backend, item["prompt"], max_new, 0 if name == "server-plain" else k, results[name]
                )
    except BackendError as exc:
        print(f"remote bench stopped: {exc}", file=out)
        return {}
    finally:
        backend.close()
    for name, fig in results.items():
        print(
            f"{name:<14} {fmt(fig.tokens_per_s)} tok/s   acceptance {percent(fig.acceptance)} "
            f"({fig.accepted}/{fig.drafted} drafts, server's count)",
            file=out,
        )
    if profile.k_per_request:
        plain, spec = results["server-plain"].tokens_per_s, results["server-spec"].tokens_per_s
        if plain and spec:
            print(f"server drafting vs plain: {spec / plain:.2f}x (same run, alternating order)", file=out)
    else:
        print(
            "the server fixes its drafting (K server): to compare, start it once without drafting and run "
            "this again",
            file=out,
        )
    return results


def bench_llama_server_peer(
    gguf: Path,
    prompts: list[dict[str, str]],
    max_new: int,
    out=sys.stdout,
    threads: int | None = None,
    context: int = 4096,
) -> dict[str, RemoteFigures] | None:
    """llama.cpp's own server on `gguf`: plain and `--spec-type ngram-mod`, the same prompts, tok/s of each."""
    from engine.benchmarks.llama_server import LlamaServer, llama_server_binary

    binary, why = llama_server_binary()
    if binary is None:
        print(f"llama-server peer skipped: {why}", file=out)
        return None
    results: dict[str, RemoteFigures] = {}
    for name, spec in (("llama-server plain", False), ("llama-server ngram", True)):
        figures = results[name] = RemoteFigures()
        try:
            with LlamaServer(gguf, spec=spec, threads=threads, context=context) as server:
                backend = RemoteBackend(server.url)
                backend.load()
                try:
                    for item in prompts:
                        run_prompt(backend, item["prompt"], max_new, 0, figures)
                finally:
                    backend.close()
        except (RuntimeError, BackendError) as exc:
            print(f"llama-server peer stopped: {exc}", file=out)
            return None
    for name, fig in results.items():
        acceptance = f"   acceptance {percent(fig.acceptance)}" if fig.drafted else ""
        print(f"{name:<20} {fmt(fig.tokens_per_s)} tok/s{acceptance}", file=out)
    plain, ngram = (results[n].tokens_per_s for n in ("llama-server plain", "llama-server ngram"))
    if plain and ngram:
        print(f"llama-server ngram vs plain: {ngram / plain:.2f}x (one server after the other)", file=out)
    return results
