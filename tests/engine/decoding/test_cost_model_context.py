"""The verify-cost model in long copies and long contexts, with planted pass costs (exact numbers, no timing).

A pass over c cached tokens costs more than over 64, and every row of a wide pass attends over the whole cache. The
model keeps its ratios at the calibration's context and reads them at the latest pass's; where every round drafts
(a long copy), the last one-token pass ran over a shorter cache, and a wide pass must be compared with what a
one-token pass costs now, not then, or n-gram drafts get shorter exactly where they pay most.
"""

from __future__ import annotations

import pytest

from engine.backends.llamacpp.threads import PassCost
from engine.decoding.cost_model import VerifyCostModel

MS = 0.001
BASE = {1: 10 * MS, 9: 20 * MS, 49: 50 * MS}
GROWTH = {1: 4 * MS / 1000, 9: 12 * MS / 1000, 49: 40 * MS / 1000}  # seconds per cached token


def seconds(width: int, context: int) -> float:
    """A planted machine: linear in the width between 1, 9 and 49, linear in the cached tokens."""
    points = sorted(BASE)
    for a, b in zip(points, points[1:], strict=False):
        if width <= b:
            f = (width - a) / (b - a)
            base = BASE[a] + f * (BASE[b] - BASE[a])
            growth = GROWTH[a] + f * (GROWTH[b] - GROWTH[a])
            return base + growth * context
    raise ValueError(width)


def model() -> VerifyCostModel:
    costs = VerifyCostModel.from_samples({w: seconds(w, 64) for w in (1, 2, 3, 5, 9, 17, 33, 49)})
    costs.set_context_shape(seconds, 64)
    return costs


def test_a_wide_pass_deep_in_a_copy_is_compared_with_a_one_token_pass_at_its_own_context() -> None:
    costs = model()
    costs.context = 200
    costs.observe(1, seconds(1, 200))  # the last one-token pass, early in the reply
    for context in range(400, 4000, 49):  # then a long copy: every round drafts 48, no one-token pass
        costs.context = context
        costs.observe(49, seconds(49, context))
    # The passes cost exactly what the shape says: the model must not have learnt them dearer.
    assert costs.as_dict()[49] == pytest.approx(seconds(49, 64) / seconds(1, 64), rel=1e-9)
    costs.context = 3000
    assert costs.ratio(49) == pytest.approx(seconds(49, 3000) / seconds(1, 3000), rel=1e-9)
    assert costs.one_token_s == pytest.approx(seconds(1, 3000), rel=1e-9)


def test_without_a_context_shape_the_recent_one_token_time_is_the_reference() -> None:
    costs = VerifyCostModel.from_samples({1: 10 * MS, 9: 20 * MS})
    costs.context = 3000  # no shape: the context means nothing
    costs.observe(1, 12 * MS)
    assert costs.one_token_s == pytest.approx(10 * MS + 0.3 * 2 * MS)


def test_the_pass_cost_learns_only_from_widths_it_measured() -> None:
    cost = PassCost({1: 10 * MS, 9: 20 * MS}, 64, {1: 14 * MS, 9: 32 * MS}, 576)
    cost.learn(9, 2000, 3 * cost.predict(9, 2000))
    moved = cost.scale
    assert moved != 1.0
    cost.scale = 1.0
    cost.learn(49, 2000, 3 * cost.predict(49, 2000))  # 49 is extrapolated from 1 and 9: it teaches nothing
    assert cost.scale == 1.0
    wide = PassCost({1: 10 * MS, 9: 20 * MS, 49: 50 * MS}, 64, {1: 14 * MS, 9: 32 * MS, 49: 80 * MS}, 576)
    wide.learn(49, 2000, 3 * wide.predict(49, 2000))  # measured at load: it does
    assert wide.scale != 1.0
