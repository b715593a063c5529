"""The acceptance arithmetic (engine.decoding.acceptance): alpha solved from the tokens per round, the predicted
speedup, the best K for an alpha and a cost, and the accounting of rounds, positions and the live average."""

import math

import pytest

from engine.decoding.acceptance import AcceptanceAccounting, best_k, predicted_speedup, solve_alpha
from engine.events import Chunk, Done


def chunk(n_tokens: int, drafted: int, accepted: int, t: float, temperature: float = 0.0) -> Chunk:
    origins = tuple([True] * accepted + [False] * (n_tokens - accepted))
    return Chunk("x" * n_tokens, tuple(range(n_tokens)), drafted, accepted, origins, t, temperature)


def test_solve_alpha_exact_values():
    assert solve_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-9)  # 0.5 + 0.25 = 0.75
    assert solve_alpha(1.0, 4) == 0.0
    assert solve_alpha(0.5, 4) == 0.0
    assert solve_alpha(5.0, 4) == 1.0
    assert solve_alpha(9.0, 4) == 1.0
    a = solve_alpha(3.0, 4)
    assert a + a**2 + a**3 + a**4 == pytest.approx(2.0, abs=1e-8)
    with pytest.raises(ValueError):
        solve_alpha(2.0, 0)


def test_predicted_speedup_formula():
    assert predicted_speedup(0.5, 2, 0.1) == pytest.approx(0.875 / 0.6)
    assert predicted_speedup(1.0, 4, 0.25) == pytest.approx(2.5)
    assert predicted_speedup(0.0, 4, 0.0) == pytest.approx(1.0)
    assert predicted_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)
    assert predicted_speedup(0.9, 0, 0.1) == 1.0


def test_best_k_tracks_alpha_and_cost():
    assert best_k(0.0, 0.1) == 0  # drafting never pays when nothing is accepted
    assert best_k(0.9, 0.0) == 16  # free drafts: draft as many as allowed
    high, low = best_k(0.9, 0.1), best_k(0.6, 0.1)
    assert high > low >= 1


def test_accounting_rounds_positions_histogram_alpha():
    acc = AcceptanceAccounting(t_start=0.0)
    acc.add(chunk(5, 4, 4, t=1.0))  # all four accepted + bonus
    acc.add(chunk(3, 4, 2, t=1.5))
    acc.add(chunk(1, 4, 0, t=2.0))
    acc.add(chunk(1, 0, 0, t=2.5))  # a plain step (drafter backed off)
    done = Done(
        "eos", prompt_tokens=20, cached_tokens=4, prefill_s=0.8, draft_step_s=0.01, target_step_s=0.04
    )
    stats = acc.finish(
        done,
        t_end=3.0,
        preset="code",
        num_draft_tokens=4,
        temperature=0.2,
        draft_mode="model",
        backend="transformers",
        model="m",
    )
    assert stats.new_tokens == 10
    assert stats.rounds == 4
    assert stats.drafted_tokens == 12
    assert stats.accepted_tokens == 6
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.mean_accepted_length == pytest.approx(2.5)
    assert stats.per_position_acceptance == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert stats.acceptance_histogram == [1, 0, 1, 0, 1]
    # alpha over drafting rounds only: 9 tokens / 3 rounds = tau 3 with K = 4
    a = stats.alpha
    assert a + a**2 + a**3 + a**4 == pytest.approx(2.0, abs=1e-8)
    assert stats.cost_ratio == pytest.approx(0.25)
    assert stats.predicted_speedup == pytest.approx((1 - a**5) / ((1 - a) * 2.0))
    assert stats.ttft_s == pytest.approx(1.0)
    assert stats.prefill_tokens_per_s == pytest.approx(16 / 0.8)
    # five tokens came with the first chunk; five more over 1.5 s
    assert stats.decode_tokens_per_s == pytest.approx(5 / 1.5)
    assert stats.total_s == pytest.approx(3.0)
    assert stats.stop_reason == "eos"


def test_accounting_without_drafting_reports_none_not_zero():
    acc = AcceptanceAccounting(t_start=0.0)
    for i in range(4):
        acc.add(chunk(1, 0, 0, t=0.5 + i * 0.1))
    stats = acc.finish(
        Done("max_new_tokens", prompt_tokens=5),
        t_end=1.0,
        preset="qa",
        num_draft_tokens=0,
        temperature=0.5,
        draft_mode="none",
        backend="transformers",
        model="m",
    )
    assert stats.acceptance_rate is None
    assert stats.alpha is None
    assert stats.predicted_speedup is None
    assert stats.per_position_acceptance == []
    assert stats.mean_accepted_length == pytest.approx(1.0)
    assert stats.decode_tokens_per_s == pytest.approx(3 / 0.3)


def test_live_ema_and_sparkline():
    acc = AcceptanceAccounting(t_start=0.0)
    acc.add(chunk(5, 4, 4, t=0.1))
    assert acc.live.ema_acceptance == pytest.approx(1.0)
    acc.add(chunk(1, 4, 0, t=0.2))
    assert acc.live.ema_acceptance == pytest.approx(0.8)
    assert acc.live.recent_round_acceptance == [1.0, 0.0]
    for i in range(40):
        acc.add(chunk(2, 2, 1, t=0.3 + i))
    assert len(acc.live.recent_round_acceptance) == 32
    assert acc.live.acceptance_rate == pytest.approx((4 + 40) / (8 + 80))
    assert math.isfinite(acc.live.tokens_per_s)
