"""The MTP-head drafter: the model's own multi-token-prediction layer steps out k greedy tokens.

On llama.cpp the head is a second context on the target's model that follows the target's passes
(engine/backends/llamacpp/mtp.py); to the round loop it is a cached model like a draft model, so the drafter is the
draft-model drafter's greedy steps and adaptive K, under its own name (its rounds, stats and per-position acceptance
say "mtp"). ExLlamaV3 runs its MTP head inside its own generator instead.

Its probes (while no K pays) draft one token, not the draft model's two: a probe first feeds the head every token
since its last draft, then steps it, and each step carries the whole vocabulary's output row. Where nothing is
accepted, 64-token replies to short prompts ran 0.976x plain with two-token probes, 0.983-0.990x with one (the
random-weight Qwen3.5-0.8B-shaped Q4_K_M; after 400-700-token prompts the bench still reads 0.96x:
docs/performance.md). An accepted probe still raises the next position's estimate (adaptive K's censored update), so
a head that recovers is drafted long again.
"""

from __future__ import annotations

from engine.decoding.drafters.base import DraftContext
from engine.decoding.drafters.draft_model import DraftModelDrafter

MTP_PROBE_LENGTH = 1


class MtpDrafter(DraftModelDrafter):
    """Drafts from the model's MTP head (the context's `draft`): k greedy steps, k from adaptive K."""

    name = "mtp"
    probe_length = MTP_PROBE_LENGTH


def build(context: DraftContext) -> MtpDrafter:
    """The name map's factory (drafters/registry.py)."""
    if context.draft is None:
        raise ValueError("the MTP drafter needs the model's MTP head loaded (--draft mtp)")
    return MtpDrafter(
        context.draft, context.vocab_size, context.target.costs, context.tuner, context.adaptive
    )
