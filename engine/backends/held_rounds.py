"""A library generator's streaming results as our rounds: what the exllamav2 and exllamav3 engines share.

`JobRounds` reads one round from the job's live counters after every `iterate()` call, `released` the tokens and
text a call's results let out, `HeldRounds` turns them into one Chunk per verification round, whatever text the
generator holds back; `stop_reason_of` reads an end-of-job result. No library import: plain values in, plain
values out, so all of it runs (and is tested) without CUDA. The loop that drives them is
engine/backends/library_generator/backend.py's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import Chunk, StopReason


def round_origins(emitted: int, accepted: int) -> tuple[bool, ...]:
    """Origins of the `emitted` tokens of one round: the first `accepted` came from the drafter."""
    drafted = min(max(accepted, 0), emitted)
    return (True,) * drafted + (False,) * (emitted - drafted)


@dataclass(slots=True)
class _Round:
    """One verification round whose tokens the generator may still be holding back."""

    sampled: int  # reply tokens the job sampled in this round (a stop token is not one)
    drafted: int
    accepted: int
    temperature: float
    ids: list[int] = field(default_factory=list)


class HeldRounds:
    """Turns a library generator's streaming results into one Chunk per round, whatever text it holds back.

    The generator holds back the tokens of an incomplete UTF-8 character and of a possible stop string (`held_text`
    / `held_tokens` in exllamav2's dynamic.py and exllamav3's generator/job.py) and releases them in a later round,
    or at the end in `result["held"]`. Counting per round comes from the job's counters, tokens come when released, so:
    a round is remembered when sampled (`add_round`), released ids fill the rounds in order (`release`), and a
    round becomes a Chunk only once all its tokens are out. A Chunk therefore never carries accepted counts without
    tokens, and its origins line up with its own round's accepted count. Released text is not split by token: it
    goes on the last Chunk completed with it (or waits for the next one), so the texts still add up exactly.
    """

    def __init__(self, k: int | None = None) -> None:
        self.rounds: deque[_Round] = deque()
        self.text = ""  # released, not yet on a Chunk
        self.k = k  # the reply's K, on every Chunk

    def add_round(self, sampled: int, drafted: int, accepted: int, temperature: float) -> None:
        if sampled > 0:  # a round whose only sample was the stop token drafted nothing and emits nothing
            self.rounds.append(_Round(sampled, drafted, min(accepted, sampled), temperature))

    @property
    def held_tokens(self) -> int:
        return sum(r.sampled - len(r.ids) for r in self.rounds)

    def release(self, ids: list[int], text: str, t: float) -> list[Chunk]:
        """Chunks for the rounds that `ids` (released in order) complete; extra ids beyond the rounds are dropped."""
        self.text += text
        chunks: list[Chunk] = []
        for token in ids:
            open_round = next((r for r in self.rounds if len(r.ids) < r.sampled), None)
            if open_round is None:
                break
            open_round.ids.append(token)
        while self.rounds and len(self.rounds[0].ids) == self.rounds[0].sampled:
            done = self.rounds.popleft()
            chunks.append(
                Chunk(
                    text="",
                    token_ids=tuple(done.ids),
                    drafted=done.drafted,
                    accepted=done.accepted,
                    origins=round_origins(done.sampled, done.accepted),
                    t=t,
                    temperature=done.temperature,
                    k=self.k,
                )
            )
        if chunks:
            last = chunks[-1]
            chunks[-1] = Chunk(last.text + self.text, last.token_ids, last.drafted, last.accepted, last.origins,
                               last.t, last.temperature, last.k)  # fmt: skip
            self.text = ""
        return chunks


@dataclass(slots=True)
class JobRounds:
    """A job's live counters, read after every `iterate()` call, as rounds in `held`.

    One `iterate()` call is one verification round for the job: the changes of `accepted_draft_tokens`,
    `rejected_draft_tokens` and `new_tokens` since the last call are the round's counts (exllamav2's dynamic.py,
    exllamav3's generator/job.py count them live)."""

    held: HeldRounds
    wanted: int  # the reply's token limit
    sampled: int = 0  # reply tokens the job sampled (released or still held by the generator)
    rounds: int = 0
    seen_accepted: int = 0
    seen_rejected: int = 0
    seen_new: int = 0

    def count(self, job: Any, on_stop_token: bool, temperature: float) -> bool:
        """The round since the last call into `held`; True where the job sampled past `wanted` (a safety net: the
        job's own limit already stops there), its count then cut to `wanted`."""
        accepted = job.accepted_draft_tokens - self.seen_accepted
        rejected = job.rejected_draft_tokens - self.seen_rejected
        new = job.new_tokens - self.seen_new
        self.seen_accepted, self.seen_rejected = job.accepted_draft_tokens, job.rejected_draft_tokens
        self.seen_new = job.new_tokens
        if new > 0:
            self.rounds += 1
        if on_stop_token:
            new -= 1  # the stop token is sampled but is no part of the reply
        overflow = self.sampled + new > self.wanted
        if overflow:
            new = self.wanted - self.sampled
        self.sampled += new
        self.held.add_round(new, accepted + rejected, accepted, temperature)
        return overflow


def released(
    streaming: list[dict[str, Any]], end: dict[str, Any] | None, decode: Callable[[list[int]], str]
) -> tuple[list[int], str]:
    """The token ids and text one `iterate()` call's streaming results release.

    A job that ends on a stop token does not release what it held: the tokens of an incomplete character before
    it, then the stop token itself, are in result["held"] (exllamav2's dynamic.py; exllamav3's job.py emit():
    emit_held is False on "stop_token"), so they are taken from there, the stop token left out."""
    ids: list[int] = []
    text = ""
    for r in streaming:
        ids.extend(ids_of(r.get("token_ids")))
        text += r.get("text", "")
    if end is not None and end.get("eos_reason") == "stop_token":
        tail = ids_of(end.get("held", {}).get("token_ids"))
        stop_id = end.get("eos_triggering_token_id")
        if tail and (stop_id is None or tail[-1] == stop_id):
            tail = tail[:-1]
        if tail:
            ids.extend(tail)
            text += decode(tail)
    return ids, text


def ids_of(value: Any) -> list[int]:
    """Token ids from a result's `token_ids` tensor (shape (1, n))."""
    return [int(t) for t in value.view(-1).tolist()] if value is not None else []


def stop_reason_of(
    end: dict[str, Any], eos_id: int | None, end_of_turn_id: int | None, end_of_turn_text: str | None = None
) -> StopReason:
    """Our stop reason for an end-of-job result (exllamav2's and exllamav3's say it alike)."""
    reason = end.get("eos_reason")
    if reason == "stop_string" and end_of_turn_text and end.get("eos_triggering_string") == end_of_turn_text:
        return "end_of_turn"
    if reason == "stop_token":
        token = end.get("eos_triggering_token_id")
        if token is not None and token == eos_id:
            return "eos"
        if token is not None and token == end_of_turn_id:
            return "end_of_turn"
        return "eos"
    if reason == "max_new_tokens":
        return "max_new_tokens"
    return "stop_string"  # "stop_string", and "end_filter" (filters are not used here)
