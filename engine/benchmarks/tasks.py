"""`specchat bench --tasks SPLIT`: long-input task families and context-length rows, ours against llama-server.

The task families are the work where copying from the prompt pays and contexts are long: summarize a given text,
answer over given passages, edit given code, translate, and multi-turn chats (5+ turns). Two splits ship:
`tune` (prompts_long.jsonl beside this module, the one to tune the drafter on) and `heldout` (prompts_long_heldout.jsonl,
never tuned on: report it). Each prompt is decoded greedily these ways, in rotating order so that machine noise
hits all of them alike (each variant's figure is its best repeat; ngram-mod's is its first run, see below):
  ours-plain / ours-ngram      our llama.cpp backend with its default settings (threads measured at load, f16
                               cache), drafting off / n-gram drafting with the preset's adaptive K
  server-plain / server-ngram-simple / server-ngram-mod   llama.cpp's own llama-server on the same GGUF, thread
                               count and context, without drafting and with its two n-gram speculations
Speeds are decode tokens/s for every variant alike: tokens after the first chunk over the time from the first
chunk to the last (prompt processing is apart: it is the same llama.cpp code on both sides). Then the context
rows: a document prompt of about 100, 1k, 2k and 4k tokens, our plain against llama-server's plain.
Ratios come from the same run; nothing is compared to a stored number. Nothing on the chat path imports this.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmarks.runner import timed_reply
from engine.decoding.rates import decode_tokens_per_s
from engine.errors import BackendError
from engine.prompt_file import read_prompt_file

FAMILIES = ("summarize", "passages", "code_edit", "translate", "chat")
TASK_SETS = {"tune": "prompts_long.jsonl", "heldout": "prompts_long_heldout.jsonl"}
OURS = ("ours-plain", "ours-ngram")
SERVERS = {
    "server-plain": (),
    "server-ngram-simple": ("--spec-type", "ngram-simple"),
    "server-ngram-mod": ("--spec-type", "ngram-mod"),
}
# llama-server's ngram-mod keeps one n-gram pool for all requests and never clears it between them: a repeat of a
# prompt drafts the first run's whole reply back. Its figure is the first time its server sees each prompt (what a
# user's new message gets); the repeats are printed apart.
REMEMBERS_REPLIES = ("server-ngram-mod",)
CONTEXT_ROWS = (100, 1000, 2000, 4000)
# The preset whose K a family drafts with (the router's choice for such a prompt).
FAMILY_PRESET = {"code_edit": "code"}


@dataclass
class Figures:
    """One variant's sums over prompts (each prompt's best repeat)."""

    tokens: int = 0  # decode tokens: after the first chunk
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    emitted: int = 0  # every token of our replies (tau's numerator)
    cost_steps: float = 0.0  # our rounds priced in plain steps by the backend's verify-cost curve

    @property
    def predicted(self) -> float | None:
        """Speedup over plain decoding that tau and the measured r(k) predict: tokens per plain-step of cost."""
        return self.emitted / self.cost_steps if self.cost_steps > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None


@dataclass
class Run:
    ids: list[int]
    tokens: int
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    cost_steps: float = 0.0


@dataclass
class FamilyResult:
    family: str
    prompt_tokens: list[int] = field(default_factory=list)
    figures: dict[str, Figures] = field(default_factory=dict)
    identical: int = 0  # prompts where ours-ngram == ours-plain
    prompts: int = 0


def load_task_set(name: str | Path) -> list[dict]:
    """A task split ("tune", "heldout") or a JSON Lines file of {"category", "prompt"[, "messages"]} objects."""
    path = Path(name)
    if str(name) in TASK_SETS:
        path = Path(__file__).resolve().parent / TASK_SETS[str(name)]
    items = []
    for _, obj in read_prompt_file(path):
        messages = obj.get("messages") or [{"role": "user", "content": obj["prompt"]}]
        items.append({"category": str(obj.get("category", "other")), "messages": list(messages)})
    return items


def _ours(backend, prompt_ids: list[int], k: int, max_new: int, key: str) -> Run:
    ids, _, accounting, done = timed_reply(backend, prompt_ids, k, max_new, key=key)
    live = accounting.live
    decode = live.new_tokens - accounting.first_chunk_tokens
    rate = live.tokens_per_s
    cost_steps = done.round_cost * live.rounds if done is not None and done.round_cost else 0.0
    return Run(
        ids,
        decode if rate else 0,
        decode / rate if rate else 0.0,
        live.drafted,
        live.accepted,
        live.rounds,
        cost_steps,
    )


def _server(backend, messages: list[dict], max_new: int) -> Run:
    from engine.benchmarks.remote import stream_timed

    reply = stream_timed(backend, messages, max_new)
    return Run([], reply.tokens, reply.decode_s, reply.drafted, reply.accepted)


def _best(runs: list[Run]) -> Run:
    rated = [r for r in runs if r.decode_s > 0]
    return max(rated, key=lambda r: r.tokens / r.decode_s) if rated else runs[0]


def counted_run(variant: str, runs: list[Run]) -> tuple[Run, Run | None]:
    """The run a variant's figure counts, and (for a server that remembers replies) its best repeat, apart.

    Every variant counts its best repeat, except one whose drafts recall earlier requests (REMEMBERS_REPLIES):
    its first run is the one a new message gets, and a repeat drafts that run's reply back."""
    if variant in REMEMBERS_REPLIES:
        return runs[0], (_best(runs[1:]) if len(runs) > 1 else None)
    return _best(runs), None


