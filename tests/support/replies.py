"""One reply from a backend, collected: its chunks and its one Done (the backend tests and the decoding tests)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.backends.base import Backend
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings


class ChunkTotals:
    """What a reply's chunks add up to (`chunks`: given by the subclass)."""

    chunks: list[Chunk]

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def drafted(self) -> int:
        return sum(c.drafted for c in self.chunks)

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.chunks)


@dataclass
class Reply(ChunkTotals):
    """A reply's chunks and its one Done."""

    chunks: list[Chunk]
    done: Done


def generate(
    backend: Backend,
    prompt_ids: list[int],
    k: int = 0,
    max_new: int = 24,
    cancel_after: int | None = None,
    seed: int = 0,
    k_mode: str = "fixed",
    **sampler,
) -> Reply:
    """One reply of `backend` (k drafts a round, k 0 plain), cancelled after `cancel_after` chunks if given."""
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=SamplerSettings(**sampler),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=seed,
        k_mode=k_mode,
    )
    cancel = threading.Event()
    chunks: list[Chunk] = []
    done: list[Done] = []
    for event in backend.generate(request, cancel):
        if isinstance(event, Chunk):
            chunks.append(event)
            if cancel_after is not None and len(chunks) >= cancel_after:
                cancel.set()
        else:
            done.append(event)
    assert len(done) == 1, "exactly one Done ends every generation"
    return Reply(chunks, done[0])


def cache_holds_at_most(backend, sequence: list[int]) -> None:
    """The target's cache is a prefix of prompt + reply: nothing past the reply (no stop token, no draft)."""
    cached = list(backend.target.ids)
    assert len(cached) <= len(sequence), f"{len(cached) - len(sequence)} positions past the reply are cached"
    assert cached == sequence[: len(cached)]
    if getattr(backend, "draft_state", None) is not None:
        drafted = list(backend.draft_state.ids)
        assert len(drafted) <= len(sequence) and drafted == sequence[: len(drafted)]
