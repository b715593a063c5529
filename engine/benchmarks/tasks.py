"""`specchat bench --tasks SPLIT`: long-input task families, the code family and context-length rows, ours against
llama-server.

The task families are the work where copying from the prompt pays and contexts are long: summarize a given text,
answer over given passages, edit given code, translate, and multi-turn chats (5+ turns); and code work as users do
it, function completions and rewrites (its two halves reported apart). The splits are in engine.benchmarks.task_sets
(`tune` to tune on, `heldout` never tuned on: report it). Each prompt is decoded greedily these ways, in rotating
order so that machine noise hits all of them alike (each variant's figure is its best repeat; ngram-mod's is its
first run, see below):
  ours-plain / ours-ngram      our llama.cpp backend with its default settings (threads measured at load, f16
                               cache), drafting off / n-gram drafting with the preset's adaptive K
  ours-draft                   with `draft`: the draft model, adaptive K with n-gram lookup beside it (the app's
                               default with a draft model), on the same thread count
  server-plain / server-ngram-simple / server-ngram-mod   llama.cpp's own llama-server on the same GGUF, thread
                               count and context, as its users run it (its default weight repacking, off only on
                               AMX CPUs where it crashes), without drafting and with its two n-gram speculations
  server-draft-simple          with `draft`: `llama-server -md DRAFT --spec-type draft-simple`
  ours-draft / server-draft-mtp   with `mtp` (a GGUF with MTP layers, `--draft mtp`): our MTP-head drafting (adaptive
                               K, n-gram beside it) and `llama-server --spec-type draft-mtp`
Speeds are decode tokens/s for every variant alike: tokens after the first chunk over the time from the first
chunk to the last (prompt processing is apart: it is the same llama.cpp code on both sides). Every drafting mode's
greedy output is checked against ours-plain's on every prompt and repeat, and (`seeded_tokens`) its seeded sampled
output too; each mismatch is printed and returned. Then the repeat family (engine.benchmarks.repeat: scripted
conversations whose last reply repeats what the chat already wrote, ours with and without the history drafter beside
the same ngram-mod server). Then the context rows: a document prompt of about 100, 1k, 2k
and 4k tokens, our plain against llama-server's plain. Ratios come from the same run; nothing is compared to a
stored number. Nothing on the chat path imports this.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmarks.runner import keep_load_threads, timed_reply
from engine.benchmarks.task_sets import FAMILIES, TASK_SETS, load_task_set
from engine.benchmarks.task_table import (
    DRAFTING,
    FamilyResult,
    Figures,
    first_difference,
    print_exactness,
    print_families,
)
from engine.decoding.rates import decode_tokens_per_s
from engine.errors import BackendError
from engine.events import fmt, percent

__all__ = ["FAMILIES", "TASK_SETS", "Run", "counted_run", "load_task_set", "run_task_bench", "variant_plan"]

OURS = ("ours-plain", "ours-ngram")
OURS_DRAFT = "ours-draft"
SERVERS = {
    "server-plain": (),
    "server-ngram-simple": ("--spec-type", "ngram-simple"),
    "server-ngram-mod": ("--spec-type", "ngram-mod"),
}
SERVER_DRAFT = "server-draft-simple"
SERVER_MTP = "server-draft-mtp"
# llama-server's ngram-mod keeps one n-gram pool for all requests and never clears it between them: a repeat of a
# prompt drafts the first run's whole reply back. Its figure is the first time its server sees each prompt (what a
# user's new message gets); the repeats are printed apart.
REMEMBERS_REPLIES = ("server-ngram-mod",)
CONTEXT_ROWS = (100, 1000, 2000, 4000)
# The preset whose K (and, for the seeded check, sampler) a family runs with (the router's choice for such a prompt).
FAMILY_PRESET = {"code_edit": "code", "code_complete": "code", "code_rewrite": "code"}
SEEDED_TOKENS = 48


@dataclass
class Run:
    ids: list[int]
    tokens: int
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    cost_steps: float = 0.0


def variant_plan(draft: Path | None, mtp: bool = False) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """Our variants and llama-server's (name -> its extra arguments), with a draft model, the model's MTP head
    (`mtp`: ours-draft is our MTP drafting, beside llama-server's draft-mtp) or neither."""
    from engine.benchmarks.llama_server import draft_simple_args

    servers = dict(SERVERS)
    if mtp:
        servers[SERVER_MTP] = ("--spec-type", "draft-mtp")
        return (*OURS, OURS_DRAFT), servers
    if draft is None:
        return OURS, servers
    servers[SERVER_DRAFT] = draft_simple_args(draft)
    return (*OURS, OURS_DRAFT), servers


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


def greedy_mismatches(label: str, runs: dict[str, list[Run]]) -> dict[str, str]:
    """Variant -> how its greedy output left ours-plain's first run (any repeat; ours-plain's own repeats too);
    empty when every run agrees."""
    plain = runs["ours-plain"][0].ids
    found = {}
    for variant in ("ours-plain", *DRAFTING):
        for rep, run in enumerate(runs.get(variant, ())):
            at = first_difference(plain, run.ids)
            if at is not None:
                found[variant] = (
                    f"{label} {variant} greedy (repeat {rep + 1}): differs from ours-plain at token {at} "
                    f"({len(run.ids)} tokens against {len(plain)})"
                )
                break
    return found


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


def recurrent_memory(backend):
    """A llama.cpp backend's recurrent memory (engine/backends/llamacpp/memory.py); None for any other cache."""
    return getattr(getattr(backend, "target", None), "memory", None)


@dataclass
class _TaskBench:
    """What the task bench's steps share: the backends and servers, how each prompt runs, what the families found."""

    ours: object
    ours_variants: tuple[str, ...]
    max_new: int
    repeats: int
    seeded_tokens: int
    out: object
    drafted: object = None
    variants: tuple[str, ...] = ()
    started: dict = field(default_factory=dict)
    remotes: dict = field(default_factory=dict)
    results: dict[str, FamilyResult] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    again: dict[str, Figures] = field(default_factory=dict)  # a remembering server's repeats, apart
    at_load: int = 0  # our thread count when the families began
    fewer: list[str] = field(
        default_factory=list
    )  # our replies on fewer threads than at_load (busy-CPU guard)

    @property
    def by_variant(self) -> dict:
        return {"ours-plain": self.ours, "ours-ngram": self.ours, OURS_DRAFT: self.drafted}

    @property
    def modes(self) -> list[str]:
        return [v for v in DRAFTING if v in self.variants]


def run_task_bench(
    gguf: Path,
    split: str = "heldout",
    *,
    draft: Path | None = None,
    mtp: bool = False,
    max_new: int = 128,
    repeats: int = 1,
    threads: int | None = None,
    context: int = 4096,
    servers: bool = True,
    context_rows: tuple[int, ...] = CONTEXT_ROWS,
    families: tuple[str, ...] | None = None,
    seeded_tokens: int = SEEDED_TOKENS,
    out=sys.stdout,
) -> dict:
    """Run the families of `split` (all, or `families`), then the context rows; print a table each and return the
    figures, with "mismatches": every drafting mode's output that left ours-plain's (empty when all agree)."""
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.presets import load_presets

    items, repeat = _chosen_items(split, families)
    presets = load_presets(None)
    ours_variants, server_args = variant_plan(draft, mtp)
    if not items:  # the repeat family alone: only ngram-mod runs beside it
        server_args = {name: args for name, args in server_args.items() if name == "server-ngram-mod"}
    ours = LlamaCppBackend(gguf, draft="ngram", cache_mode="auto", max_context=context, threads=threads)
    ours.load()
    keep_load_threads(ours)
    bench = _TaskBench(ours, ours_variants, max_new, repeats, seeded_tokens, out)
    repeated = None
    try:
        if draft is not None or mtp:
            _load_drafted(bench, gguf, "mtp" if mtp else str(draft), context, threads)
        server_note = _start_peers(bench, gguf, server_args, context, servers)
        _clear_recurrent_counters(bench)
        _print_header(bench, split, len(items), context, gguf, draft, mtp, server_note)
        _run_families(bench, items, presets)
        if repeat:
            repeated = _run_repeat_family(bench, split, context)
        _print_notes(bench)
        rows = _context_rows(
            ours, bench.remotes.get("server-plain"), context_rows, context, max_new, repeats, out
        )
    except BackendError as exc:
        print(f"task bench stopped: {exc}", file=out)
        return {}
    finally:
        _close(bench)
    return {
        "families": bench.results,
        "context_rows": rows,
        "threads": ours.threads,
        "variants": bench.variants,
        "mismatches": bench.mismatches,
        "repeat": repeated,
    }


def _chosen_items(split: str, families: tuple[str, ...] | None) -> tuple[list[dict], bool]:
    """The prompts of `split`'s chosen families, and whether the repeat family runs after them."""
    from engine.benchmarks.repeat import FAMILY as REPEAT
    from engine.benchmarks.repeat import repeat_file

    items = load_task_set(split)
    if families is not None:
        items = [i for i in items if i["category"] in families]
    return items, (families is None or REPEAT in families) and repeat_file(split) is not None


def _clear_recurrent_counters(bench: _TaskBench) -> None:
    """A recurrent model: count the replies' rollbacks, not the load probe's."""
    for backend in (bench.ours, bench.drafted):
        memory = recurrent_memory(backend)
        if memory is not None:
            memory.counters.clear()


def _load_drafted(bench: _TaskBench, gguf: Path, draft: str, context: int, threads: int | None) -> None:
    """The draft model's (or MTP head's) backend runs as ours does: the thread count load measured for ours, taken
    as measured (the busy-CPU guard armed alike), or the count given (as pair.py does)."""
    from engine.backends.llamacpp import LlamaCppBackend

    bench.drafted = LlamaCppBackend(
        gguf,
        draft=draft,
        cache_mode="auto",
        max_context=context,
        threads=threads,
        thread_choice=bench.ours.thread_control.thread_choice,
    )
    bench.drafted.load()


def _start_peers(bench: _TaskBench, gguf: Path, server_args: dict, context: int, wanted: bool) -> str:
    """llama-server once per variant where `wanted`; the variants that run are ours, then the servers that started.
    Returns the servers' line (empty where none was wanted)."""
    server_note = (
        _start_servers(gguf, server_args, bench.ours.threads, context, bench.started, bench.remotes)
        if wanted
        else ""
    )
    bench.variants = bench.ours_variants + tuple(name for name in server_args if name in bench.remotes)
    return server_note


def _print_header(
    bench: _TaskBench,
    split: str,
    prompts: int,
    context: int,
    gguf: Path,
    draft: Path | None,
    mtp: bool,
    server_note: str,
) -> None:
    ours = bench.ours
    # The repeat family alone has no prompts of its own (its conversations, and their sampler, come after).
    what = f"{prompts} prompts, temperature 0" if prompts else "the repeat family only"
    print(
        f"specchat bench --tasks {split}: {what}, max {bench.max_new} new tokens, "
        f"{bench.repeats} repeat(s), {ours.threads} thread(s) ({'; '.join(ours.info.notes)}), context {context}; "
        f"{gguf.name}{f', draft {draft.name}' if draft is not None else ', its MTP head' if mtp else ''}",
        file=bench.out,
    )
    if server_note:
        print(server_note, file=bench.out)


def _run_families(bench: _TaskBench, items: list[dict], presets: dict) -> None:
    """Every prompt of the families, a line each as it finishes; then the families' tables."""
    bench.again = {v: Figures() for v in bench.variants if v in REMEMBERS_REPLIES}
    bench.at_load = bench.ours.threads
    for index, item in enumerate(items):
        _run_prompt(bench, index, item, presets)
    if bench.results:
        print_families(bench.out, bench.results, bench.variants)
        print_exactness(bench.out, bench.results, bench.mismatches, bench.seeded_tokens)


def _run_prompt(bench: _TaskBench, index: int, item: dict, presets: dict) -> None:
    """One prompt: each variant timed, its counted run added to its family's figures, the prompt's line printed,
    then every drafting mode's output checked against ours-plain's."""
    family = item["category"]
    modes = bench.modes
    res = bench.results.setdefault(
        family,
        FamilyResult(
            family,
            figures={v: Figures() for v in bench.variants},
            identical=dict.fromkeys(modes, 0),
            seeded_identical=dict.fromkeys(modes, 0),
        ),
    )
    label = f"{family} #{res.prompts + 1}"
    prompt_ids = bench.ours.encode_chat(item["messages"])
    preset = presets[FAMILY_PRESET.get(family, "qa")]
    runs = _timed_runs(bench, index, label, item, prompt_ids, preset.k)
    rates = []
    for variant in bench.variants:
        counted, again = counted_run(variant, runs[variant])
        _add(res.figures[variant], counted)
        if again is not None:
            _add(bench.again[variant], again)
        rates.append(f"{variant} {fmt(counted.tokens / counted.decode_s if counted.decode_s else None)}")
    # One line per prompt as it finishes (a run on a real pair takes most of an hour).
    print(f"  {label} ({len(prompt_ids)} prompt tok): {', '.join(rates)} tok/s", file=bench.out, flush=True)
    res.prompts += 1
    res.prompt_tokens.append(len(prompt_ids))
    wrong = greedy_mismatches(label, runs)
    bench.mismatches += wrong.values()
    for mode in modes:
        res.identical[mode] += mode not in wrong
    if bench.seeded_tokens:
        wrong = _seeded_mismatches(
            label, bench.by_variant, modes, prompt_ids, preset, bench.seeded_tokens, family
        )
        bench.mismatches += wrong.values()
        for mode in modes:
            res.seeded_identical[mode] += mode not in wrong


def _timed_runs(
    bench: _TaskBench, index: int, label: str, item: dict, prompt_ids: list[int], k: int
) -> dict[str, list[Run]]:
    """Every variant on one prompt, `repeats` times, in an order that rotates with the prompt and the repeat."""
    variants = bench.variants
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    for rep in range(bench.repeats):
        shift = (index + rep) % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            if variant in bench.ours_variants:
                backend = bench.by_variant[variant]
                ask = 0 if variant == "ours-plain" else k
                runs[variant].append(
                    _ours(backend, prompt_ids, ask, bench.max_new, f"tasks-{item['category']}")
                )
                if backend.threads < bench.at_load:
                    bench.fewer.append(f"{label} {variant}")
            else:
                runs[variant].append(_server(bench.remotes[variant], item["messages"], bench.max_new))
    return runs


def _run_repeat_family(bench: _TaskBench, split: str, context: int) -> dict:
    """After the other families: llama-server's ngram-mod pool is warm with them (one server throughout)."""
    from engine.benchmarks.repeat import run_repeat_family

    repeated = run_repeat_family(
        bench.ours,
        split,
        drafted=bench.drafted,
        server=bench.remotes.get("server-ngram-mod"),
        max_new=bench.max_new,
        repeats=bench.repeats,
        seeded_tokens=bench.seeded_tokens,
        context=context,
        out=bench.out,
    )
    bench.mismatches += repeated["mismatches"]
    return repeated


def _print_notes(bench: _TaskBench) -> None:
    """What the tables leave out: a recurrent model's state costs, replies the busy-CPU guard slowed, and a
    remembering server's figure on repeats."""
    out = bench.out
    for name, backend in (("ours", bench.ours), (OURS_DRAFT, bench.drafted)):
        memory = recurrent_memory(backend)
        if memory is not None:  # a recurrent model: what its rollbacks, checkpoints and replays cost
            print(f"{name} recurrent state (the replies): {memory.counters.describe()}", file=out)
    fewer = bench.fewer
    if fewer:
        print(
            f"our replies on fewer than {bench.at_load} threads (the busy-CPU guard dropped them; figures above "
            f"include them): {len(fewer)}: {', '.join(fewer[:6])}{' ...' if len(fewer) > 6 else ''}",
            file=out,
        )
    for variant, figures in bench.again.items():
        if figures.decode_s:
            print(
                f"{variant} on a repeat of each prompt (its pool holds the first run's reply; not counted "
                f"above): {fmt(figures.tokens_per_s)} tok/s, acceptance {percent(figures.acceptance)}",
                file=out,
            )


def _close(bench: _TaskBench) -> None:
    for remote in bench.remotes.values():
        remote.close()
    for server in bench.started.values():
        server.close()
    if bench.drafted is not None:
        bench.drafted.close()
    bench.ours.close()


def _start_servers(
    gguf: Path, server_args: dict, threads: int, context: int, started: dict, remotes: dict
) -> str:
    """Start llama-server once per variant (an idle one costs no CPU, so prompts rotate among them), filling
    `started` and `remotes`; returns the line to print: how they run, or why (some) did not start."""
    from engine.backends.remote import RemoteBackend
    from engine.benchmarks.llama_server import LlamaServer, llama_server_binary

    binary, why = llama_server_binary()
    if binary is None:
        return f"llama-server peers skipped: {why}"
    failed = []
    repack = ""
    for name, extra in server_args.items():
        server = LlamaServer(gguf, spec=False, extra=extra, threads=threads, context=context)
        repack = server.repack.reason
        try:
            started[name] = server.start()
            remotes[name] = RemoteBackend(server.url)
            remotes[name].load()
        except (RuntimeError, BackendError) as exc:
            server.close()
            started.pop(name, None)
            remotes.pop(name, None)
            failed.append(f"{name} did not start ({' '.join(str(exc).split())[:200]})")
    line = f"llama-server: -t {threads}, -c {context}, {repack}"
    return "; ".join([line, *failed])


def _seeded_mismatches(label, by_variant, modes, prompt_ids, preset, tokens, family) -> dict[str, str]:
    """Each drafting mode sampled with the family preset's sampler and the fixed seed against ours-plain sampled
    the same way (the first `tokens` tokens; untimed)."""
    sampler = preset.sampler()
    key = f"tasks-{family}-seeded"
    plain, *_ = timed_reply(by_variant["ours-plain"], prompt_ids, 0, tokens, sampler=sampler, key=key)
    found = {}
    for mode in modes:
        ids, *_ = timed_reply(by_variant[mode], prompt_ids, preset.k, tokens, sampler=sampler, key=key)
        at = first_difference(plain, ids)
        if at is not None:
            found[mode] = (
                f"{label} {mode} seeded: differs from ours-plain sampled at token {at} "
                f"({len(ids)} tokens against {len(plain)})"
            )
    return found


def _context_rows(ours, server, lengths, context, max_new, repeats, out) -> list[dict]:
    """Our plain against llama-server's plain on a document prompt of each length (that fits the context)."""
    new = min(max_new, 64)
    rows = []
    if not lengths:
        return rows
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
            f"{length} | {len(ids)} | {fmt(a)} | {fmt(b)} | {fmt(a / b if a and b else None, '{:.2f}x')}",
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
