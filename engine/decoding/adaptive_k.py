"""How likely a draft is to be accepted, and the draft length that pays most: for every drafter.

Per match length (`AcceptanceModel`, the n-gram drafter's): the chance that each draft token is accepted from the
match length (longer matches predict better) and what drafts of that match length did so far (one estimate per
length bucket, learnt across replies).

Adaptive K (`AdaptiveK`, one per preset): per draft position it keeps the chance that the position is accepted
given the ones before it were (a decaying average, seeded from the metrics log), and before each round picks the
k, 0 included, with the most expected tokens per unit of time, where a round costs its verify pass r(1 + k) plus k
draft-model steps (engine/decoding/cost_model.py). While no k pays, a short probe draft goes out every
`PROBE_INTERVAL` rounds (more where a probe costs more: `probe_spacing`), so a draft that recovers is noticed, but
only where drafting could pay at a high acceptance (`PROBE_ACCEPTANCE`: a draft as slow as the target never does,
nor, on a compute-bound CPU, a draft model half as fast). Each probe that leaves drafting off doubles the wait
before the next (up to `MAX_PROBE_BACKOFF` times the interval, kept across replies of the preset), and a round that
drafts because it pays brings the interval back: a draft model that never pays in a chat stops costing its catch-up
and probe passes.
Pure python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.decoding.cost_model import MAX_DRAFT_LENGTH, VerifyCostModel, round_cost

# Match-length buckets: a suffix match of length L falls in the first bucket whose bound is >= L.
MATCH_BUCKETS = (1, 2, 3, 5, 9, 17, 33, math.inf)
# Prior chance that the first draft token is accepted, per bucket, and that a later one is, given the ones
# before it were: measured with SmolLM2-135M on the public bench prompts (docs/performance.md, "Drafting"); the
# sparse middle buckets are interpolated.
FIRST_TOKEN_PRIOR = (0.15, 0.34, 0.5, 0.65, 0.8, 0.8, 0.9, 0.95)
NEXT_TOKEN_PRIOR = 0.78
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior: a few misses outweigh it
# A draft must beat a plain step by this fraction of its time (noise in the cost estimates).
MIN_GAIN = 0.03
# Adaptive K: rounds without drafting between probes, and the probe's draft length (ExLlamaV3's defaults).
PROBE_INTERVAL = 16
PROBE_LENGTH = 2
# A probe that leaves drafting off doubles the rounds before the next one, up to this many times PROBE_INTERVAL.
# A draft model's probe first feeds it every token it skipped (a prefill at a fraction of a step per token) and then
# verifies a wider pass: on the Qwen2.5-Coder pair on 2 cores, probing every 16 rounds cost 5-22% of the plain
# speed per chat prompt where the draft never paid, 0.92x overall (docs/performance.md).
MAX_PROBE_BACKOFF = 16
# A probe that finds nothing wastes its round's verify pass and draft steps beyond one plain step; the rounds
# between probes keep that waste within this share of the plain steps between them. A 2-token probe on a
# mixture of experts wastes 1.4 steps (r(3) 2.41 at OLMoE-1B-7B's shape: each token wakes its own experts), 9% of
# the time at one probe per 16 rounds; it now waits 141 rounds (docs/performance.md, "Mixture of experts at a
# real shape"). The embedded SmolLM2 on llama.cpp (r(3) 1.2) probes every 20 rounds, a GPU-like curve every 16.
PROBE_BUDGET = 0.01
# Probes go out only where drafting would pay at this acceptance per position: a probe costs more than its
# verify pass (a draft model first catches up on the tokens it skipped), so where only a draft that is never
# wrong could pay (a half-as-fast draft model on a compute-bound CPU: docs/performance.md), probing is pure loss.
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


def match_bucket(match_length: int) -> int:
    """The bucket of a suffix match of `match_length` tokens (an index into MATCH_BUCKETS)."""
    for index, bound in enumerate(MATCH_BUCKETS):
        if match_length <= bound:
            return index
    return len(MATCH_BUCKETS) - 1


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


@dataclass
class ProbabilityCalibration:
    """How far a drafter's own per-token probabilities (the history drafter's match counts) run above or below
    what the target accepted, per match-length bucket: the chance a draft token is accepted is taken as p times
    this bucket's ratio of accepted drafts to the probability mass that went out (observed / predicted), started
    from the n-gram's per-bucket priors. Counts that say "always followed by x" are right only as often as the
    reply really follows the text they come from; the ratio learns how often that is (kept across replies)."""

    first_predicted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    first_accepted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    next_predicted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    next_accepted: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))

    def first(self, bucket: int) -> float:
        prior = FIRST_TOKEN_PRIOR[bucket]
        return (self.first_accepted[bucket] + PRIOR_WEIGHT * prior) / (
            self.first_predicted[bucket] + PRIOR_WEIGHT
        )

    def next(self, bucket: int) -> float:
        return (self.next_accepted[bucket] + PRIOR_WEIGHT * NEXT_TOKEN_PRIOR) / (
            self.next_predicted[bucket] + PRIOR_WEIGHT
        )

    def chances(self, bucket: int, probabilities: Sequence[float]) -> list[float]:
        """The chance each draft token is accepted given the ones before it were: p_i times the bucket's ratio."""
        first, following = self.first(bucket), self.next(bucket)
        return [min(p * (first if i == 0 else following), 1.0) for i, p in enumerate(probabilities)]

    def record(self, bucket: int, probabilities: Sequence[float], accepted: int) -> None:
        """A round sent drafts with these probabilities and the first `accepted` were kept."""
        if not probabilities:
            return
        self.first_predicted[bucket] += probabilities[0]
        self.first_accepted[bucket] += 1.0 if accepted > 0 else 0.0
        # Position i was tried if positions 1..i-1 were accepted.
        for i in range(1, min(len(probabilities), accepted + 1)):
            self.next_predicted[bucket] += probabilities[i]
            self.next_accepted[bucket] += 1.0 if i < accepted else 0.0


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


