"""Sampling: the same filters as transformers, and drafting that does not change the output distribution.

The statistical test samples the first two tokens of a reply many times on a tiny model, with and without a
draft model, and compares the empirical joint distribution with the exact one computed from the model's own
probabilities. A deliberately wrong acceptance rule, run through the same loop, must fail the same threshold:
that is what makes the threshold meaningful.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

import engine.decoding.round_steps as round_steps
from engine.backends.transformers import TransformersBackend
from engine.decoding.sampling import (
    apply_repetition_penalty,
    choose_tokens,
    filtered_candidates,
    filtered_probabilities,
    sample_from,
)
from engine.events import Chunk
from engine.request import GenerationRequest, SamplerSettings

# Samples per distribution. With 16 cells an exact sampler's expected total variation is about 0.045 at
# this size (measured 0.054); the wrong rules below land at 0.65-0.78.
SAMPLES = 1000
TV_THRESHOLD = 0.08
DIST_SETTINGS = SamplerSettings(temperature=1.0, top_k=4)


# --- the filters, against transformers' own logits processors ---------------------------------------------


def _hf_probabilities(row: torch.Tensor, settings: SamplerSettings) -> torch.Tensor:
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = row.double().unsqueeze(0)
    input_ids = torch.zeros(1, 1, dtype=torch.long)
    warpers = [TemperatureLogitsWarper(settings.temperature)]
    if settings.top_k:
        warpers.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(settings.top_p))
    if settings.min_p:
        warpers.append(MinPLogitsWarper(settings.min_p))
    for warper in warpers:
        scores = warper(input_ids, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(temperature=0.7),
        SamplerSettings(temperature=1.0, top_k=40),
        SamplerSettings(temperature=0.9, top_p=0.8),
        SamplerSettings(temperature=1.3, min_p=0.05),
        SamplerSettings(temperature=0.5, top_k=40, top_p=0.9, min_p=0.02),
    ],
)
def test_filters_match_transformers(settings: SamplerSettings) -> None:
    torch.manual_seed(0)
    row = torch.randn(1000) * 3
    ours = filtered_probabilities(row, settings.temperature, settings).double()
    theirs = _hf_probabilities(row, settings)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens survive the filters
    assert ours.sum().item() == pytest.approx(1.0)


def test_a_nucleus_wider_than_the_candidate_pool_is_still_exact() -> None:
    from engine.decoding.sampling import CANDIDATE_POOL

    row = torch.linspace(0.0, 0.5, 4 * CANDIDATE_POOL)  # nearly flat: top_p 0.95 keeps ~3.8x the pool
    settings = SamplerSettings(temperature=1.0, top_p=0.95)
    ours = filtered_probabilities(row, 1.0, settings).double()
    theirs = _hf_probabilities(row, settings)
    assert int((ours > 0).sum()) > CANDIDATE_POOL
    assert torch.equal(ours > 0, theirs > 0)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_min_p_set_wider_than_the_candidate_pool_is_still_exact() -> None:
    """min-p alone (top_p 1) on a flat row keeps thousands of tokens: not only the pool's 256."""
    from engine.decoding.sampling import CANDIDATE_POOL

    row = torch.linspace(0.0, 1.0, 8 * CANDIDATE_POOL)  # min_p 0.2 keeps the top ~80%: ~6.4x the pool
    settings = SamplerSettings(temperature=1.0, min_p=0.2)
    ours = filtered_probabilities(row, 1.0, settings).double()
    theirs = _hf_probabilities(row, settings)
    assert int((theirs > 0).sum()) > 4 * CANDIDATE_POOL
    assert torch.equal(ours > 0, theirs > 0)
    assert torch.allclose(ours, theirs, atol=1e-7)
    # With top_p cutting inside the pool, min-p does not widen it again.
    narrow = SamplerSettings(temperature=1.0, top_p=0.01, min_p=0.2)
    assert torch.equal(filtered_probabilities(row, 1.0, narrow) > 0, _hf_probabilities(row, narrow) > 0)


def test_repetition_penalty_matches_transformers() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(1)
    row = torch.randn(50)
    history = torch.tensor([3, 7, 7, 12, 40])
    expected = RepetitionPenaltyLogitsProcessor(1.3)(history.unsqueeze(0), row.clone().unsqueeze(0))[0]
    ours = row.clone()
    apply_repetition_penalty(ours, history, 1.3)
    assert torch.equal(ours, expected)
    assert ours[3] != row[3] and ours[0] == row[0]


def test_inverse_cdf_sampling_skips_impossible_tokens() -> None:
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    assert [sample_from(probs, u) for u in (0.0, 0.1999, 0.2, 0.6999, 0.7, 0.9999)] == [0, 0, 2, 2, 3, 3]


def test_each_position_uses_its_own_temperature_and_random_number() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, 30)
    ramp = SamplerSettings(temperature=1.0, ramp_tokens=2, ramp_start=0.0)
    uniforms = [0.5] * 10
    tokens = choose_tokens(logits, ramp, 0, [1, 2], [5, 6], uniforms)
    assert tokens[0] == int(logits[0].argmax())  # position 0 of the ramp: temperature 0, greedy
    ids, probs = filtered_candidates(logits[1], 0.5, ramp)
    assert tokens[1] == int(ids[sample_from(probs, 0.5)])
    # Rows are independent of how a round is cut: row 2 alone gives the same token.
    assert choose_tokens(logits[2:], ramp, 2, [1, 2, 5, 6], [], uniforms) == tokens[2:]


