"""The n-gram (prompt-lookup) drafter and the cost model that decides whether a draft pays, for every backend.

Lookup: a suffix automaton over the whole context (prompt + reply so far) finds the longest suffix of the context
that occurred before, and the most recent earlier place it ended; the draft is what followed there. Where the
source runs into the end of the context (a loop: "a b c a b c a b"), the copy continues through the draft itself.

Length: on a CPU a draft is not free. A verify pass of 1 + k tokens costs r(1 + k) plain steps, measured per
load and kept up to date from every pass (`VerifyCostModel`). The drafter estimates the chance that each draft
token is accepted from the match length (longer matches predict better) and what drafts of that match length
did so far (one estimate per length bucket, learnt across replies), and picks the k, 0 included, that maximises
expected tokens per unit of time: E(k) / r(1 + k), E(k) = 1 + p1 + p1 p2 + ... A draft goes out only where
that beats a plain step, so a prompt with nothing to look up runs at plain speed.

Adaptive K (`AdaptiveK`, one per preset): the same rule for every drafter. Per draft position it keeps the
chance that the position is accepted given the ones before it were (a decaying average, seeded from the metrics
log), and before each round picks the k, 0 included, with the most expected tokens per unit of time, where a
round costs its verify pass r(1 + k) plus k draft-model steps (`VerifyCostModel.draft_ratio`). While no k pays,
a short probe draft goes out every `PROBE_INTERVAL` rounds, so a draft that recovers is noticed, but only where
drafting could pay at a high acceptance (`PROBE_ACCEPTANCE`: a draft as slow as the target never does, nor, on
a compute-bound CPU, a draft model half as fast).
Pure python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.events import StopReason

# Longest draft the cost model considers (a verify pass wider than this is extrapolated, never measured).
MAX_DRAFT_LENGTH = 16
# Long-match mode (n-gram lookup, adaptive K): where the context's suffix matched at least LONG_MATCH tokens before
# (the text is being copied: a translation that keeps names and numbers, a summary quoting its source, code
# edited in place), the draft may run past the preset's K, up to LONG_DRAFT_MAX tokens, as far as that match's
# measured acceptance and the verify cost say it pays. llama.cpp's ngram-simple drafts 48 tokens after a
# 12-token match; 48 drafts make a 49-row pass, below the 64 rows where the patched build's attention changes path.
LONG_MATCH = 12
LONG_DRAFT_MAX = 48
# Match-length buckets: a suffix match of length L falls in the first bucket whose bound is >= L.
MATCH_BUCKETS = (1, 2, 3, 5, 9, 17, 33, math.inf)
# Prior chance that the first draft token is accepted, per bucket, and that a later one is, given the ones
# before it were. Measured with SmolLM2-135M, greedy, K 4, drafting every match, on the public bench prompts
# (never the held-out ones): 264 one-token matches accepted 15%, 35 two-token ones 34%, 40 of 6+ tokens
# 78-100%, later positions 78% (205 tried); the sparse middle buckets are interpolated.
FIRST_TOKEN_PRIOR = (0.15, 0.34, 0.5, 0.65, 0.8, 0.8, 0.9, 0.95)
NEXT_TOKEN_PRIOR = 0.78
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior: a few misses outweigh it
# A draft must beat a plain step by this fraction of its time (noise in the cost estimates).
MIN_GAIN = 0.03
# Adaptive K: rounds without drafting between probes, and the probe's draft length (ExLlamaV3's defaults).
PROBE_INTERVAL = 16
PROBE_LENGTH = 2
# Probes go out only where drafting would pay at this acceptance per position: a probe costs more than its
# verify pass (a draft model first catches up on the tokens it skipped), so where only a draft that is never
# wrong could pay (Qwen2.5-Coder 0.5B for 1.5B on 2 cores: c 0.5, r(2) 1.6), probing is pure loss.
PROBE_ACCEPTANCE = 0.9
# Per-position acceptance: the prior chance a position is accepted given the earlier ones were, how many rounds
# of evidence it counts as (a seed from the metrics log counts as more), and how fast old rounds fade
# (each round's evidence is multiplied by this: about the last 10 rounds dominate).
POSITION_PRIOR = 0.7
POSITION_PRIOR_ROUNDS = 2.0
SEED_PRIOR_ROUNDS = 4.0
POSITION_MEMORY = 0.9
# A round that accepted all of its d drafts says nothing about position d + 1 (censored); it counts as one
# round of evidence that position d + 1 behaves like position d, so the window can grow again (ExLlamaV3 counts
# a fully accepted window as one more token accepted, for the same reason).
CENSORED_WEIGHT = 1.0


def _bucket(match_length: int) -> int:
    for index, bound in enumerate(MATCH_BUCKETS):
        if match_length <= bound:
            return index
    return len(MATCH_BUCKETS) - 1


# --- verify cost ---------------------------------------------------------------------------------------


class VerifyCostModel:
    """Forward-pass cost by width (tokens in the pass), relative to a one-token pass.

    Seeded by a calibration at load and refined by every pass the backend times. Each multi-token pass is
    compared with the recent one-token passes (a fast-moving average), not with an old figure, so a change
    in the machine's load moves both sides of the ratio alike. Ratios are bounded to 1..width plain steps, and
    widths never seen are interpolated linearly between the nearest seen ones, extrapolated with the last slope.

    With a context shape (`set_context_shape`: seconds a pass of a width takes over so many cached tokens, e.g.
    the llama.cpp backend's PassCost), the ratios are kept at the shape's reference context and read at
    `context`, the cached tokens of the latest pass: every query row attends over the whole cache, so a wide
    pass costs more plain steps at 2k cached tokens than at 64 (r(9) 2.2 -> 3.6 on a Zen 4 EPYC).
    """

    EMA_WEIGHT = 0.1  # for the ratios
    ONE_WEIGHT = 0.3  # for the recent one-token time

    DRAFT_WEIGHT = 0.2  # for the draft-model step time

    def __init__(
        self,
        ratios: dict[int, float] | None = None,
        one_token_s: float | None = None,
        draft_ratio: float | None = None,
    ) -> None:
        self._ratios: dict[int, float] = {1: 1.0}
        for width, ratio in (ratios or {}).items():
            if width > 1:
                self._ratios[width] = min(max(ratio, 1.0), float(width))
        self._one = one_token_s
        # Cached tokens under the one-token passes `_one` follows (with a context shape).
        self._one_context = 0
        # A draft-model step: measured seconds (EMA), or a given ratio to a plain step (tests, fixed peers).
        self._draft_s: float | None = None
        self._fixed_draft_ratio = draft_ratio
        self.context = 0  # cached tokens of the latest pass (where a context shape is set)
        self._shape: Callable[[int, int], float] | None = None
        self._shape_context = 0

    def set_context_shape(self, seconds: Callable[[int, int], float], reference_context: int) -> None:
        """Read the ratios at `context` through `seconds(width, cached tokens)`; the ratios held are those at
        `reference_context` (where the load calibration ran)."""
        self._shape = seconds
        self._shape_context = reference_context
        self._one_context = reference_context  # the one-token time held is the calibration's

    def _context_factor(self, width: int) -> float:
        """How much more (or less) a pass of `width` costs in plain steps at `context` than at the reference."""
        shape = self._shape
        if shape is None or width <= 1:
            return 1.0
        one_here, one_ref = shape(1, self.context), shape(1, self._shape_context)
        wide_ref = shape(width, self._shape_context)
        if min(one_here, one_ref, wide_ref) <= 0:
            return 1.0
        return (shape(width, self.context) / one_here) / (wide_ref / one_ref)

    @classmethod
    def from_samples(cls, seconds_by_width: dict[int, float]) -> VerifyCostModel:
        """From best-of timings per width (a disturbed width is bounded to 1..w plain steps)."""
        one = seconds_by_width.get(1)
        if not one or one <= 0:
            return cls()
        return cls({w: s / one for w, s in seconds_by_width.items() if s > 0}, one)

    @classmethod
    def from_ratios(cls, ratios: dict[int, float], draft_ratio: float | None = None) -> VerifyCostModel:
        """A model from relative costs, e.g. {1: 1.0, 2: 1.1, 6: 1.3} (tests and fixed-cost peers); with
        `draft_ratio`, a draft-model step costs that many plain steps."""
        return cls(dict(ratios), draft_ratio=draft_ratio)

    @property
    def one_token_s(self) -> float | None:
        """A one-token pass's recent time, at the latest pass's context."""
        return self._one_here()

    def observe_draft(self, seconds: float) -> None:
        """One draft-model step (a one-token forward of the draft) took `seconds`."""
        if seconds <= 0:
            return
        old = self._draft_s
        self._draft_s = seconds if old is None else old + self.DRAFT_WEIGHT * (seconds - old)

    def draft_ratio(self) -> float:
        """A draft-model step in plain target steps (c); 0.0 where no draft model was timed (n-gram: free)."""
        if self._fixed_draft_ratio is not None:
            return self._fixed_draft_ratio
        if self._draft_s is None or not self._one:
            return 0.0
        return self._draft_s / self._one

    def observe(self, width: int, seconds: float) -> None:
        if width < 1 or seconds <= 0:
            return
        if width == 1:
            one = self._one_here()
            self._one = seconds if one is None else one + self.ONE_WEIGHT * (seconds - one)
            self._one_context = self.context
            return
        one = self._one_here()
        if one is None:
            return
        factor = self._context_factor(width)
        sample = min(max(seconds / one / factor, 1.0), float(width))
        old = self._ratios.get(width)
        self._ratios[width] = sample if old is None else old + self.EMA_WEIGHT * (sample - old)

    def _one_here(self) -> float | None:
        """The recent one-token time, read at `context`: where every round drafts (a long copy), the last one-token
        pass ran over a shorter cache, and a wide pass compared with it would look dearer than it is."""
        shape, one = self._shape, self._one
        if shape is None or one is None or self._one_context == self.context:
            return one
        then, now = shape(1, self._one_context), shape(1, self.context)
        return one * now / then if then > 0 and now > 0 else one

    def ratio(self, width: int) -> float:
        """t(width) / t(1) at `context`, between 1 and width; 1 + 0.1 per extra token where no width above 1 was
        measured yet."""
        if width <= 1:
            return 1.0
        return min(max(self._reference_ratio(width) * self._context_factor(width), 1.0), float(width))

    def _reference_ratio(self, width: int) -> float:
        known = sorted(self._ratios)
        if width in self._ratios:
            return self._ratios[width]
        if len(known) == 1:
            return 1.0 + 0.1 * (width - 1)
        below = [w for w in known if w < width]
        above = [w for w in known if w > width]
        if above:
            a, b = below[-1], above[0]
        else:
            a, b = known[-2], known[-1]
        slope = (self._ratios[b] - self._ratios[a]) / (b - a)
        return max(self._ratios[a] + slope * (width - a), 1.0)

    def as_dict(self) -> dict[int, float]:
        return dict(sorted(self._ratios.items()))


def round_cost(
    costs: VerifyCostModel | None, drafted: int, draft_step_s: float = 0.0, target_step_s: float = 0.0
) -> float:
    """What a round with `drafted` drafts costs in plain steps: its verify pass, plus draft-model steps
    (`draft_step_s` / `target_step_s`: mean step times, 0 where there is no draft model)."""
    cost = costs.ratio(1 + drafted) if costs is not None else 1.0
    if drafted and draft_step_s > 0 and target_step_s > 0:
        cost += drafted * draft_step_s / target_step_s
    elif drafted and costs is not None:
        cost += drafted * costs.draft_ratio()
    return cost


def round_limit(
    *, cancelled: bool, produced: int, max_new: int, context_used: int, max_context: int, k_requested: int
) -> tuple[StopReason | None, int]:
    """Before a decoding round: why the reply stops here, or else the most drafts the round may use.

    A round emits at most k + 1 tokens, so it never drafts past the token budget or the context (`context_used`:
    prompt + reply so far; the last token still needs its position)."""
    if cancelled:
        return "cancelled", 0
    remaining = max_new - produced
    if remaining <= 0:
        return "max_new_tokens", 0
    room = max_context - context_used
    if room <= 0:
        return "context", 0
    return None, min(k_requested, remaining - 1, room - 1)


# --- acceptance estimates ------------------------------------------------------------------------------


@dataclass
class AcceptanceModel:
    """Per match-length bucket: how often drafts were accepted at their first position, and later ones.

    Kept by the backend across replies (same model, same kind of text), so the second reply starts informed.
    """

    first_drafted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    first_accepted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    next_drafted: float = 0.0
    next_accepted: float = 0.0
    # Later positions per bucket too: a copy found by a long match stays right far longer than a one-token guess.
    next_drafted_by: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    next_accepted_by: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))

    def first(self, bucket: int) -> float:
        prior = FIRST_TOKEN_PRIOR[bucket]
        return (self.first_accepted[bucket] + PRIOR_WEIGHT * prior) / (
            self.first_drafted[bucket] + PRIOR_WEIGHT
        )

    def next(self, bucket: int | None = None) -> float:
        """The chance a later draft position is accepted given the ones before it were: over all buckets, or
        for `bucket`, whose own rounds count against the pooled figure as prior."""
        pooled = (self.next_accepted + PRIOR_WEIGHT * NEXT_TOKEN_PRIOR) / (self.next_drafted + PRIOR_WEIGHT)
        if bucket is None:
            return pooled
        return (self.next_accepted_by[bucket] + PRIOR_WEIGHT * pooled) / (
            self.next_drafted_by[bucket] + PRIOR_WEIGHT
        )

    def record(self, bucket: int, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.first_drafted[bucket] += 1
        self.first_accepted[bucket] += 1 if accepted > 0 else 0
        # Positions 2..k were "tried" only if everything before them was accepted.
        tried_next = min(drafted - 1, accepted)
        accepted_next = min(accepted - 1, tried_next) if accepted > 0 else 0
        self.next_drafted += tried_next
        self.next_accepted += accepted_next
        self.next_drafted_by[bucket] += tried_next
        self.next_accepted_by[bucket] += accepted_next

    def expected_tokens(self, bucket: int, k: int) -> float:
        """1 + p1 + p1 p2 + ... + p1 ... pk: tokens a round emits on average with a k-token draft."""
        total, chance = 1.0, self.first(bucket)
        following = self.next(bucket)
        for _ in range(k):
            total += chance
            chance *= following
        return total


def best_length(
    expected_tokens: Callable[[int], float],
    costs: VerifyCostModel,
    k_max: int,
    longest: int = MAX_DRAFT_LENGTH,
) -> tuple[int, float]:
    """The k in 0..min(k_max, longest) with the most expected tokens per unit of time, and that rate relative
    to plain.

    A round of k drafts costs `round_cost(costs, k)`: its verify pass and k draft-model steps (none for n-gram).
    """
    best_k, best_rate = 0, 1.0
    for k in range(1, min(k_max, longest) + 1):
        rate = expected_tokens(k) / round_cost(costs, k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return (best_k, best_rate) if best_rate >= 1.0 + MIN_GAIN else (0, 1.0)


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


def drafting_can_pay(costs: VerifyCostModel | None, k_max: int) -> bool:
    """Would some k <= k_max pay at PROBE_ACCEPTANCE per position? (Not for a draft as slow as the target, nor
    for a half-as-fast draft on a compute-bound CPU, where a verify pass of 2 costs 1.6 plain steps.)"""
    if costs is None:
        return True
    return best_length(lambda k: sum(PROBE_ACCEPTANCE**i for i in range(k + 1)), costs, k_max)[0] > 0


def conditional_from_per_position(per_position: Sequence[float]) -> list[float]:
    """r_i (rounds with >= i accepted / rounds that drafted >= i) -> q_i, the chance of position i given i-1."""
    conditional, previous = [], 1.0
    for rate in per_position:
        rate = min(max(float(rate), 0.0), 1.0)
        conditional.append(min(rate / previous, 1.0) if previous > 0 else 0.0)
        previous = rate
    return conditional


class AdaptiveK:
    """Adaptive K for one preset: per-position acceptance estimates and the K that pays most, per round.

    Position i's estimate q_i (accepted, given positions 1..i-1 were) is a sum of evidence that fades by
    `POSITION_MEMORY` per round that tried the position, started from a prior worth a few rounds: the seed from
    the metrics log (`prior`: per-position rates r_i as the log keeps them) or `POSITION_PRIOR`. Expected tokens
    of a k-draft round: E(k) = 1 + q_1 + q_1 q_2 + ... + q_1...q_k; the K picked maximises E(k) / round cost.
    The same object keeps the n-gram drafter's per-match-length model (`ngram`) for this preset.
    """

    def __init__(self, prior: Sequence[float] = (), probe_interval: int = PROBE_INTERVAL) -> None:
        seeded = conditional_from_per_position(prior)[:MAX_DRAFT_LENGTH]
        fill = seeded[-1] if seeded else POSITION_PRIOR
        start = seeded + [fill] * (MAX_DRAFT_LENGTH - len(seeded))
        # Positions the log measured count as more evidence than the ones extrapolated past them.
        weights = [SEED_PRIOR_ROUNDS] * len(seeded) + [POSITION_PRIOR_ROUNDS] * (
            MAX_DRAFT_LENGTH - len(seeded)
        )
        self._accepted = [w * q for w, q in zip(weights, start, strict=True)]
        self._tried = weights
        self.seeded = bool(seeded)
        self.probe_interval = probe_interval
        self.skipped = 0  # rounds in a row that drafted nothing because nothing paid
        self.probes = 0
        self.ngram = AcceptanceModel()

    def conditional(self) -> list[float]:
        return [a / t for a, t in zip(self._accepted, self._tried, strict=True)]

    def per_position(self, k: int | None = None) -> list[float]:
        """Estimated r_i: the chance that a round accepts at least i drafts, i = 1..k."""
        rates, chance = [], 1.0
        for q in self.conditional()[: k or MAX_DRAFT_LENGTH]:
            chance *= q
            rates.append(chance)
        return rates

    def expected_tokens(self, k: int) -> float:
        return 1.0 + sum(self.per_position(k)) if k > 0 else 1.0

    def record(self, drafted: int, accepted: int) -> None:
        """Learn from a verified round that drafted `drafted` and accepted the first `accepted` of them."""
        if drafted <= 0:
            return
        drafted = min(drafted, MAX_DRAFT_LENGTH)
        # Position i was tried if positions 1..i-1 were accepted.
        for i in range(min(drafted, accepted + 1)):
            self._accepted[i] = POSITION_MEMORY * self._accepted[i] + (1.0 if i < accepted else 0.0)
            self._tried[i] = POSITION_MEMORY * self._tried[i] + 1.0
        if accepted >= drafted and drafted < MAX_DRAFT_LENGTH:
            q_last = self._accepted[drafted - 1] / self._tried[drafted - 1]
            self._accepted[drafted] = POSITION_MEMORY * self._accepted[drafted] + CENSORED_WEIGHT * q_last
            self._tried[drafted] = POSITION_MEMORY * self._tried[drafted] + CENSORED_WEIGHT

    def plan(self, k_max: int, costs: VerifyCostModel | None) -> tuple[int, float]:
        """The K (0..k_max) with the most expected tokens per unit of time, and that rate; no side effects."""
        if k_max <= 0:
            return 0, 1.0
        return best_length(self.expected_tokens, costs or VerifyCostModel(), k_max)

    def probe_due(self, k_max: int, costs: VerifyCostModel | None, rounds: int = 1) -> bool:
        """Count `rounds` that drafted nothing; True (and start counting again) when a probe should go out."""
        if k_max <= 0:
            return False
        self.skipped += rounds
        if self.skipped < self.probe_interval or not drafting_can_pay(costs, k_max):
            return False
        self.skipped = 0
        self.probes += 1
        return True

    def choose(self, k_max: int, costs: VerifyCostModel | None) -> int:
        """This round's K: the best-paying one, else 0, else (every `probe_interval` rounds) a short probe."""
        k, _ = self.plan(k_max, costs)
        if k > 0:
            self.skipped = 0
            return k
        return min(PROBE_LENGTH, k_max) if self.probe_due(k_max, costs) else 0


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

    Use: `reset(prompt_ids)`, then per round `propose(k_max)` and, once the target has verified,
    `feedback(drafted, accepted)` and `extend(emitted_ids)`.
    """

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
        bucket = _bucket(length)
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
                self.tuner.skipped = 0
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


def propose_from(context: Sequence[int], k: int, min_match: int = 1) -> list[int]:
    """One-shot lookup without a cost model (tests and peers): what follows the longest earlier match."""
    drafter = NgramDrafter(min_match=min_match)
    drafter.reset(context)
    return drafter.lookup(k)[0]