def drafting_can_pay(costs: VerifyCostModel | None, k_max: int) -> bool:
    """Would some k <= k_max pay at PROBE_ACCEPTANCE per position? (Not for a draft as slow as the target, nor
    for a half-as-fast draft on a compute-bound CPU, where a verify pass of 2 costs well over one plain step.)"""
    if costs is None:
        return True
    return best_length(lambda k: sum(PROBE_ACCEPTANCE**i for i in range(k + 1)), costs, k_max)[0] > 0


def probe_spacing(costs: VerifyCostModel | None, length: int, base: int = PROBE_INTERVAL) -> int:
    """Rounds from one probe of `length` drafts to the next before any backoff: `base`, or more where a probe that
    finds nothing wastes more than PROBE_BUDGET of the plain steps between two."""
    if costs is None:
        return base
    waste = round_cost(costs, length) - 1.0
    return max(base, math.ceil(round(waste / PROBE_BUDGET, 6)))


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
    The same object keeps the n-gram drafter's per-match-length model (`ngram`) and the history drafter's
    calibration of its match counts (`history`) for this preset.
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
        # Rounds before the next probe: doubles with each probe that finds nothing.
        self.interval = probe_interval
        self.probes = 0
        self.ngram = AcceptanceModel()
        self.history = ProbabilityCalibration()  # the history drafter's (engine/decoding/drafters/history.py)

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

    def probe_wait(self, costs: VerifyCostModel | None, length: int = PROBE_LENGTH) -> int:
        """Rounds without drafting before the next probe of `length`: `interval` (the base, doubled per probe
        that found nothing), stretched by what the probe costs (`probe_spacing`), never past the backoff's
        ceiling."""
        spacing = probe_spacing(costs, length, self.probe_interval)
        ceiling = self.probe_interval * MAX_PROBE_BACKOFF
        return min(self.interval * spacing // self.probe_interval, max(ceiling, spacing))

    def probe_due(
        self, k_max: int, costs: VerifyCostModel | None, rounds: int = 1, length: int = PROBE_LENGTH
    ) -> bool:
        """Count `rounds` that drafted nothing; True (and start counting again) when a probe of `length` drafts
        should go out."""
        if k_max <= 0:
            return False
        self.skipped += rounds
        if self.skipped < self.probe_wait(costs, min(length, k_max)) or not drafting_can_pay(costs, k_max):
            return False
        self.skipped = 0
        self.probes += 1
        # Until a round drafts because it pays (`drafting`), the next probe waits twice as long.
        self.interval = min(self.interval * 2, self.probe_interval * MAX_PROBE_BACKOFF)
        return True

    def drafting(self) -> None:
        """A round drafts because drafting pays: probes, once it stops paying, start at the base interval again."""
        self.skipped = 0
        self.interval = self.probe_interval

    def choose(
        self, k_max: int, costs: VerifyCostModel | None, rounds: int = 1, probe_length: int = PROBE_LENGTH
    ) -> int:
        """This round's K: the best-paying one, else 0, else (once `interval` rounds drafted nothing) a probe of
        `probe_length`. `rounds`: the rounds this call counts towards the next probe (0 where the caller counts them
        itself, as the GPU backends do for a whole reply at one K)."""
        k, _ = self.plan(k_max, costs)
        if k > 0:
            self.drafting()
            return k
        return min(probe_length, k_max) if self.probe_due(k_max, costs, rounds, probe_length) else 0