def test_repetition_penalty_sees_earlier_drafts_of_the_same_round() -> None:
    logits = torch.zeros(2, 5)
    logits[:, 3] = 1.0  # token 3 wins unless penalised
    logits[:, 4] = 0.9
    settings = SamplerSettings(temperature=0.0, repetition_penalty=2.0)
    # Row 0 follows context [0]; row 1 follows context + draft 3, which penalises token 3.
    assert choose_tokens(logits, settings, 0, [0], [3], [0.5, 0.5]) == [3, 4]


# --- the loop on a tiny model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_drafting(tiny_model_dir: Path) -> TransformersBackend:
    """The tiny model drafting for itself: greedy drafts the sampling target often, but not always, accepts."""
    backend = TransformersBackend(
        tiny_model_dir, draft=str(tiny_model_dir), cache_mode="fp16", draft_cache_mode="fp16"
    )
    backend.load()
    yield backend
    backend.close()


def _prompt(backend: TransformersBackend) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": "Tell me something."}])


def _first_tokens(
    backend: TransformersBackend, ids: list[int], k: int, seed: int, n: int = 2
) -> tuple[int, ...]:
    request = GenerationRequest(
        prompt_ids=tuple(ids),
        sampler=DIST_SETTINGS,
        max_new_tokens=n + 1,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=seed,
    )
    tokens: list[int] = []
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            tokens.extend(event.token_ids)
    return tuple(tokens[:n])


def _exact_joint(backend: TransformersBackend, ids: list[int]) -> dict[tuple[int, int], float]:
    """p(t1, t2) from full forward passes without any cache: the distribution the target alone defines."""
    with torch.inference_mode():
        first = filtered_probabilities(backend.model(torch.tensor([ids])).logits[0, -1], 1.0, DIST_SETTINGS)
        joint = {}
        for t1 in torch.nonzero(first).flatten().tolist():
            logits = backend.model(torch.tensor([ids + [t1]])).logits[0, -1]
            second = filtered_probabilities(logits, 1.0, DIST_SETTINGS)
            for t2 in torch.nonzero(second).flatten().tolist():
                joint[(t1, t2)] = float(first[t1] * second[t2])
    return joint


def _total_variation(samples: list[tuple[int, ...]], exact: dict[tuple[int, int], float]) -> float:
    counts = Counter(samples)
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts[key] / len(samples) - exact.get(key, 0.0)) for key in keys)


@pytest.fixture(scope="module")
def exact_and_plain(tiny_drafting: TransformersBackend):
    ids = _prompt(tiny_drafting)
    exact = _exact_joint(tiny_drafting, ids)
    plain = [_first_tokens(tiny_drafting, ids, 0, seed) for seed in range(SAMPLES)]
    return ids, exact, plain


@pytest.mark.slow
def test_plain_sampling_matches_the_exact_distribution(exact_and_plain) -> None:
    _, exact, plain = exact_and_plain
    assert len(exact) == 16  # top-k 4 at each of two positions
    assert max(exact.values()) < 0.6  # a real distribution, not a near-certain token
    assert _total_variation(plain, exact) < TV_THRESHOLD


@pytest.mark.slow
def test_drafting_does_not_change_the_distribution(
    tiny_drafting: TransformersBackend, exact_and_plain
) -> None:
    ids, exact, plain = exact_and_plain
    drafted = [_first_tokens(tiny_drafting, ids, 2, seed) for seed in range(SAMPLES)]
    assert _total_variation(drafted, exact) < TV_THRESHOLD
    # Stronger than equal distributions: one random number per reply position makes each seed's
    # tokens the same with and without drafting.
    assert drafted == plain


def _accept_every_draft(drafts, samples) -> int:
    return len(drafts)


def _accept_first_draft_unchecked(drafts, samples) -> int:
    if not drafts:
        return 0
    rest = 0
    for draft, sample in zip(drafts[1:], samples[1:], strict=False):
        if draft != sample:
            break
        rest += 1
    return 1 + rest


@pytest.mark.slow
@pytest.mark.parametrize("wrong_rule", [_accept_every_draft, _accept_first_draft_unchecked])
def test_a_wrong_acceptance_rule_fails_the_same_threshold(
    tiny_drafting: TransformersBackend, exact_and_plain, wrong_rule, monkeypatch
) -> None:
    ids, exact, _ = exact_and_plain
    monkeypatch.setattr(round_steps, "count_accepted", wrong_rule)
    biased = [_first_tokens(tiny_drafting, ids, 2, seed) for seed in range(SAMPLES // 3)]
    assert _total_variation(biased, exact) > 2 * TV_THRESHOLD


@pytest.mark.slow
def test_greedy_with_repetition_penalty_matches_transformers(tiny_drafting: TransformersBackend) -> None:
    ids = _prompt(tiny_drafting)
    stop = sorted(tiny_drafting.stop_token_ids)
    with torch.inference_mode():
        out = tiny_drafting.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=30,
            do_sample=False,
            repetition_penalty=1.3,
            eos_token_id=stop,
            pad_token_id=stop[0],
        )
    reference = [t for t in out[0, len(ids) :].tolist() if t not in stop]
    settings = SamplerSettings(temperature=0.0, repetition_penalty=1.3)
    for k in (0, 3):
        request = GenerationRequest(tuple(ids), settings, max_new_tokens=30, num_draft_tokens=k, seed=0)
        tokens = [
            t
            for e in tiny_drafting.generate(request, threading.Event())
            if isinstance(e, Chunk)
            for t in e.token_ids
        ]
        assert tokens == reference[: len(tokens)] and len(tokens) >= min(len(reference), 30)
