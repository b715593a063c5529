"""The n-gram (prompt-lookup) drafter: drafts copied from earlier in the context, free of draft-model steps.

Lookup: a suffix automaton over the whole context (prompt + reply so far) finds the longest suffix of the context
that occurred before, and the most recent earlier place it ended; the draft is what followed there. Where the
source runs into the end of the context (a loop: "a b c a b c a b"), the copy continues through the draft itself.

Length: the drafter estimates the chance that each draft token is accepted from the match length
(`AcceptanceModel`, engine/decoding/adaptive_k.py) and picks the k, 0 included, that maximises expected tokens
per unit of time: E(k) / r(1 + k), E(k) = 1 + p1 + p1 p2 + ... (engine/decoding/cost_model.py). A draft goes out
only where that beats a plain step, so a prompt with nothing to look up runs at plain speed.
Pure python, no torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

from engine.decoding.adaptive_k import (
    PROBE_LENGTH,
    AcceptanceModel,
    AdaptiveK,
    best_length,
    match_bucket,
)
from engine.decoding.cost_model import MAX_DRAFT_LENGTH, FreeDraftCosts, VerifyCostModel
from engine.decoding.drafters.base import DraftContext, Plan

# Long-match mode (n-gram lookup, adaptive K): where the context's suffix matched at least LONG_MATCH tokens before
# (the text is being copied: a translation that keeps names and numbers, a summary quoting its source, code
# edited in place), the draft may run past the preset's K, up to LONG_DRAFT_MAX tokens, as far as that match's
# measured acceptance and the verify cost say it pays. llama.cpp's ngram-simple drafts 48 tokens after a
# 12-token match; 48 drafts make a 49-row pass, below the 64 rows where the patched build's attention changes path.
LONG_MATCH = 12
LONG_DRAFT_MAX = 48


def best_draft_length(
    acceptance: AcceptanceModel, costs: VerifyCostModel, bucket: int, k_max: int
) -> tuple[int, float]:
    """`best_length` for an n-gram match in `bucket` (up to LONG_DRAFT_MAX where k_max allows)."""
    first, following = acceptance.first(bucket), acceptance.next(bucket)
    expected = [1.0]
    chance = first
    for _ in range(min(k_max, LONG_DRAFT_MAX)):
        expected.append(expected[-1] + chance)
        chance *= following
    return best_length(expected.__getitem__, costs, k_max, LONG_DRAFT_MAX)


# --- lookup: an online suffix automaton ----------------------------------------------------------------


class SuffixIndex:
    """Online suffix automaton over a token sequence: the longest suffix that occurred before, and where.

    Each state also keeps the two most recent end positions it was seen at (updated along the new state's
    suffix-link path, at most `RECENCY_DEPTH` states deep: deeper ones keep an older, still valid, end).
    """

    RECENCY_DEPTH = 48

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._recent: list[int] = [0]
        self._previous: list[int] = [0]
        self._last = 0

    def _new_state(self, length: int, link: int, nxt: dict[int, int], recent: int, previous: int) -> int:
        self._next.append(nxt)
        self._link.append(link)
        self._len.append(length)
        self._recent.append(recent)
        self._previous.append(previous)
        return len(self._len) - 1

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self._add(token)

    def _add(self, token: int) -> None:
        self.tokens.append(token)
        end = len(self.tokens)
        cur = self._new_state(self._len[self._last] + 1, -1, {}, 0, 0)
        p = self._last
        while p != -1 and token not in self._next[p]:
            self._next[p][token] = cur
            p = self._link[p]
        if p == -1:
            self._link[cur] = 0
        else:
            q = self._next[p][token]
            if self._len[p] + 1 == self._len[q]:
                self._link[cur] = q
            else:
                clone = self._new_state(
                    self._len[p] + 1, self._link[q], dict(self._next[q]), self._recent[q], self._previous[q]
                )
                while p != -1 and self._next[p].get(token) == q:
                    self._next[p][token] = clone
                    p = self._link[p]
                self._link[q] = clone
                self._link[cur] = clone
        self._last = cur
        state, depth = cur, 0
        while state > 0 and depth < self.RECENCY_DEPTH:
            if self._recent[state] != end:
                self._previous[state] = self._recent[state]
                self._recent[state] = end
            state = self._link[state]
            depth += 1

    def longest_match(self) -> tuple[int, int]:
        """(length, end) of the longest suffix that also ended earlier, at `end` (< len); (0, 0) if none."""
        end_now = len(self.tokens)
        state = self._link[self._last] if self._last > 0 else -1
        while state > 0:
            end = self._recent[state] if self._recent[state] < end_now else self._previous[state]
            if 0 < end < end_now:
                return self._len[state], end
            state = self._link[state]
        return 0, 0

    def continuation(self, end: int, k: int) -> list[int]:
        """k tokens copied from `end` on; past the context's end the copy reads its own output (a loop)."""
        tokens, draft = self.tokens, []
        n = len(tokens)
        for j in range(k):
            pos = end + j
            draft.append(tokens[pos] if pos < n else draft[pos - n])
        return draft


# --- the drafter ----------------------------------------------------------------------------------------


