"""Whose acceptance is whose: n-gram rounds beside a draft model are counted apart, so the next run's adaptive K
for the draft model starts from the draft model's own rounds, not from the lookup's long copies."""

from __future__ import annotations

import pytest

from engine.decoding.acceptance import AcceptanceAccounting
from engine.events import Chunk, Done
from engine.storage import metrics


def chunk(drafted: int, accepted: int, drafter: str | None, t: float) -> Chunk:
    tokens = tuple(range(accepted + 1))
    origins = (True,) * accepted + (False,)
    return Chunk(
        "x" * len(tokens), tokens, drafted, accepted, origins, t, drafter=drafter if drafted else None
    )


def finish(chunks: list[Chunk]):
    accounting = AcceptanceAccounting(t_start=0.0)
    for c in chunks:
        accounting.add(c)
    done = Done("eos", prompt_tokens=10)
    return accounting.finish(
        done,
        1.0,
        preset="code",
        num_draft_tokens=4,
        temperature=0.0,
        draft_mode="model",
        backend="b",
        model="m",
    )


def test_lookup_rounds_beside_a_draft_model_are_kept_out_of_the_draft_models_rates() -> None:
    stats = finish(
        [
            chunk(4, 1, "model", 0.1),  # the draft model: 1 of 4
            chunk(4, 0, "model", 0.2),  # 0 of 4
            chunk(20, 20, "ngram", 0.3),  # lookup copied 20
            chunk(0, 0, None, 0.4),  # no draft
        ]
    )
    assert stats.per_position_acceptance[:2] == pytest.approx([2 / 3, 1 / 3])  # all rounds, lookup included
    assert stats.model_per_position_acceptance == pytest.approx([0.5, 0.0, 0.0, 0.0])


def test_one_drafter_alone_needs_no_second_figure() -> None:
    assert (
        finish([chunk(4, 2, "model", 0.1), chunk(4, 4, "model", 0.2)]).model_per_position_acceptance is None
    )
    assert finish([chunk(8, 8, "ngram", 0.1)]).model_per_position_acceptance is None


def test_the_seed_reads_the_draft_models_own_rates_where_the_log_has_them() -> None:
    base = {"timestamp": 1.0, "preset": "code", "model": "m", "draft": "d", "backend": "llama.cpp"}
    rows = [
        {
            **base,
            "drafted_tokens": 10,
            "per_position_acceptance": [0.9, 0.9],
            "model_per_position_acceptance": [0.2],
        },
        {
            **base,
            "drafted_tokens": 10,
            "per_position_acceptance": [0.4],
            "model_per_position_acceptance": None,
        },
    ]
    seed = metrics.acceptance_seed(rows, "code", model="m", draft="d", backend="llama.cpp")
    assert seed == pytest.approx((0.3,))  # 0.2 (the draft model's own rounds) and 0.4, weighed alike
