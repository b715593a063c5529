"""The n-gram drafter: what it proposes, and how it backs off where drafting does not pay."""

from __future__ import annotations

import random

import pytest

from engine.drafting import DraftPolicy, NgramDrafter, propose_from


def brute_force_lookup(context: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2) -> list[int]:
    """The specification, written the slow way: longest n first, most recent earlier occurrence wins."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= n:
            continue
        suffix = context[-n:]
        for end in range(len(context) - 1, n - 1, -1):
            if context[end - n : end] == suffix:
                return context[end : end + k]
    return []


def test_proposes_the_tokens_after_the_most_recent_match() -> None:
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    # "5 6" occurred at 0 and 4; the most recent (ending at 6) is followed by 8, 2, 5, 6
    assert propose_from(context, 3) == [8, 2, 5]


def test_longer_match_wins_over_more_recent_shorter_one() -> None:
    context = [1, 2, 3, 9, 9, 7, 2, 3, 4, 4, 1, 2, 3]
    # "1 2 3" matches at the start (followed by 9); "2 3" alone would match more recently (followed by 4)
    assert propose_from(context, 2) == [9, 9]


def test_single_token_matches_are_not_used() -> None:
    context = [1, 2, 3, 4, 5, 1]
    assert propose_from(context, 4) == []
    assert propose_from(context, 4, min_ngram=1) == [2, 3, 4, 5]


def test_the_suffix_is_never_its_own_match_but_overlap_is_fine() -> None:
    assert propose_from([3, 4], 4) == []
    # "3 4" recurs: the continuation runs into the suffix itself, which is what a loop looks like
    assert propose_from([3, 4, 3, 4], 4) == [3, 4]
    assert propose_from([3, 4, 3, 4, 3, 4], 3) == [3, 4]


def test_draft_is_capped_at_k() -> None:
    context = list(range(10)) + [0, 1]
    assert propose_from(context, 3) == [2, 3, 4]
    assert propose_from(context, 0) == []


@pytest.mark.parametrize("seed", range(20))
def test_incremental_index_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    drafter = NgramDrafter()
    context = [rng.randrange(4) for _ in range(8)]
    drafter.reset(context)
    for _ in range(40):
        k = rng.randrange(1, 6)
        assert drafter.lookup(k)[0] == brute_force_lookup(context, k)
        new = [rng.randrange(4) for _ in range(rng.randrange(1, 4))]
        drafter.extend(new)
        context = context + new


def test_lookup_reports_the_match_length() -> None:
    drafter = NgramDrafter()
    drafter.reset([1, 2, 3, 4, 9, 2, 3, 4])
    assert drafter.lookup(2) == ([9, 2], 3)


def _repetitive_drafter(policy: DraftPolicy | None = None) -> NgramDrafter:
    drafter = NgramDrafter(policy)
    drafter.reset([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3)  # every lookup finds a long continuation
    return drafter


def test_full_acceptance_keeps_the_full_length() -> None:
    drafter = _repetitive_drafter()
    assert len(drafter.propose(6)) == 6
    drafter.feedback(6, 6)
    assert drafter.draft_length(6) == 6


def test_length_halves_after_a_miss_and_grows_back_after_full_acceptance() -> None:
    drafter = _repetitive_drafter(DraftPolicy(min_draft_length=1))
    drafter.feedback(drafted=6, accepted=0)
    assert drafter.draft_length(6) == 3
    assert len(drafter.propose(6)) == 3
    drafter.feedback(drafted=3, accepted=3)
    assert drafter.draft_length(6) == 6


def test_partial_acceptance_sets_the_length_to_what_was_kept_plus_one() -> None:
    drafter = _repetitive_drafter(DraftPolicy(min_draft_length=1))
    drafter.feedback(drafted=6, accepted=2)
    assert drafter.draft_length(6) == 3
    drafter.feedback(drafted=3, accepted=1)
    assert drafter.draft_length(6) == 2


def test_the_length_never_drops_below_the_floor() -> None:
    drafter = _repetitive_drafter()  # default floor: 3
    drafter.feedback(drafted=6, accepted=1)
    assert drafter.draft_length(6) == 3
    drafter.feedback(drafted=3, accepted=0)
    assert drafter.draft_length(6) == 3
    assert drafter.draft_length(2) == 2  # K still caps it


def test_two_token_matches_need_a_recent_hit() -> None:
    drafter = NgramDrafter()
    # The context ends in "7 8", which occurred before; no longer suffix recurs.
    drafter.reset([7, 8, 1, 2, 3, 9, 7, 8])
    assert drafter.propose(3) == [1, 2, 3]  # a fresh reply starts hot
    drafter.feedback(3, 0)
    drafter.extend([4, 7, 8])
    assert drafter.lookup(3) == ([4, 7, 8], 2)
    assert drafter.propose(3) == []  # cold: a weak match is not worth a verify pass
    drafter.extend([1, 2, 3])
    assert drafter.lookup(3)[1] >= 3
    assert drafter.propose(3) != []  # a longer match is drafted even when cold


def test_repeated_misses_cool_down_then_probe_and_back_off_longer() -> None:
    policy = DraftPolicy(
        misses_before_cooldown=2,
        cooldown_rounds=3,
        max_cooldown_rounds=12,
        probe_length=2,
        min_draft_length=1,
    )
    drafter = _repetitive_drafter(policy)
    drafter.feedback(6, 0)
    drafter.feedback(3, 0)  # second miss in a row: cool-down of 3 plain rounds
    assert [drafter.propose(6) for _ in range(3)] == [[], [], []]
    probe = drafter.propose(6)
    assert len(probe) == 2  # the re-probe is short
    drafter.feedback(2, 0)  # the probe missed too: the next cool-down is twice as long
    assert all(drafter.propose(6) == [] for _ in range(6))
    assert len(drafter.propose(6)) == 2
    drafter.feedback(2, 2)  # a hit ends the back-off; the length grows again
    assert drafter.draft_length(6) == 4
    drafter.feedback(4, 4)
    assert drafter.draft_length(6) == 6


def test_cool_down_is_capped() -> None:
    policy = DraftPolicy(misses_before_cooldown=1, cooldown_rounds=4, max_cooldown_rounds=8, probe_length=1)
    drafter = _repetitive_drafter(policy)
    quiet_runs = []
    for _ in range(5):
        drafter.feedback(1, 0)
        quiet = 0
        while not drafter.propose(6):
            quiet += 1
        quiet_runs.append(quiet)
    assert quiet_runs == [4, 8, 8, 8, 8]


def test_a_round_without_a_draft_changes_nothing() -> None:
    drafter = _repetitive_drafter()
    drafter.feedback(0, 0)
    assert drafter.draft_length(5) == 5


def test_bad_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(DraftPolicy(max_ngram=1, min_ngram=2))