class NgramDrafter:
    """Prompt-lookup drafting over one reply's context, with the cost-aware draft length.

    As a Drafter (drafters/base.py): `begin`, then per round `plan` / `draft`, and once the target has verified,
    `accept` and `extend`. The same steps by their own names: `reset(prompt_ids)`, `propose(k_max)`,
    `feedback(drafted, accepted)`, `extend(emitted_ids)`.
    """

    name = "ngram"

    def __init__(
        self,
        costs: VerifyCostModel | None = None,
        acceptance: AcceptanceModel | None = None,
        min_match: int = 1,
        *,
        fixed: bool = False,
        tuner: AdaptiveK | None = None,
    ) -> None:
        """`fixed`: draft exactly k_max tokens wherever a match is found (no cost model: K as configured).
        `tuner`: the preset's AdaptiveK, whose probe counter sends a short draft out now and then where the
        cost model backs off (so a match-length bucket that got a bad name can recover)."""
        self.costs = costs or VerifyCostModel()
        self.acceptance = acceptance or (tuner.ngram if tuner is not None else AcceptanceModel())
        self.min_match = min_match
        self.fixed = fixed
        self.tuner = tuner
        self.index = SuffixIndex()
        self._pending_bucket: int | None = None
        self.last_match_length = 0
        self.last_rate = 1.0  # the last proposal's expected tokens per unit of time, relative to plain
        # Long-match mode's own ceiling: twice the last round's drafts where it took them all, else nothing
        # (a copy has to prove itself round by round: a wrong 48-token draft costs a dozen plain steps).
        self.long_room = 0
        # The last proposal's long match would have drafted further than `k_long` allowed.
        self.wanted_longer = False
        self.step_times: list[float] = []  # this reply's lookups, in seconds

    @property
    def tokens(self) -> list[int]:
        return self.index.tokens

    def reset(self, prompt_ids: Iterable[int]) -> None:
        self.index = SuffixIndex()
        self.index.extend(prompt_ids)
        self._pending_bucket = None
        self.last_match_length = 0
        self.long_room = 0

    def extend(self, token_ids: Iterable[int]) -> None:
        self.index.extend(token_ids)

    def lookup(self, k: int) -> tuple[list[int], int]:
        """Up to `k` tokens following the longest earlier match of the context's suffix; and its length."""
        if k <= 0:
            return [], 0
        length, end = self.index.longest_match()
        if length < self.min_match or end <= 0:
            return [], 0
        return self.index.continuation(end, k), length

    def propose(self, k_max: int, k_long: int = 0) -> list[int]:
        """This round's draft: empty where no length pays (or nothing matches). `k_long` (> k_max): the most
        drafts the round could take (token budget, context, the backend's exact pass width); a match of
        LONG_MATCH tokens or more may draft up to it (long-match mode), cost model permitting."""
        self._pending_bucket = None
        self.last_match_length = 0
        self.last_rate = 1.0
        self.wanted_longer = False
        if k_max <= 0:
            return []
        length, end = self.index.longest_match()
        if length < self.min_match or end <= 0:
            return []
        bucket = match_bucket(length)
        if self.fixed:
            k = k_max
        else:
            ceiling = min(k_max, MAX_DRAFT_LENGTH)
            if length >= LONG_MATCH and min(k_long, self.long_room) > ceiling:
                ceiling = min(k_long, self.long_room, LONG_DRAFT_MAX)
            self.wanted_longer = length >= LONG_MATCH and min(self.long_room, LONG_DRAFT_MAX) > max(k_long, 0)
            k, self.last_rate = best_draft_length(self.acceptance, self.costs, bucket, ceiling)
            if k == 0 and self.tuner is not None and self.tuner.probe_due(k_max, self.costs):
                k = min(PROBE_LENGTH, k_max)
            elif k > 0 and self.tuner is not None:
                self.tuner.drafting()
        if k == 0:
            return []
        self._pending_bucket = bucket
        self.last_match_length = length
        return self.index.continuation(end, k)

    def feedback(self, drafted: int, accepted: int) -> None:
        """Learn from the round that verified the last proposal."""
        if self._pending_bucket is not None and drafted > 0:
            self.acceptance.record(self._pending_bucket, drafted, accepted)
            self.long_room = min(2 * drafted, LONG_DRAFT_MAX) if accepted >= drafted else 0
        self._pending_bucket = None

    # --- the Drafter interface (drafters/base.py) ---

    def begin(self, prompt: Sequence[int], cancel: threading.Event) -> None:
        self.reset(prompt)

    def plan(self, k: int, k_long: int) -> Plan:
        start = time.perf_counter()
        tokens = self.propose(k, k_long)
        self.step_times.append(time.perf_counter() - start)
        return Plan(self, k, self.last_rate, tokens, self.wanted_longer)

    def draft(self, plan: Plan, seq: Sequence[int]) -> list[int]:
        return plan.tokens or []

    def accept(self, drafted: int, accepted: int) -> None:
        self.feedback(drafted, accepted)
        if self.tuner is not None:
            self.tuner.record(
                drafted, accepted
            )  # drafting alone, it keeps the preset's per-position acceptance

    def end(self, kept: Sequence[int]) -> None:
        """Nothing to drop: the index is this reply's."""


def build(context: DraftContext) -> NgramDrafter:
    """The name map's factory (drafters/registry.py). Alone: the preset's K, cost-aware where K is adaptive, with
    probes and the preset's per-position acceptance. Beside a draft model: its drafts take no draft-model steps
    (c = 0), it learns per match length only, and a round takes it where it promises more than the model."""
    target, tuner = context.target, context.tuner
    if context.beside:
        return NgramDrafter(costs=FreeDraftCosts(target.costs), acceptance=tuner.ngram)
    return NgramDrafter(costs=target.costs, fixed=not context.adaptive, tuner=tuner)


def propose_from(context: Sequence[int], k: int, min_match: int = 1) -> list[int]:
    """One-shot lookup without a cost model (tests and peers): what follows the longest earlier match."""
    drafter = NgramDrafter(min_match=min_match)
    drafter.reset(context)
    return drafter.lookup(k)[0]
