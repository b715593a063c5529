"""The "repeat" family of `specchat bench --tasks`: scripted conversations where a reply repeats what the chat
already wrote, for the history drafter (engine/decoding/drafters/history.py).

Each conversation (`prompts_repeat.jsonl` to tune on, `prompts_repeat_heldout.jsonl` held out) is a few steps a
user takes in the chat app: send a message, regenerate the last reply, start a new chat, edit an earlier question
and resend. Its kind says what its last step repeats: `regenerate` (a code reply regenerated: its earlier variant is
gone from the context), `again` (the same task asked again in a new chat, word for word or reworded), `edit` (a
question edited and resent: its old branch is gone from the context), `extend` / `fix` (an extended or fixed version
of a function written earlier, in the same chat or a new one).

The steps run through a real `ChatSession` on a throwaway store, the code preset, our loaded llama.cpp backend:
every reply is stored as the chat stores it, so the history corpus of the last step is the one the session hands
the engine (`ChatHistory.drafting_corpus`: this chat's other variants and branches, then past chats, most recent
first). One session holds the whole family (its earlier conversations are past chats of the later ones). Every step
samples with the code preset's sampler (its temperature ramp included) and a seed of its own, so a regenerate is a
new sample, as in the app. The last step is then decoded, from the same prompt with the same sampler and seed, each
of these ways, in rotating order, `repeats` times (each variant's figure is its best repeat):
  ours-plain                   drafting off
  ours-ngram / ours-draft      our best modes without history: n-gram drafting (adaptive K), and with a draft
                               model (or MTP head) the app's default with one (n-gram lookup beside it)
  ours-history                 the app's default mode (ours-draft where there is one, else ours-ngram) with the
                               step's history corpus, as the session built it; its index is built before the timed
                               runs (the chat never waits for it: its first rounds would go without)
  server-ngram-mod             llama-server's `--spec-type ngram-mod`: ONE server across the family (and the other
                               families run before it), each earlier step sent to it too (its own replies join its
                               pool, as they would for its user); its figure is its first run of the step (a
                               repeat drafts its own reply back: printed apart)
Exactness: every timed run's output (seeded) equals ours-plain's, and a greedy run of `seeded_tokens` tokens of each
drafting mode equals ours-plain's greedy run; each mismatch is printed and returned.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from engine.benchmarks.runner import timed_reply
from engine.benchmarks.task_table import Figures, first_difference
from engine.errors import BackendError
from engine.events import fmt, percent
from engine.prompt_file import PromptFileError
from engine.request import GenerationRequest, HistoryCorpus, SamplerSettings

FAMILY = "repeat"
REPEAT_SETS = {"tune": "prompts_repeat.jsonl", "heldout": "prompts_repeat_heldout.jsonl"}
KINDS = ("regenerate", "again", "edit", "extend", "fix")
# The kinds the acceptance holds to >= 1.5x our plain and >= 1.25x our best mode without history.
TARGET_KINDS = ("regenerate", "again")
ACTIONS = ("send", "regenerate", "new_chat", "edit")
PRESET = "code"
HISTORY = "ours-history"
NGRAM_MOD = "server-ngram-mod"
SEED = 4242


@dataclass(frozen=True)
class Conversation:
    name: str
    kind: str
    steps: tuple[dict, ...]


def repeat_file(split: str | Path) -> Path | None:
    """The conversations file of a split (tune, heldout), or None for a split that has none."""
    if str(split) not in REPEAT_SETS:
        return None
    return Path(__file__).resolve().parent / REPEAT_SETS[str(split)]


def load_repeat_set(split: str | Path) -> list[Conversation]:
    """The conversations of a split (or of a JSON Lines file of them); PromptFileError, one line, on a bad one."""
    path = repeat_file(split) or Path(split)
    conversations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: not valid JSON ({exc})") from None
        steps = obj.get("steps") if isinstance(obj, dict) else None
        if not isinstance(steps, list) or not steps or obj.get("kind") not in KINDS:
            raise PromptFileError(
                f"{where}: each line needs 'steps' (a list) and a 'kind' of {', '.join(KINDS)}"
            )
        for step in steps:
            actions = [a for a in ACTIONS if a in step] if isinstance(step, dict) else []
            if len(actions) != 1 or ("edit" in actions and not isinstance(step.get("text"), str)):
                raise PromptFileError(
                    f"{where}: each step is one of {', '.join(ACTIONS)} (edit: with 'text')"
                )
        if "new_chat" in steps[-1] or not any(a in steps[0] for a in ("send", "new_chat")):
            raise PromptFileError(f"{where}: a conversation starts with a message and ends with a reply")
        conversations.append(Conversation(str(obj.get("name", number)), obj["kind"], tuple(steps)))
    return conversations


class SessionBackend:
    """Our backend as the bench's session sees it: each reply capped at the bench's length and sampled with the
    step's seed, each request kept (`requests`); with `plain` set, the reply is decoded without drafting (the
    measured step's: the session stores it as the chat would, untimed). Everything else is the real backend's."""

    def __init__(self, real, max_new: int) -> None:
        self.real = real
        self.max_new = max_new
        self.seed = SEED
        self.plain = False
        self.requests: list[GenerationRequest] = []

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def load(self, progress=None):
        return self.real.info

    def close(self) -> None:
        """The bench closes the real backend, not the session."""

    def generate(self, request: GenerationRequest, cancel: threading.Event):
        request = dataclasses.replace(
            request, max_new_tokens=min(request.max_new_tokens, self.max_new), seed=self.seed
        )
        self.requests.append(request)
        if self.plain:
            request = dataclasses.replace(request, drafting=False, num_draft_tokens=0, history=None)
        return self.real.generate(request, cancel)


@dataclass
class ConversationResult:
    conversation: Conversation
    prompt_tokens: int = 0
    figures: dict[str, Figures] = field(default_factory=dict)
    again: Figures | None = None  # server-ngram-mod's repeat of the step (its pool holds its own first run)
    history_tokens: int = 0  # tokens of the step's history corpus, as indexed
    index_s: float = 0.0
    history_drafted: int = 0  # ours-history's drafts from the history drafter (its counted run)
    history_accepted: int = 0
    seeded_same: dict[str, bool] = field(default_factory=dict)
    greedy_same: dict[str, bool] = field(default_factory=dict)


def session_for(backend: SessionBackend, data_dir: Path, context: int):
    """A ChatSession that saves to `data_dir`, on `backend`, in the code preset, history drafting on."""
    from engine.config import Settings
    from engine.presets import load_presets
    from engine.session import ChatSession

    settings = Settings(data_dir=data_dir, history_drafting=True, max_context=context)
    session = ChatSession(settings, backend=backend, presets=load_presets(None), save=True)
    session.load()
    session.set_mode(PRESET)
    return session


def take_step(session, step: dict) -> bool:
    """Do one step in the session; True where it made a reply."""
    cancel = threading.Event()

    def ignore(event) -> None:
        return None

    if step.get("new_chat"):
        session.new_chat()
        return False
    if "send" in step:
        result = session.send(step["send"], ignore, cancel)
    elif "edit" in step:
        result = session.edit(int(step["edit"]), step["text"], ignore, cancel)
    else:
        result = session.regenerate(ignore, cancel)
    message = getattr(result, "message", None)
    if message is not None and not hasattr(result, "stats"):
        raise BackendError(f"repeat bench: a step's reply failed: {message}")
    return True


def build_index(backend, corpus: HistoryCorpus | None) -> tuple[int, float]:
    """Index `corpus` for `backend` before the timed runs: (tokens indexed, seconds)."""
    if corpus is None:
        return 0, 0.0
    start = time.perf_counter()
    backend.history_view(GenerationRequest((1,), SamplerSettings(), 1, 4, k_mode="adaptive", history=corpus))
    indexes = backend.history_indexes
    if indexes is None or not indexes.wait(300):
        return 0, time.perf_counter() - start
    return indexes.tokens_indexed, time.perf_counter() - start


def _figures(ids, accounting, done) -> Figures:
    live = accounting.live
    decode = live.new_tokens - accounting.first_chunk_tokens
    rate = live.tokens_per_s
    cost = done.round_cost * live.rounds if done is not None and done.round_cost else 0.0
    return Figures(
        tokens=decode if rate else 0,
        decode_s=decode / rate if rate else 0.0,
        drafted=live.drafted,
        accepted=live.accepted,
        rounds=live.rounds,
        emitted=len(ids),
        cost_steps=cost,
    )


def _server_figures(remote, request: GenerationRequest, max_new: int) -> Figures:
    from engine.benchmarks.remote import stream_timed

    reply = stream_timed(remote, request.messages, max_new, sampler=request.sampler, seed=request.seed or 0)
    return Figures(
        tokens=reply.tokens, decode_s=reply.decode_s, drafted=reply.drafted, accepted=reply.accepted
    )


def _best(runs: list[tuple[list[int], Figures, tuple]]) -> tuple[list[int], Figures, tuple]:
    rated = [r for r in runs if r[1].decode_s > 0]
    return max(rated, key=lambda r: r[1].tokens_per_s or 0.0) if rated else runs[0]


def run_repeat_family(
    ours,
    split: str | Path,
    *,
    drafted=None,
    server=None,
    max_new: int = 128,
    repeats: int = 1,
    seeded_tokens: int = 48,
    context: int = 4096,
    conversations: list[Conversation] | None = None,
    out=sys.stdout,
) -> dict:
    """Run the repeat family of `split` on our loaded backend `ours` (and `drafted`, the draft model's), beside
    `server` (llama-server's ngram-mod, already started; None: left out). Prints a line per conversation and the
    table; returns {"conversations": [ConversationResult], "kinds": {kind: {variant: Figures}}, "variants",
    "mismatches"}."""
    conversations = load_repeat_set(split) if conversations is None else conversations
    best_modes = ("ours-ngram", "ours-draft") if drafted is not None else ("ours-ngram",)
    variants = ("ours-plain", *best_modes, HISTORY, *((NGRAM_MOD,) if server is not None else ()))
    by_variant = {"ours-plain": ours, "ours-ngram": ours, "ours-draft": drafted, HISTORY: drafted or ours}
    proxy = SessionBackend(ours, max_new)
    results: list[ConversationResult] = []
    mismatches: list[str] = []
    print(
        f"\nrepeat family ({split}): {len(conversations)} conversations through a ChatSession on a fresh store, "
        f"the {PRESET} preset's sampler (seeded), max {max_new} new tokens, {repeats} repeat(s); history on the "
        f"{'draft model' if drafted is not None else 'n-gram'} mode",
        file=out,
    )
    with tempfile.TemporaryDirectory(prefix="specchat-repeat-") as folder:
        session = session_for(proxy, Path(folder), context)
        k = session.preset_choice.presets[PRESET].k
        for number, conversation in enumerate(conversations):
            request = _play(session, proxy, conversation, number, server, max_new)
            res = measure_step(
                conversation,
                request,
                variants,
                by_variant,
                server,
                k,
                max_new,
                repeats,
                seeded_tokens,
                number,
            )
            results.append(res)
            mismatches += _mismatch_lines(res)
            _print_conversation(out, res, variants)
        if session.recorder.saves:
            session.recorder.store.close()
    kinds = print_repeat_table(out, results, variants)
    for line in mismatches:
        print(f"MISMATCH {line}", file=out)
    return {"conversations": results, "kinds": kinds, "variants": variants, "mismatches": mismatches}


def _play(session, proxy: SessionBackend, conversation: Conversation, number: int, server, max_new: int):
    """The conversation's steps through the session, in a new chat (the server's user takes each step before the
    last too, untimed); returns the request of the last step, the one the family times."""
    session.new_chat()
    steps = conversation.steps
    last = max(i for i, s in enumerate(steps) if not s.get("new_chat"))
    for index, step in enumerate(steps):
        proxy.seed = SEED + 100 * number + index
        proxy.plain = index == last
        before = len(proxy.requests)
        if not take_step(session, step) or len(proxy.requests) == before:
            continue
        if index < last and server is not None:  # the server's user took this step too (untimed)
            _server_figures(server, proxy.requests[-1], max_new)
    return proxy.requests[-1]


def _print_conversation(out, res: ConversationResult, variants) -> None:
    """A conversation's line as it finishes: each variant's speed, the history indexed and drafted from."""
    conversation = res.conversation
    rates = ", ".join(f"{v} {fmt(res.figures[v].tokens_per_s)}" for v in variants)
    print(
        f"  {conversation.kind} {conversation.name} ({res.prompt_tokens} prompt tok, history "
        f"{res.history_tokens} tok indexed in {res.index_s * 1000:.0f} ms): {rates} tok/s; history "
        f"drafted {res.history_drafted}, accepted {res.history_accepted}",
        file=out,
        flush=True,
    )


def measure_step(
    conversation, request, variants, by_variant, server, k, max_new, repeats, seeded_tokens, number
) -> ConversationResult:
    """The conversation's last step, decoded each way (rotating order), then the greedy check."""
    res = ConversationResult(conversation, prompt_tokens=len(request.prompt_ids))
    corpus = request.history
    res.history_tokens, res.index_s = build_index(by_variant[HISTORY], corpus)
    runs: dict[str, list] = {v: [] for v in variants}
    for rep in range(repeats):
        shift = (number + rep) % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            if variant == NGRAM_MOD:
                runs[variant].append(([], _server_figures(server, request, max_new), ()))
                continue
            ids, _, accounting, done = timed_reply(
                by_variant[variant],
                list(request.prompt_ids),
                0 if variant == "ours-plain" else k,
                max_new,
                sampler=request.sampler,
                key=f"tasks-{FAMILY}" + ("-history" if variant == HISTORY else ""),
                history=corpus if variant == HISTORY else None,
                seed=request.seed,
            )
            from_history = (accounting.drafted_by.get("history", 0), accounting.accepted_by.get("history", 0))
            runs[variant].append((ids, _figures(ids, accounting, done), from_history))
    plain = runs["ours-plain"][0][0]
    for variant in variants:
        if variant == NGRAM_MOD:  # its first run counts (what a new message gets); a repeat, apart
            res.figures[variant] = runs[variant][0][1]
            res.again = runs[variant][1][1] if len(runs[variant]) > 1 else None
            continue
        ids, figures, from_history = _best(runs[variant])
        res.figures[variant] = figures
        if variant == HISTORY:
            res.history_drafted, res.history_accepted = from_history
        if variant != "ours-plain" or len(runs[variant]) > 1:
            res.seeded_same[variant] = all(first_difference(plain, r[0]) is None for r in runs[variant])
    if seeded_tokens:
        greedy = SamplerSettings(temperature=0.0)
        key = f"tasks-{FAMILY}-greedy"
        base, *_ = timed_reply(
            by_variant["ours-plain"], list(request.prompt_ids), 0, seeded_tokens, sampler=greedy
        )
        for variant in variants:
            if variant in ("ours-plain", NGRAM_MOD):
                continue
            ids, *_ = timed_reply(
                by_variant[variant],
                list(request.prompt_ids),
                k,
                seeded_tokens,
                sampler=greedy,
                key=key + ("-history" if variant == HISTORY else ""),
                history=corpus if variant == HISTORY else None,
            )
            res.greedy_same[variant] = first_difference(base, ids) is None
    return res


def _mismatch_lines(res: ConversationResult) -> list[str]:
    label = f"repeat {res.conversation.name}"
    lines = [
        f"{label} {v} seeded (timed runs): differs from ours-plain"
        for v, same in res.seeded_same.items()
        if not same
    ]
    lines += [
        f"{label} {v} greedy: differs from ours-plain" for v, same in res.greedy_same.items() if not same
    ]
    return lines


def _ratio(a: float | None, b: float | None) -> str:
    return fmt(a / b if a and b else None, "{:.2f}x")


def print_repeat_table(out, results: list[ConversationResult], variants) -> dict[str, dict[str, Figures]]:
    """One row per kind, then the target kinds together and the whole family; returns the sums per row."""
    rows: dict[str, dict[str, Figures]] = {}
    groups = [(kind, (kind,)) for kind in KINDS] + [
        ("regenerate+again", TARGET_KINDS),
        ("overall", KINDS),
    ]
    modes = [v for v in variants if v not in ("ours-plain", NGRAM_MOD)]
    heads = [
        "repeat",
        "conv",
        *variants,
        "hist/plain",
        "hist/best-no-hist",
        *(["hist/ngram-mod"] if NGRAM_MOD in variants else []),
        "history acc/drafted",
        "seeded same",
        "greedy same",
    ]
    print(" | ".join(heads), file=out)
    for name, kinds in groups:
        members = [r for r in results if r.conversation.kind in kinds]
        if not members:
            continue
        sums = {v: Figures() for v in variants}
        for res in members:
            for v in variants:
                sums[v].add(res.figures[v])
        rows[name] = sums
        print(" | ".join(_row_cells(name, members, sums, variants, modes)), file=out)
    print(
        "tok/s: decode tokens after the first over first-to-last chunk, each variant's best repeat (ngram-mod: its "
        "first run); best-no-hist: our faster of n-gram / draft model without history; history acc/drafted: "
        "ours-history's tokens drafted from the history corpus and accepted (its counted run); seeded same: every timed run == ours-plain; greedy same: a greedy run's first tokens",
        file=out,
    )
    _print_server_repeats(out, results)
    return rows


def _row_cells(
    name: str, members: list[ConversationResult], sums: dict[str, Figures], variants, modes
) -> list[str]:
    """One row of the repeat table: each variant's speed, history against the others, what history drafted, and
    how many outputs equal plain's."""
    tps = {v: sums[v].tokens_per_s for v in variants}
    best = max(
        (v for v in variants if v in ("ours-ngram", "ours-draft") and tps[v]), key=tps.get, default=None
    )
    cells = [
        name,
        str(len(members)),
        *(fmt(tps[v]) for v in variants),
        _ratio(tps[HISTORY], tps["ours-plain"]),
        f"{_ratio(tps[HISTORY], tps[best] if best else None)}"
        + (f" ({best.removeprefix('ours-')})" if best else ""),
        *([_ratio(tps[HISTORY], tps[NGRAM_MOD])] if NGRAM_MOD in variants else []),
        f"{sum(r.history_accepted for r in members)}/{sum(r.history_drafted for r in members)}",
        ", ".join(f"{m.removeprefix('ours-')} {sum(r.seeded_same.get(m, False) for r in members)}/{len(members)}"
                  for m in modes),
        ", ".join(f"{m.removeprefix('ours-')} {sum(r.greedy_same.get(m, False) for r in members)}/{len(members)}"
                  for m in modes),
    ]  # fmt: skip
    return cells


def _print_server_repeats(out, results: list[ConversationResult]) -> None:
    """ngram-mod's figure on the repeats, apart (its pool holds its own first run)."""
    again = [r.again for r in results if r.again is not None and r.again.decode_s]
    if again:
        total = Figures()
        for figures in again:
            total.add(figures)
        print(
            f"{NGRAM_MOD} on a repeat of each step (its pool holds its own first run; not counted above): "
            f"{fmt(total.tokens_per_s)} tok/s, acceptance {percent(total.acceptance)}",
            file=out,
        )
