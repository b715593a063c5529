"""The MTP-head drafter: the model's own multi-token-prediction layer steps out k greedy tokens.

On llama.cpp the head is a second context on the target's model that follows the target's passes
(engine/backends/llamacpp/mtp.py); to the round loop it is a cached model like a draft model, so the drafter is the
draft-model drafter's greedy steps and adaptive K, under its own name (its rounds, stats and per-position acceptance
say "mtp"). ExLlamaV3 runs its MTP head inside its own generator instead.
"""

from __future__ import annotations

from engine.decoding.drafters.base import DraftContext
from engine.decoding.drafters.draft_model import DraftModelDrafter


class MtpDrafter(DraftModelDrafter):
    """Drafts from the model's MTP head (the context's `draft`): k greedy steps, k from adaptive K."""

    name = "mtp"


def build(context: DraftContext) -> MtpDrafter:
    """The name map's factory (drafters/registry.py)."""
    if context.draft is None:
        raise ValueError("the MTP drafter needs the model's MTP head loaded (--draft mtp)")
    return MtpDrafter(
        context.draft, context.vocab_size, context.target.costs, context.tuner, context.adaptive
    )
