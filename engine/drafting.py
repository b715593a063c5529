"""The n-gram (prompt-lookup) drafter, for backends and models without a draft model.

It proposes the tokens that followed the most recent earlier occurrence of the context's last n tokens. On a
CPU a wasted draft is not free: measured on SmolLM2-135M (2 cores), a verify pass of 2 positions costs about
1.7x a plain step, and 3 to 8 positions about 1.7-2x (small-M matrix products stop being matrix-vector ones).
So the first drafted token is the expensive one and a drafted round pays only when about one token or more is
accepted. The drafter backs off where lookups do not pay: single-token matches are never used, 2-token matches
only right after a round that accepted something, the draft length halves after a round with nothing accepted
(but not below a floor: short drafts save almost nothing) and grows again after full acceptance, and a run of
misses puts it into a cool-down (plain steps) that ends with a short re-probe. Pure python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The adaptive length never needs to exceed any sensible K.
MAX_DRAFT_LENGTH = 64


@dataclass(frozen=True, slots=True)
class DraftPolicy:
    """Knobs of the back-off; the defaults were measured on SmolLM2-135M on 2 CPU cores."""

    max_ngram: int = 4
    # A 1-token match predicts the next token too rarely to pay for the longer verify pass.
    min_ngram: int = 2
    # Matches shorter than this are drafted only while the last drafted round accepted something.
    strong_ngram: int = 3
    # Shortest adaptive draft length: a verify pass of 2 positions costs nearly what one of 5 does.
    min_draft_length: int = 3
    # Consecutive rounds with nothing accepted before the drafter goes quiet.
    misses_before_cooldown: int = 2
    # Plain steps in the first cool-down; doubles with each cool-down in a row, up to the cap.
    cooldown_rounds: int = 4
    max_cooldown_rounds: int = 32
    # Draft length of the probe that ends a cool-down.
    probe_length: int = 2


class NgramDrafter:
    """Prompt-lookup drafting over one reply's context (prompt + emitted tokens), with adaptive length.

    Use: `reset(prompt_ids)`, then per round `propose(k)` and, once the target has verified,
    `feedback(drafted, accepted)` and `extend(emitted_ids)`.
    """

    def __init__(self, policy: DraftPolicy | None = None) -> None:
        self.policy = policy or DraftPolicy()
        if self.policy.min_ngram < 1 or self.policy.max_ngram < self.policy.min_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.tokens: list[int] = []
        # One index per n: n-gram -> end (exclusive) of its most recent occurrence that has a following token.
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed_upto = 0
        self._length_cap: int | None = None
        self._miss_streak = 0
        self._cooldown_left = 0
        self._cooldowns_in_a_row = 0
        self._probing = False
        self._hot = True

    # --- context ----------------------------------------------------------------------------------------

    def reset(self, prompt_ids: Iterable[int]) -> None:
        self.tokens = list(prompt_ids)
        self._index = {n: {} for n in range(self.policy.min_ngram, self.policy.max_ngram + 1)}
        self._indexed_upto = 0
        self._length_cap = None
        self._miss_streak = 0
        self._cooldown_left = 0
        self._cooldowns_in_a_row = 0
        self._probing = False
        self._hot = True

    def extend(self, token_ids: Iterable[int]) -> None:
        self.tokens.extend(token_ids)

    def _catch_up_index(self) -> None:
        # Register every n-gram that ends before the last token, so each entry has a continuation; the
        # context's own suffix (ending at len(tokens)) is never its own match.
        tokens = self.tokens
        stop = len(tokens)
        for end in range(max(self._indexed_upto, self.policy.min_ngram), stop):
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(tokens[end - n : end])] = end
        self._indexed_upto = max(self._indexed_upto, stop)

    def lookup(self, k: int) -> tuple[list[int], int]:
        """Up to `k` tokens that followed the longest (n >= min_ngram) recent match; and that n (0: none)."""
        if k <= 0:
            return [], 0
        self._catch_up_index()
        tokens = self.tokens
        for n in range(self.policy.max_ngram, self.policy.min_ngram - 1, -1):
            if len(tokens) <= n:
                continue
            end = self._index[n].get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + k], n
        return [], 0

    # --- policy -----------------------------------------------------------------------------------------

    def draft_length(self, k: int) -> int:
        """How many tokens this round may draft, given the request's K and the recent record."""
        if k <= 0 or self._cooldown_left > 0:
            return 0
        if self._probing:
            return min(k, self.policy.probe_length)
        return k if self._length_cap is None else min(k, self._length_cap)

    def propose(self, k: int) -> list[int]:
        """The draft for this round (possibly empty). Counts a cool-down round when it is quiet."""
        length = self.draft_length(k)
        if length == 0:
            if self._cooldown_left > 0:
                self._cooldown_left -= 1
                if self._cooldown_left == 0:
                    self._probing = True
            return []
        draft, n = self.lookup(length)
        if n < self.policy.strong_ngram and not self._hot:
            return []
        return draft

    def feedback(self, drafted: int, accepted: int) -> None:
        """Adapt to the outcome of a round that drafted `drafted` tokens, of which `accepted` were kept."""
        if drafted <= 0:
            return
        self._hot = accepted > 0
        floor = self.policy.min_draft_length
        cap = self._length_cap if self._length_cap is not None else drafted
        if accepted == 0:
            self._miss_streak += 1
            self._length_cap = max(1, floor, min(cap, drafted) // 2)
            if self._probing or self._miss_streak >= self.policy.misses_before_cooldown:
                self._cooldowns_in_a_row += 1
                self._cooldown_left = min(
                    self.policy.max_cooldown_rounds,
                    self.policy.cooldown_rounds * 2 ** (self._cooldowns_in_a_row - 1),
                )
                self._miss_streak = 0
            self._probing = False
            return
        self._miss_streak = 0
        self._cooldowns_in_a_row = 0
        self._probing = False
        if accepted >= drafted:
            self._length_cap = min(MAX_DRAFT_LENGTH, max(cap, drafted) * 2)
        else:
            # Partly accepted: the useful length is about what was kept, plus one to keep probing upwards.
            self._length_cap = max(floor, accepted + 1)


def propose_from(context: Sequence[int], k: int, max_ngram: int = 4, min_ngram: int = 2) -> list[int]:
    """One-shot prompt lookup without state (for tests and peers): the draft `NgramDrafter.lookup` gives."""
    drafter = NgramDrafter(DraftPolicy(max_ngram=max_ngram, min_ngram=min_ngram))
    drafter.reset(context)
    return drafter.lookup(k)[0]
