"""One reply's parts, apart from the pass that runs them (`reply_run.ReplyRun`): what is asked of the backend
(`reply_request`), what has streamed so far (`ReplyText`), how it ended and its stats (`reply_done`,
`reply_stats`), and how it drafts, decided once (`DraftChoice`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from engine.decoding.acceptance import AcceptanceAccounting
from engine.events import BackendInfo, Chunk, Done, MessageStats, ReplyStarted
from engine.origins import OriginRun, merge_runs, split_chunk_by_origin
from engine.presets import Preset
from engine.reasoning import thinking_end
from engine.request import GenerationRequest, HistoryCorpus


def without_partial_claim(message: str) -> str:
    """A backend's error without its promise that "the partial reply is kept", for a reply that kept nothing."""
    return message.replace("the partial reply is kept; ", "").replace("; the partial reply is kept", "")


@dataclasses.dataclass(frozen=True, slots=True)
class DraftChoice:
    """Whether and how a reply drafts, decided once from its preset and the loaded engine: the request, the started
    event, the stored row and the stats all read it (K is never worked out twice)."""

    on: bool
    k: int  # the K sent and said (0: none sent: drafting off, or a server that fixes K itself)
    k_mode: str  # the preset's ("adaptive", "fixed"); "fixed" where nothing drafts
    by_server: bool  # the server drafts by its own settings: the preset's K is neither sent nor claimed
    draft_mode: str  # the engine's drafter; "none" where nothing drafts


def draft_choice(preset: Preset, info: BackendInfo) -> DraftChoice:
    """How a reply with `preset` drafts on the engine `info` describes."""
    if info.k_by_server:
        on = info.draft_mode != "none"
    else:
        on = preset.drafting and preset.k > 0 and info.draft_mode != "none"
    return DraftChoice(
        on=on,
        k=preset.k if on and not info.k_by_server else 0,
        k_mode=preset.k_mode if on else "fixed",
        by_server=info.k_by_server,
        draft_mode=info.draft_mode if on else "none",
    )


def reply_request(
    preset: Preset,
    choice: DraftChoice,
    prompt_ids: Sequence[int],
    messages: list[dict[str, str]],
    *,
    max_context: int,
    seed: int | None,
    acceptance_seed: Callable[[str], tuple[float, ...]],
    auto: bool,
    reason: str,
    history: Callable[[], HistoryCorpus | None] = lambda: None,
) -> tuple[GenerationRequest, ReplyStarted]:
    """What the backend is asked for a reply with `preset` to `prompt_ids`, and the event that says it started.
    `acceptance_seed(preset name)` and `history()` (the history drafter's corpus) are asked only where adaptive K
    drafts."""
    adaptive = choice.on and preset.k_mode == "adaptive"
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=preset.sampler(),
        max_new_tokens=max(1, min(preset.max_new_tokens, max_context - len(prompt_ids))),
        num_draft_tokens=choice.k,
        drafting=choice.on,
        seed=seed,
        k_mode=preset.k_mode,
        tuning_key=preset.name,
        acceptance_prior=acceptance_seed(preset.name) if adaptive else (),
        messages=tuple(messages),
        history=history() if adaptive else None,
    )
    started = ReplyStarted(
        preset=preset.name,
        auto=auto,
        router_reason=reason,
        num_draft_tokens=choice.k,
        temperature=request.sampler.temperature_at(0),
        drafting=choice.on,
        prompt_tokens=len(prompt_ids),
        k_mode=choice.k_mode,
    )
    return request, started


class ReplyText:
    """What a reply has streamed so far: its tokens, whether each came from an accepted draft, the text's origin
    runs (the colouring), and per chunk where its text starts with its counts (to count the reasoning apart)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.origins: list[bool] = []
        self.runs: list[OriginRun] = []
        self.pieces: list[str] = []
        # Per chunk: (where its text starts in the reply, tokens, drafted, accepted).
        self.marks: list[tuple[int, int, int, int]] = []
        self.chars = 0

    def add(self, chunk: Chunk, decode: Callable[[list[int]], str]) -> None:
        self.token_ids.extend(chunk.token_ids)
        self.origins.extend(chunk.origins)
        merge_runs(self.runs, split_chunk_by_origin(chunk, decode))
        self.pieces.append(chunk.text)
        self.marks.append((self.chars, chunk.n_tokens, chunk.drafted, chunk.accepted))
        self.chars += len(chunk.text)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def reply_done(done: Done | None, cancelled: bool, request: GenerationRequest, preset: Preset) -> Done:
    """How the reply ended: a backend that ended without its Done is taken as complete (or cancelled), and a reply
    stopped by the room left in the context (not the preset's reply length) says so."""
    if done is None:
        done = Done("cancelled" if cancelled else "eos", prompt_tokens=len(request.prompt_ids))
    if done.stop_reason == "max_new_tokens" and request.max_new_tokens < preset.max_new_tokens:
        done = dataclasses.replace(done, stop_reason="context")
    return done


def with_thinking_counts(
    stats: MessageStats, reply_text: str, marks: list[tuple[int, int, int, int]]
) -> MessageStats:
    """`stats` with the reasoning's tokens, drafts and accepted drafts counted apart (chunks that start in it)."""
    end = thinking_end(reply_text)
    if not end:
        return stats
    inside = [m for m in marks if m[0] < end]
    return dataclasses.replace(
        stats,
        thinking_tokens=sum(m[1] for m in inside),
        thinking_drafted_tokens=sum(m[2] for m in inside),
        thinking_accepted_tokens=sum(m[3] for m in inside),
    )


def reply_stats(
    accounting: AcceptanceAccounting,
    done: Done,
    now: float,
    *,
    preset: Preset,
    choice: DraftChoice,
    info: BackendInfo,
    auto: bool,
    reason: str,
    text: ReplyText,
) -> MessageStats:
    """The finished reply's stats: the accounting's, labelled with what ran it, the reasoning counted apart."""
    stats = accounting.finish(
        done,
        now,
        preset=preset.name,
        num_draft_tokens=choice.k,
        temperature=preset.temperature,
        draft_mode=choice.draft_mode,
        backend=info.backend,
        model=info.model,
        router_reason=reason if auto else "",
        cache_mode=info.cache_mode,
        k_mode=choice.k_mode,
    )
    if choice.by_server:
        stats = dataclasses.replace(stats, k_by_server=True)
    return with_thinking_counts(stats, text.text, text.marks)
