"""The drafter interface: what the round loop asks of every drafter, and what they share.

As llama.cpp's common/speculative.h (`begin` with the prompt, `draft` up to k tokens, `accept` what the target
took), with the draft split in two so that several drafters can be asked each round and only the best one pays for
its drafts: `plan` says what a drafter would propose and the tokens it expects per unit of time (from the chance
that each draft is accepted and what a round of them costs), cheaply; `draft` then produces the tokens of the plan
the round picked (a draft model steps only then). The round loop (engine/decoding/round_loop.py) never asks which
drafter it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine.decoding.adaptive_k import AdaptiveK
    from engine.decoding.drafters.history import CorpusView
    from engine.decoding.round_loop import CachedModel


@dataclass
class Plan:
    """What one drafter would draft this round.

    `rate`: the tokens a round with this plan is expected to emit per unit of time, relative to a plain step
    (E(k) / round cost, E(k) = 1 + p1 + p1 p2 + ... with p_i the chance that draft i is accepted given the ones
    before it were; 1.0 where drafting would not beat a plain step). `tokens`: the drafts where the drafter
    already has them (a lookup), an empty list where it has nothing to offer, None where `draft` produces them (a
    model steps them out, only if the round picks this plan)."""

    drafter: Drafter
    k: int  # the most drafts this round may carry (the preset's K, the token budget, the context)
    rate: float = 1.0
    tokens: list[int] | None = None
    # A long match would have drafted further than the round's widest pass allowed (said under the reply).
    wanted_longer: bool = False

    @property
    def offered(self) -> bool:
        return self.tokens is None or bool(self.tokens)


class Drafter(Protocol):
    """One drafter, for one reply. Every implementation in engine/decoding/drafters/ passes
    tests/engine/decoding/drafters/test_contract.py; its name is an entry of the name map (drafters/registry.py)."""

    name: str  # the map's name for it, said per round (Chunk.drafter)
    # What a round of this drafter's drafts costs (cost_model: the verify pass, plus its draft-model steps); None
    # where the target's verify cost is not measured.
    costs: object | None
    step_times: list[float]  # this reply's draft steps, in seconds (the reply's draft step time)

    def begin(self, prompt: Sequence[int], cancel: threading.Event) -> None:
        """A reply starts from `prompt` (the target's cache holds all of it but the last token)."""

    def plan(self, k: int, k_long: int) -> Plan:
        """What this drafter would draft now, up to `k` tokens (`k_long` > k: the most a long copy may carry)."""

    def draft(self, plan: Plan, seq: Sequence[int]) -> list[int]:
        """The tokens of `plan`, which the round picked (`seq`: prompt + reply so far)."""

    def accept(self, drafted: int, accepted: int) -> None:
        """The round is verified: `drafted` of this drafter's tokens went out and the first `accepted` were kept
        (0, 0: another drafter's plan went out)."""

    def extend(self, token_ids: Sequence[int]) -> None:
        """The reply grew by `token_ids` (what the round emitted)."""

    def end(self, kept: Sequence[int]) -> None:
        """The reply ended with `kept` (prompt + reply): drop whatever the drafter holds past it."""


@dataclass(frozen=True)
class DraftContext:
    """What a drafter is built from, per reply (drafters/registry.py's factories)."""

    target: CachedModel
    draft: CachedModel | None  # the draft model, where one is loaded
    tuner: AdaptiveK  # the preset's adaptive-K state (per-position acceptance, probes, the n-gram's per-match model)
    adaptive: bool  # the request's K is adaptive (else: K drafts wherever the drafter has them)
    vocab_size: int  # drafts are never proposed past the target's vocabulary
    beside: bool = (
        False  # built to be asked beside another drafter (its drafts cost no draft-model steps there)
    )
    # What the chat already wrote, indexed for this model (the history drafter's; None: no corpus handed in).
    history: CorpusView | None = None


def best_plan(plans: Sequence[Plan]) -> Plan:
    """The plan a round sends: the first drafter's, unless a later one offers drafts at a strictly higher rate (or
    the first offers none). The first drafter is the primary one: ties go to it."""
    best = plans[0]
    for plan in plans[1:]:
        if plan.offered and (not best.offered or plan.rate > best.rate):
            best = plan
    return best


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
