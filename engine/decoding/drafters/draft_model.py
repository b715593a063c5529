"""The draft-model drafter: a smaller model of the same tokenizer family steps out k greedy tokens on its own cache."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.decoding.adaptive_k import PROBE_LENGTH
from engine.decoding.drafters.base import DraftContext, Plan, common_prefix

if TYPE_CHECKING:
    from engine.decoding.adaptive_k import AdaptiveK
    from engine.decoding.cost_model import VerifyCostModel
    from engine.decoding.round_loop import CachedModel

# A draft model that missed more tokens than this catches up by prefill (in slices) before its first step; fewer
# go in with that step, in one pass (the usual case: the last accepted draft and the target's own token).
CATCH_UP_PASS = 64


def draft_greedy(
    model: CachedModel,
    seq: Sequence[int],
    k: int,
    vocab_size: int,
    costs: VerifyCostModel | None = None,
    step_times: list[float] | None = None,
) -> list[int]:
    """k greedy tokens from a draft model on its own cache (rolled back to the shared prefix first). Its
    one-token steps are timed into `costs` (the target's cost model) and appended to `step_times`.

    Only one-token steps are draft steps: the first call of a round also feeds the draft what it missed (the
    tokens of rounds that did not draft, or the last accepted draft), a wider pass that would inflate c. What it
    missed can be hundreds of tokens (n-gram rounds of a long copy never step it): past CATCH_UP_PASS tokens, all
    but the last go in by `prefill`, in the model's own slices, so no catch-up pass is wider than its batch."""
    model.crop(common_prefix(model.ids, seq))
    if len(seq) - len(model.ids) > CATCH_UP_PASS:
        model.prefill(seq[:-1])
    pending = list(seq[len(model.ids) :])
    drafts: list[int] = []
    for _ in range(k):
        logits = model.next_logits(pending)
        if len(pending) == 1:
            if costs is not None:
                costs.observe_draft(model.step_times[-1])
            if step_times is not None:
                step_times.append(model.step_times[-1])
        # Ids past the target's vocabulary (a padded draft embedding) are never proposed.
        token = int(logits[:vocab_size].argmax())
        drafts.append(token)
        pending = [token]
    return drafts


class DraftModelDrafter:
    """Drafts from a draft model: k greedy steps on its own cache, k from adaptive K (or the preset's K)."""

    name = "model"
    probe_length = PROBE_LENGTH  # the draft a probe sends while no K pays (engine/decoding/adaptive_k.py)

    def __init__(
        self,
        model: CachedModel,
        vocab_size: int,
        costs: VerifyCostModel | None,
        tuner: AdaptiveK,
        adaptive: bool,
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.costs = costs  # the target's: its draft-model steps are timed into it (c)
        self.tuner = tuner
        self.adaptive = adaptive
        self.step_times: list[float] = []  # one-token draft steps only (a catch-up pass is wider)

    def begin(self, prompt: Sequence[int], cancel: threading.Event) -> None:
        if cancel.is_set():
            return
        self.model.step_times = []
        self.model.prefill(prompt[:-1], cancel)

    def plan(self, k: int, k_long: int) -> Plan:
        # Adaptive K's best rate at the per-position acceptance measured so far (no side effects: the K it sends,
        # probes included, is chosen in `draft`, only where this plan goes out). The steps come later: always
        # offered.
        rate = self.tuner.plan(k, self.costs)[1] if self.adaptive else 1.0
        return Plan(self, k, rate)

    def draft(self, plan: Plan, seq: Sequence[int]) -> list[int]:
        k = self.tuner.choose(plan.k, self.costs, probe_length=self.probe_length) if self.adaptive else plan.k
        if k <= 0:
            return []
        self.before_steps(plan)
        return draft_greedy(self.model, seq, k, self.vocab_size, self.costs, self.step_times)

    def before_steps(self, plan: Plan) -> None:
        """Called once a round drafts, before the model's steps (the MTP drafter's probes shorten its catch-up)."""

    def accept(self, drafted: int, accepted: int) -> None:
        self.tuner.record(drafted, accepted)  # the draft model's per-position acceptance

    def extend(self, token_ids: Sequence[int]) -> None:
        """Nothing: the draft's cache catches up at its next step (`draft_greedy`)."""

    def end(self, kept: Sequence[int]) -> None:
        self.model.crop(common_prefix(self.model.ids, kept))


def build(context: DraftContext) -> DraftModelDrafter:
    """The name map's factory (drafters/registry.py)."""
    if context.draft is None:
        raise ValueError("the draft-model drafter needs a loaded draft model")
    return DraftModelDrafter(
        context.draft, context.vocab_size, context.target.costs, context.tuner, context.adaptive
    )