def _add(figures: Figures, run: Run) -> None:
    figures.tokens += run.tokens
    figures.decode_s += run.decode_s
    figures.drafted += run.drafted
    figures.accepted += run.accepted
    figures.rounds += run.rounds
    figures.emitted += len(run.ids)
    figures.cost_steps += run.cost_steps


def document_prompt(backend, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: paragraphs of the held-out texts, repeated as needed, then a
    request to continue (a plain decode over that many cached tokens)."""
    paragraphs = [m["content"] for item in load_task_set("heldout") for m in item["messages"]][:1]
    body = paragraphs[0] if paragraphs else "The canal was opened in 1796."

    def encoded(text: str) -> list[int]:
        return backend.encode_chat([{"role": "user", "content": text + "\n\nContinue this text."}])

    words = body.split()
    text = " ".join(words[:20])
    ids = encoded(text)
    while len(ids) < tokens:
        text = text + "\n\n" + body
        ids = encoded(text)
    while len(ids) > tokens and len(text.split()) > 8:
        cut = max(1, int((len(ids) - tokens) * 0.7))
        text = " ".join(text.split()[:-cut])
        ids = encoded(text)
    return ids


def _fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def run_task_bench(
    gguf: Path,
    split: str = "heldout",
    *,
    max_new: int = 128,
    repeats: int = 1,
    threads: int | None = None,
    context: int = 4096,
    servers: bool = True,
    context_rows: tuple[int, ...] = CONTEXT_ROWS,
    families: tuple[str, ...] | None = None,
    out=sys.stdout,
) -> dict:
    """Run the families of `split`, then the context rows; print a table each and return the figures."""
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.backends.remote import RemoteBackend
    from engine.benchmarks.llama_server import LlamaServer, llama_server_binary
    from engine.presets import load_presets

    items = load_task_set(split)
    if families:
        items = [i for i in items if i["category"] in families]
    presets = load_presets(None)
    ours = LlamaCppBackend(gguf, draft="ngram", cache_mode="auto", max_context=context, threads=threads)
    ours.load()
    started: dict[str, LlamaServer] = {}
    remotes: dict[str, RemoteBackend] = {}
    try:
        if servers:
            binary, why = llama_server_binary()
            if binary is None:
                print(f"llama-server peers skipped: {why}", file=out)
            else:
                for name, extra in SERVERS.items():
                    server = LlamaServer(gguf, spec=False, extra=extra, threads=ours.threads, context=context)
                    started[name] = server.start()
                    remotes[name] = RemoteBackend(server.url)
                    remotes[name].load()
        variants = OURS + tuple(remotes)
        print(
            f"specchat bench --tasks {split}: {len(items)} prompts, temperature 0, max {max_new} new tokens, "
            f"{repeats} repeat(s), {ours.threads} thread(s) ({'; '.join(ours.info.notes)}), context {context}",
            file=out,
        )
        results: dict[str, FamilyResult] = {}
        again = {v: Figures() for v in variants if v in REMEMBERS_REPLIES}
        at_load = ours.threads
        fewer: list[str] = []  # our replies that ran on fewer threads than chosen at load (busy-CPU guard)
        for index, item in enumerate(items):
            family = item["category"]
            res = results.setdefault(family, FamilyResult(family, figures={v: Figures() for v in variants}))
            prompt_ids = ours.encode_chat(item["messages"])
            preset = presets[FAMILY_PRESET.get(family, "qa")]
            runs: dict[str, list[Run]] = {v: [] for v in variants}
            for rep in range(repeats):
                shift = (index + rep) % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    if variant in OURS:
                        k = preset.k if variant == "ours-ngram" else 0
                        runs[variant].append(_ours(ours, prompt_ids, k, max_new, f"tasks-{family}"))
                        if ours.threads < at_load:
                            fewer.append(f"{family} #{index + 1} {variant}")
                    else:
                        runs[variant].append(_server(remotes[variant], item["messages"], max_new))
            for variant in variants:
                counted, repeat = counted_run(variant, runs[variant])
                _add(res.figures[variant], counted)
                if repeat is not None:
                    _add(again[variant], repeat)
            res.prompts += 1
            res.prompt_tokens.append(len(prompt_ids))
            res.identical += runs["ours-plain"][0].ids == runs["ours-ngram"][0].ids
        _print_families(out, results, variants)
        if fewer:
            print(
                f"our replies on fewer than {at_load} threads (the busy-CPU guard dropped them; figures above "
                f"include them): {len(fewer)}: {', '.join(fewer[:6])}{' ...' if len(fewer) > 6 else ''}",
                file=out,
            )
        for variant, figures in again.items():
            if figures.decode_s:
                print(
                    f"{variant} on a repeat of each prompt (its pool holds the first run's reply; not counted "
                    f"above): {_fmt(figures.tokens_per_s)} tok/s, acceptance {_fmt(figures.acceptance, '{:.0%}')}",
                    file=out,
                )
        rows = _context_rows(ours, remotes.get("server-plain"), context_rows, context, max_new, repeats, out)
    except BackendError as exc:
        print(f"task bench stopped: {exc}", file=out)
        return {}
    finally:
        for remote in remotes.values():
            remote.close()
        for server in started.values():
            server.close()
        ours.close()
    return {"families": results, "context_rows": rows, "threads": ours.threads}


def _print_families(out, results: dict[str, FamilyResult], variants: tuple[str, ...]) -> None:
    heads = [
        "family",
        "prompts",
        "prompt tok",
        *variants,
        "ngram/plain",
        "predicted",
        "ngram/srv",
        "ngram/srv-spec",
        "tau",
        "accept",
        "same",
    ]
    print(" | ".join(heads), file=out)
    totals = {v: Figures() for v in variants}
    for res in results.values():
        for v in variants:
            for name in ("tokens", "decode_s", "drafted", "accepted", "rounds", "emitted", "cost_steps"):
                setattr(totals[v], name, getattr(totals[v], name) + getattr(res.figures[v], name))
        print(" | ".join(_family_cells(res.family, res, res.figures, variants)), file=out)
    every = FamilyResult("overall", prompts=sum(r.prompts for r in results.values()))
    every.prompt_tokens = [t for r in results.values() for t in r.prompt_tokens]
    every.identical = sum(r.identical for r in results.values())
    print(" | ".join(_family_cells("overall", every, totals, variants)), file=out)
    print(
        "tok/s: decode tokens after the first over first-to-last chunk; predicted: ours-ngram's speedup that its "
        "tau and the measured verify costs r(k) predict; ngram/srv-spec: ours-ngram over llama.cpp's best n-gram "
        "speculation of the row; server acceptance is its own count (accepted/drafted); same: prompts where "
        "ours-ngram == ours-plain",
        file=out,
    )


def _family_cells(name: str, res: FamilyResult, figures: dict[str, Figures], variants) -> list[str]:
    tps = {v: figures[v].tokens_per_s for v in variants}
    plain, ngram = tps.get("ours-plain"), tps.get("ours-ngram")
    server = tps.get("server-plain")
    srv_accept = [
        f"{v.removeprefix('server-')} {_fmt(figures[v].acceptance, '{:.0%}')}"
        for v in variants
        if v.startswith("server-ngram")
    ]
    ours = figures["ours-ngram"]
    spec = [tps[v] for v in variants if v.startswith("server-ngram") and tps[v]]
    return [
        name,
        str(res.prompts),
        str(round(statistics.mean(res.prompt_tokens))) if res.prompt_tokens else "-",
        *(_fmt(tps[v]) for v in variants),
        _fmt(ngram / plain if plain and ngram else None, "{:.2f}x"),
        _fmt(ours.predicted, "{:.2f}x"),
        _fmt(ngram / server if server and ngram else None, "{:.2f}x"),
        _fmt(ngram / max(spec) if spec and ngram else None, "{:.2f}x"),
        _fmt(ours.tau, "{:.2f}"),
        f"ours {_fmt(ours.acceptance, '{:.0%}')}" + "".join(f", {a}" for a in srv_accept),
        f"{res.identical}/{res.prompts}",
    ]


def _context_rows(ours, server, lengths, context, max_new, repeats, out) -> list[dict]:
    """Our plain against llama-server's plain on a document prompt of each length (that fits the context)."""
    new = min(max_new, 64)
    rows = []
    print("\ncontext | prompt tok | ours-plain | server-plain | ours/server", file=out)
    for length in lengths:
        length = min(length, context - new - 8)
        ids = document_prompt(ours, length)
        text = ours.decode(ids)
        ours_runs: list[Run] = []
        server_runs: list[Run] = []
        # Best of at least 4 each, in alternating order: a 64-token run is 1-2 s, and the host's speed moves from
        # one minute to the next, so 2 runs each misread a build (docs/performance.md, the code's constants).
        for rep in range(max(2 * repeats, 4)):
            order = ("ours", "server") if rep % 2 == 0 else ("server", "ours")
            for who in order:
                if who == "ours":
                    ours_runs.append(_ours(ours, ids, 0, new, "tasks-context"))
                elif server is not None:
                    # The same text as a raw completion: the server tokenizes it to the same ids.
                    server_runs.append(_server_text(server, text, new))
        mine = _best(ours_runs)
        theirs = _best(server_runs) if server_runs else None
        a = mine.tokens / mine.decode_s if mine.decode_s else None
        b = theirs.tokens / theirs.decode_s if theirs is not None and theirs.decode_s else None
        rows.append({"context": length, "prompt_tokens": len(ids), "ours_plain": a, "server_plain": b})
        print(
            f"{length} | {len(ids)} | {_fmt(a)} | {_fmt(b)} | {_fmt(a / b if a and b else None, '{:.2f}x')}",
            file=out,
        )
    return rows


def _server_text(server, text: str, max_new: int) -> Run:
    """A raw completion of `text` (chat template already applied) through the server's /completion."""
    import time

    import httpx
    import orjson

    body = {
        "prompt": text,
        "n_predict": max_new,
        "temperature": 0.0,
        "top_k": 1,
        "stream": True,
        "cache_prompt": True,
        "special": True,
    }
    first = last = None
    tokens = 0
    with httpx.stream("POST", f"{server.base}/completion", json=body, timeout=600.0) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = orjson.loads(line[6:])
            if data.get("content"):
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    tokens += 1
                last = now
            if data.get("stop"):
                break
    rate = decode_tokens_per_s(tokens, first, last)
    return Run([], tokens if rate else 0, tokens / rate if rate else 0.0)
