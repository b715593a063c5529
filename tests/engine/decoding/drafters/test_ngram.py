"""The n-gram drafter: what it proposes (suffix automaton lookup) and when a draft pays (the cost model)."""

from __future__ import annotations

import random

import pytest

from engine.decoding.adaptive_k import (
    FIRST_TOKEN_PRIOR,
    MIN_GAIN,
    NEXT_TOKEN_PRIOR,
    PRIOR_WEIGHT,
    AcceptanceModel,
)
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters.ngram import (
    LONG_DRAFT_MAX,
    LONG_MATCH,
    NgramDrafter,
    SuffixIndex,
    best_draft_length,
    propose_from,
)


def brute_force_match(context: list[int]) -> tuple[int, set[int]]:
    """The specification, the slow way: the longest suffix that also ended earlier, and every such end."""
    n = len(context)
    for length in range(n - 1, 0, -1):
        suffix = context[n - length :]
        ends = {end for end in range(length, n) if context[end - length : end] == suffix}
        if ends:
            return length, ends
    return 0, set()


def test_proposes_the_tokens_after_the_most_recent_match() -> None:
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    # "5 6" occurred at 0 and 4; the most recent (ending at 6) is followed by 8, 2, 5, 6
    assert propose_from(context, 3) == [8, 2, 5]


def test_longer_match_wins_over_more_recent_shorter_one() -> None:
    context = [1, 2, 3, 9, 9, 7, 2, 3, 4, 4, 1, 2, 3]
    # "1 2 3" matches at the start (followed by 9); "2 3" alone would match more recently (followed by 4)
    assert propose_from(context, 2) == [9, 9]


def test_matches_longer_than_any_fixed_n_gram_are_found() -> None:
    block = list(range(100, 140))
    context = block + [7, 7] + block[:30]
    drafter = NgramDrafter()
    drafter.reset(context)
    assert drafter.lookup(5) == (block[30:35], 30)


def test_the_suffix_is_never_its_own_match_and_a_loop_continues_through_the_draft() -> None:
    assert propose_from([3, 4], 4) == []
    # "3 4" recurs once: what followed it is the suffix itself, and the copy goes on around the loop
    assert propose_from([3, 4, 3, 4], 5) == [3, 4, 3, 4, 3]
    assert propose_from([1, 2, 3, 1, 2], 7) == [3, 1, 2, 3, 1, 2, 3]


def test_single_token_matches_can_be_excluded() -> None:
    context = [1, 2, 3, 4, 5, 1]
    assert propose_from(context, 4) == [2, 3, 4, 5]
    assert propose_from(context, 4, min_match=2) == []


def test_draft_is_capped_at_k() -> None:
    context = list(range(10)) + [0, 1]
    assert propose_from(context, 3) == [2, 3, 4]
    assert propose_from(context, 0) == []


@pytest.mark.parametrize("seed", range(25))
def test_suffix_automaton_matches_brute_force_as_the_context_grows(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])
    index = SuffixIndex()
    context: list[int] = []
    for _ in range(60):
        new = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
        index.extend(new)
        context += new
        length, end = index.longest_match()
        want_length, ends = brute_force_match(context)
        assert length == want_length
        if want_length:
            assert end in ends
            # Short contexts stay within the recency walk: the most recent earlier end is the one used.
            assert end == max(ends)


# --- the cost model ----------------------------------------------------------------------------------------


def test_verify_cost_interpolates_and_extrapolates() -> None:
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.2, 6: 1.6})
    assert costs.ratio(1) == 1.0
    assert costs.ratio(4) == pytest.approx(1.4)
    assert costs.ratio(8) == pytest.approx(1.8)  # last slope, 0.1 per token
    costs.observe(6, 2.6)  # no one-token time known yet: nothing to compare with
    assert costs.ratio(6) == pytest.approx(1.6)
    costs.observe(1, 1.0)
    costs.observe(6, 2.6)  # 2.6 plain steps: the estimate moves by the EMA weight
    assert costs.ratio(6) == pytest.approx(1.6 + VerifyCostModel.EMA_WEIGHT * 1.0)


def test_verify_cost_compares_with_recent_one_token_passes() -> None:
    costs = VerifyCostModel.from_samples({1: 1.0, 2: 1.2})
    for _ in range(20):  # the machine gets three times slower: one-token passes show it first
        costs.observe(1, 3.0)
    costs.observe(2, 3.6)
    assert costs.ratio(2) == pytest.approx(1.2, abs=0.01)  # still 1.2 plain steps
    costs.observe(2, 0.5)  # a pass can never cost less than one token
    assert costs.ratio(2) >= 1.0


def test_acceptance_model_starts_at_the_priors_and_learns() -> None:
    model = AcceptanceModel()
    assert model.first(3) == pytest.approx(FIRST_TOKEN_PRIOR[3])
    assert model.next() == pytest.approx(NEXT_TOKEN_PRIOR)
    model.record(3, drafted=4, accepted=2)  # position 1 ok, position 2 ok, position 3 tried and rejected
    assert model.first(3) == pytest.approx((1 + PRIOR_WEIGHT * FIRST_TOKEN_PRIOR[3]) / (1 + PRIOR_WEIGHT))
    assert model.next() == pytest.approx((1 + PRIOR_WEIGHT * NEXT_TOKEN_PRIOR) / (2 + PRIOR_WEIGHT))
    model.record(3, drafted=3, accepted=3)  # all accepted: positions 2 and 3 tried and kept
    assert model.next() == pytest.approx((3 + PRIOR_WEIGHT * NEXT_TOKEN_PRIOR) / (4 + PRIOR_WEIGHT))
    assert model.expected_tokens(3, 0) == 1.0


