"""The repetition guard: a reply stuck repeating one span is stopped with a note, not run to max_new_tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.decoding.stop_rules import MAX_PERIOD, MIN_REPEATED_TOKENS, REPEATS, RepetitionGuard
from tests.support.drafting import FreeVerify
from tests.support.replies import generate
from tests.support.tiny_models import COPY_CYCLE


def first_stop(tokens: list[int]) -> tuple[int, int] | None:
    guard = RepetitionGuard()
    for i, token in enumerate(tokens):
        period = guard.push(token)
        if period is not None:
            return i, period
    return None


@pytest.mark.parametrize("period", [1, 2, 7, 40, MAX_PERIOD])
def test_a_span_repeated_long_enough_stops_at_its_period(period: int) -> None:
    span = list(range(1000, 1000 + period))
    needed = max(MIN_REPEATED_TOKENS, REPEATS * period)
    tokens = [5, 6, 7] + span * (needed // period + 3)
    assert first_stop(tokens) == (3 + period + needed - 1, period)


def test_text_that_does_not_loop_is_never_stopped() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(50) for _ in range(5000)]
    assert first_stop(tokens) is None
    # A span repeated a little (a list with a repeated line) is not a loop.
    line = list(range(200, 220))
    assert first_stop(line * 4 + tokens[:100]) is None
    # Longer periods than MAX_PERIOD are not looked for.
    assert first_stop(list(range(300, 300 + MAX_PERIOD + 1)) * 5) is None


@pytest.mark.slow
def test_a_looping_model_is_stopped_with_a_note_plain_and_drafting_alike(
    copy_model_dir: Path, monkeypatch
) -> None:
    from engine.backends.transformers import TransformersBackend

    backend = TransformersBackend(copy_model_dir, draft="ngram", cache_mode="fp16")
    backend.load()
    try:
        backend.target.costs = FreeVerify()
        # Without its stop token the successor model cycles through its 22 ids forever.
        monkeypatch.setattr(backend, "stop_token_ids", frozenset({99999}))
        prompt = [*COPY_CYCLE, 100, 101]
        plain = generate(backend, prompt, k=0, max_new=400)
        drafted = generate(backend, prompt, k=6, max_new=400)
        assert plain.done.stop_reason == drafted.done.stop_reason == "repetition"
        assert plain.tokens == drafted.tokens
        assert len(plain.tokens) < 400 and drafted.accepted > 0
        assert any("repeating the same 22-token span" in note for note in plain.done.notes)
    finally:
        backend.close()
