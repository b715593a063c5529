"""The MTP-head drafter: the model's own multi-token-prediction layer steps out k greedy tokens.

On llama.cpp the head is a second context on the target's model that follows the target's passes
(engine/backends/llamacpp/mtp.py); to the round loop it is a cached model like a draft model, so the drafter is the
draft-model drafter's greedy steps and adaptive K, under its own name (its rounds, stats and per-position acceptance
say "mtp"). ExLlamaV3 runs its MTP head inside its own generator instead.

Its probes (while no K pays) draft one token, not the draft model's two: a probe first feeds the head every token
since its last draft, then steps it, and each step carries the whole vocabulary's output row. Where nothing is
accepted, 64-token replies to short prompts ran 0.976x plain with two-token probes, 0.983-0.990x with one (the
random-weight Qwen3.5-0.8B-shaped Q4_K_M). After 400-700-token prompts the bench read 0.96x, most of it the probe's
catch-up of the whole prompt: a probe's head now skips all but the last MTP_PROBE_WINDOW tokens, and the bench reads
0.97-0.98x (docs/performance.md). An accepted probe still raises the next position's estimate (adaptive K's censored
update), so a head that recovers is drafted long again.

Where a K pays (or K is fixed), `begin` catches the head up on the prompt at once, inside the reply's prefill, as
llama-server's draft-mtp feeds its head the prompt while it prefills (vendored common/speculative.cpp, `process()`
from line 1470): the reply's first draft then steps at once instead of first taking a whole prompt in decode time.
Where none pays, the head stays lazy (a later probe takes a window only).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from engine.decoding.cost_model import MAX_DRAFT_LENGTH
from engine.decoding.drafters.base import DraftContext, Plan
from engine.decoding.drafters.draft_model import DraftModelDrafter

MTP_PROBE_LENGTH = 1
# A probe's head takes at most this many of the tokens it has not seen (the rest of a long prompt is skipped).
MTP_PROBE_WINDOW = 64

if TYPE_CHECKING:
    from engine.decoding.round_loop import CachedModel

    class MtpHeadModel(CachedModel, Protocol):
        """The head as the drafter drives it: a cached model that can skip what it lags behind (llamacpp/mtp.py)."""

        def skip_behind(self, keep: int) -> None: ...

        def catch_up(self, cancel: threading.Event | None = None) -> None: ...


class MtpDrafter(DraftModelDrafter):
    """Drafts from the model's MTP head (the context's `draft`): k greedy steps, k from adaptive K."""

    name = "mtp"
    probe_length = MTP_PROBE_LENGTH
    model: MtpHeadModel

    def begin(self, prompt: Sequence[int], cancel: threading.Event) -> None:
        """The head follows the target's prefill (the shared prefix is kept); where a K pays it takes the prompt
        now, in the prefill's time, rather than at the first draft step."""
        super().begin(prompt, cancel)
        if not self.adaptive or self.tuner.plan(MAX_DRAFT_LENGTH, self.costs)[0] > 0:
            self.model.catch_up(cancel)

    def before_steps(self, plan: Plan) -> None:
        """A probe (no K pays) first lets the head skip all but the last MTP_PROBE_WINDOW tokens it has not taken
        yet: a head that is not paying is not fed a whole prompt to be tested again. A head that pays is fed
        everything, as llama.cpp's draft-mtp feeds it. (Adaptive K's plan has no side effects: asked after the
        round's K was chosen, it says what it said before.)"""
        if self.adaptive and self.tuner.plan(plan.k, self.costs)[0] == 0:
            self.model.skip_behind(MTP_PROBE_WINDOW)


def build(context: DraftContext) -> MtpDrafter:
    """The name map's factory (drafters/registry.py)."""
    if context.draft is None:
        raise ValueError("the MTP drafter needs the model's MTP head loaded (--draft mtp)")
    return MtpDrafter(
        context.draft, context.vocab_size, context.target.costs, context.tuner, context.adaptive
    )