def test_draft_length_maximises_expected_tokens_per_unit_of_time() -> None:
    model = AcceptanceModel()
    flat = VerifyCostModel.from_ratios({1: 1.0, 2: 1.0})
    # Free verification: every extra draft token adds expected tokens, so the longest draft wins.
    assert best_draft_length(model, flat, bucket=7, k_max=6)[0] == 6
    # A draft token that costs a full step never pays (each adds at most one expected token).
    linear = VerifyCostModel.from_ratios({1: 1.0, 2: 2.0})
    assert best_draft_length(model, linear, bucket=7, k_max=6) == (0, 1.0)
    # In between: the chosen k is the argmax of E(k) / r(1 + k) over k, checked by hand.
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.3, 9: 1.65})
    bucket = 5
    rates = {k: model.expected_tokens(bucket, k) / costs.ratio(1 + k) for k in range(1, 9)}
    k, rate = best_draft_length(model, costs, bucket, 8)
    assert k == max(rates, key=rates.get) and rate == pytest.approx(rates[k])
    assert rate >= 1.0 + MIN_GAIN


def _loop_drafter(costs: VerifyCostModel) -> NgramDrafter:
    drafter = NgramDrafter(costs=costs)
    drafter.reset([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3)  # a long earlier match
    return drafter


def test_a_drafter_that_keeps_missing_stops_drafting_and_one_that_hits_keeps_going() -> None:
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.2, 9: 1.6})
    drafter = _loop_drafter(costs)
    assert len(drafter.propose(6)) > 0
    rounds_with_drafts = 0
    for _ in range(30):
        draft = drafter.propose(6)
        if draft:
            rounds_with_drafts += 1
            drafter.feedback(len(draft), 0)
    assert rounds_with_drafts <= 12  # the learnt acceptance falls until no length pays (from a 0.95 prior)

    hitting = _loop_drafter(costs)
    for _ in range(30):
        draft = hitting.propose(6)
        assert len(draft) == 6
        hitting.feedback(len(draft), len(draft))


def _copying(length: int) -> NgramDrafter:
    """A drafter over a context that repeats a 200-token passage's first `length` tokens (a copy under way)."""
    passage = list(range(1000, 1200))
    drafter = NgramDrafter(costs=VerifyCostModel.from_ratios({1: 1.0, 2: 1.05, 9: 1.4, 49: 4.0}))
    drafter.reset([*passage, 7, *passage[:length]])
    return drafter


def test_a_long_match_drafts_past_the_presets_k_only_after_rounds_that_took_every_draft() -> None:
    drafter = _copying(LONG_MATCH)
    first = drafter.propose(5, k_long=100)
    assert 0 < len(first) <= 5  # a copy must prove itself first: the preset's K
    drafter.feedback(len(first), len(first))
    drafter.extend(first)
    rounds = [len(first)]
    for _ in range(4):  # all taken: the ceiling doubles, up to LONG_DRAFT_MAX
        draft = drafter.propose(5, k_long=100)
        rounds.append(len(draft))
        drafter.feedback(len(draft), len(draft))
        drafter.extend(draft)
    assert rounds[1] > 5 and rounds[1] <= 2 * rounds[0]
    assert max(rounds) <= LONG_DRAFT_MAX and rounds[-1] > rounds[1]
    # a rejection ends long-match mode until a round takes all again
    draft = drafter.propose(5, k_long=100)
    drafter.feedback(len(draft), 1)
    drafter.extend(draft[:1])
    assert len(drafter.propose(5, k_long=100)) <= 5
    # never past what the round can take (budget, context, exact pass width)
    drafter.feedback(5, 5)
    assert len(drafter.propose(5, k_long=7)) <= 7


def test_a_short_match_or_fixed_k_never_drafts_past_the_presets_k() -> None:
    short = _copying(LONG_MATCH - 2)
    short.long_room = LONG_DRAFT_MAX
    assert 0 < len(short.propose(5, k_long=100)) <= 5
    fixed = _copying(LONG_MATCH + 5)
    fixed.fixed = True
    fixed.long_room = LONG_DRAFT_MAX
    assert len(fixed.propose(5, k_long=100)) == 5


def test_later_positions_are_learnt_per_match_length_bucket() -> None:
    model = AcceptanceModel()
    for _ in range(20):
        model.record(7, 20, 20)  # long matches: copies that hold
        model.record(0, 4, 1)  # one-token matches: guesses that fail after the first
    assert model.next(7) > 0.95 > model.next() > model.next(0)
    assert model.expected_tokens(7, 20) > 2 * model.expected_tokens(0, 20)


def test_nothing_to_look_up_means_no_draft() -> None:
    drafter = NgramDrafter(costs=VerifyCostModel.from_ratios({1: 1.0, 2: 1.0}))
    drafter.reset([1, 2, 3, 4, 5])
    assert drafter.propose(5) == []
    drafter.feedback(0, 0)  # a round without a draft teaches nothing
    assert drafter.acceptance.first_drafted == [0.0] * len(drafter.acceptance.first_drafted)


def test_a_disturbed_calibration_is_bounded_to_one_to_w_plain_steps() -> None:
    costs = VerifyCostModel.from_samples({1: 0.07, 2: 0.3, 4: 0.06, 9: 0.25})
    assert costs.as_dict() == pytest.approx({1: 1.0, 2: 2.0, 4: 1.0, 9: 0.25 / 0.07})
    assert costs.ratio(3) == pytest.approx(1.5)
