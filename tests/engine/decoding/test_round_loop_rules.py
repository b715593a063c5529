"""The speculative loop's rules where drafts really are proposed and accepted (a model built to repeat itself).

The tiny random models never repeat their own output, so the n-gram drafter never proposes there; the successor
model (tests/conftest.py) continues a cycle of token ids, so the drafter finds long matches and the target accepts
them. Each rule below was checked by breaking it in engine/backends/transformers/backend.py once and watching its test fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.backends.transformers import TransformersBackend
from tests.support.drafting import FreeVerify
from tests.support.replies import Reply, generate
from tests.support.tiny_models import COPY_CYCLE

pytestmark = pytest.mark.slow


def run(backend: TransformersBackend, prompt: list[int], k: int, max_new: int, **sampler) -> Reply:
    return generate(backend, prompt, k=k, max_new=max_new, seed=11, **sampler)


def cycle_after(token: int, count: int) -> list[int]:
    i = COPY_CYCLE.index(token)
    return [COPY_CYCLE[(i + 1 + j) % len(COPY_CYCLE)] for j in range(count)]


@pytest.fixture(scope="module", params=["fp16", "q8"])
def copier(request, copy_model_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(copy_model_dir, draft="ngram", cache_mode=request.param)
    backend.load()
    backend.target.costs = FreeVerify()
    yield backend
    backend.close()


def assert_cache_matches_a_fresh_prefill(backend: TransformersBackend, expected_ids: list[int]) -> None:
    """The rolled-back cache holds the keys/values a fresh pass over its token ids gives: bit for bit where
    every pass runs the row-invariant kernels (q8), to float rounding where one-row passes run stock ones."""
    state = backend.target
    ids = list(state.ids)
    assert ids == expected_ids  # no rejected draft left behind
    kept = [(layer.length, layer.stored_keys().clone()) for layer in state.cache.layers]
    state.new_cache()
    state.prefill(ids)
    for (length, keys), layer in zip(kept, state.cache.layers, strict=True):
        assert length == layer.length == len(ids)
        fresh = layer.stored_keys()
        if state.invariant:
            assert torch.equal(keys, fresh)
        else:
            assert torch.allclose(keys.float(), fresh.float(), atol=1e-4)


def test_drafts_are_proposed_and_accepted_on_a_repeating_model(copier: TransformersBackend) -> None:
    prompt = [*COPY_CYCLE, 100, 101]  # the cycle once, then its start again: a long earlier match
    reply = run(copier, prompt, k=5, max_new=8)
    assert reply.tokens == cycle_after(101, 8)
    assert reply.drafted > 0 and reply.accepted == reply.drafted  # the copy is always right
    assert len(reply.chunks) < len(reply.tokens)


def test_a_stop_token_inside_an_accepted_draft_ends_the_reply(copier: TransformersBackend) -> None:
    # The drafted copy of the cycle runs 102 ... 110, then 2 (end of sequence), then 111 ...
    prompt = [*COPY_CYCLE, 100, 101]
    reply = run(copier, prompt, k=5, max_new=40)
    assert reply.done.stop_reason == "end_of_turn"  # id 2 is <|im_end|> in this tokenizer
    assert reply.tokens == list(range(102, 111))  # nothing at or after the stop token
    assert 2 not in reply.tokens
    last = reply.chunks[-1]
    assert last.drafted == 5 and last.accepted == len(last.token_ids)  # the stop came from the draft
    assert len(last.origins) == len(last.token_ids)
    assert reply.tokens == run(copier, prompt, k=0, max_new=40).tokens


def test_max_new_tokens_is_exact_inside_a_round(copier: TransformersBackend) -> None:
    prompt = [*COPY_CYCLE, 111, 112]
    for max_new in (1, 2, 6, 7):
        reply = run(copier, prompt, k=5, max_new=max_new)
        assert reply.tokens == cycle_after(112, max_new)
        assert reply.done.stop_reason == "max_new_tokens"
        assert all(c.drafted <= 5 for c in reply.chunks)


def test_partial_accept_rolls_the_cache_back(copier: TransformersBackend) -> None:
    # "111 112 113" occurred before, followed by 114 and then a detour (50 51 ...) the model will not take:
    # the first draft is [114, 50, 51, 52, 53], accepted up to 114.
    prompt = [111, 112, 113, 114, 50, 51, 52, 53, 100, 101, 111, 112, 113]
    plain = run(copier, prompt, k=0, max_new=12)
    reply = run(copier, prompt, k=5, max_new=12)
    assert reply.tokens == plain.tokens == cycle_after(113, 12)
    partial = [c for c in reply.chunks if 0 < c.accepted < c.drafted]
    assert partial, "the detour must be drafted and rejected after an accepted token"
    # The cache holds the prompt and every emitted token but the last (which opens the next round).
    assert_cache_matches_a_fresh_prefill(copier, prompt + plain.tokens[:-1])


def test_sampled_output_is_identical_with_and_without_drafting(copier: TransformersBackend) -> None:
    prompt = [*COPY_CYCLE, 105, 106]
    settings = dict(temperature=0.8, top_p=0.9, top_k=40)
    drafted = run(copier, prompt, k=5, max_new=24, **settings)
    plain = run(copier, prompt, k=0, max_new=24, **settings)
    assert drafted.tokens == plain.tokens
    assert drafted.drafted > 0
