"""Best-of timings of verify passes, measured once per process for a model as loaded.

A load times passes twice: the cost model's prior (`LlamaCppBackend._calibrate`: widths up to the widest pass the
loop sends, over 64 cached tokens) and the busy-CPU guard's idea of an idle machine (`ThreadControl.
measure_pass_cost`: 1, 9 and the widest, over 64 and ~576 cached tokens), and the draft model's one-token step.
On the Qwen2.5-Coder pair that is ~34 of a 42 s load on 2 cores, and every reload of the same model paid it again:
F12 switching drafters, a benchmark's second backend, each test module. Here each (width, cached tokens) is timed
once, both consumers read the same figure (the 64-token timings are no longer taken twice), and a later load of
the same model as loaded (file, llama.cpp build, CPU flags, repacking, cache type, thread count, context, padded
plain steps, rollback, MTP head) in the same process reads them instead of timing again. Live passes refine the
cost model and the guard as before (`VerifyCostModel.observe`, `PassCost.learn`): these are priors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

# Rounds of each width, the best kept (a disturbed sample is dropped, not averaged in).
ROUNDS = 3
DRAFT_ROUNDS = 4

_kept: dict[str, PassTimings] = {}


class PassTimings:
    """Seconds of a pass of `width` tokens over `context` cached tokens (best of ROUNDS), and draft steps."""

    def __init__(self) -> None:
        self.best: dict[tuple[int, int], float] = {}
        self.draft_steps: dict[str, float] = {}

    @classmethod
    def kept(cls, key: str | None) -> PassTimings:
        """The process's timings for `key` (made on first use); a fresh, unshared one where key is None (a test's
        planted kernel: its timings are not the model's)."""
        if key is None:
            return cls()
        return _kept.setdefault(key, cls())

    def passes(self, target, widths: Sequence[int], context: int) -> dict[int, float]:
        """Best-of seconds by width over `context` cached tokens; only widths not timed before are decoded (on an
        emptied cache, left empty)."""
        missing = [w for w in dict.fromkeys(widths) if (w, context) not in self.best]
        if missing:
            filler = [(7 + 13 * i) % max(target.n_vocab - 1, 1) + 1 for i in range(context + max(missing))]
            try:
                target.clear()
                target.prefill(filler[:context])
                for _ in range(ROUNDS):
                    for width in missing:
                        tokens = filler[context : context + width]  # one token: padded where plain steps are
                        start = time.perf_counter()
                        target.decode(tokens, outputs=len(tokens))
                        seconds = time.perf_counter() - start
                        self.best[(width, context)] = min(self.best.get((width, context), seconds), seconds)
                        target.crop(context)
            finally:
                target.clear()
        return {w: self.best[(w, context)] for w in widths}

    def draft_step(self, key: str, draft, feeder) -> float:
        """Best-of seconds of the draft's one-token step over 64 cached tokens (`feeder` fills the cache: the draft
        model itself, or the target where an MTP head follows its decodes)."""
        if key not in self.draft_steps:
            filler = [(7 + 13 * i) % max(draft.n_vocab - 1, 1) + 1 for i in range(65)]
            best = float("inf")
            try:
                feeder.clear()
                feeder.prefill(filler[:64])
                for _ in range(DRAFT_ROUNDS):
                    start = time.perf_counter()
                    draft.next_logits(filler[64:65])
                    best = min(best, time.perf_counter() - start)
                    draft.crop(64)
            finally:
                feeder.clear()
            self.draft_steps[key] = best
        return self.draft_steps[key]


def forget() -> None:
    """Drop every kept timing (tests that need a first load again)."""
    _kept.clear()
