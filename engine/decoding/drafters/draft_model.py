"""The draft-model drafter: a smaller model of the same tokenizer family steps out k greedy tokens on its own cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.decoding.drafters.base import common_prefix

if TYPE_CHECKING:
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
