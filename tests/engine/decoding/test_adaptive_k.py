"""Adaptive K: the rule (pure), and the transformers backend on draft pairs whose behaviour is known.

Draft pairs (tests/conftest.py models, tests/support/draft_pairs.py): the target as its own draft (everything accepted, but a draft step costs
a target step), a random tiny draft for a different random target (nothing accepted), the copy model as the
draft of the copy model (everything accepted, made cheap by the cost model). The cost of a run is counted, not
timed: every forward pass is recorded with its width and priced by a fixed cost curve (the one the backend is
given), so the figures do not depend on the machine's load.

Mutations tried (each turned the named test red, then was reverted):
- `best_length` without the draft-step term (round_cost ignores draft_ratio): own-draft test (cost 1.13x plain).
- `AdaptiveK.record` not learning (return at once): random-draft tests (K stays at the ceiling).
- `AdaptiveK.probe_due` never true: the probe tests (the recovered draft stays off).
- `probe_spacing` returning the base interval: `test_a_probe_that_costs_more_goes_out_less_often` and
  `test_adaptive_ngram_probes_a_bucket_that_backed_off`.
- `drafting_can_pay` always true: the own-draft test (a probe every 16 rounds costs 1.09x plain) and
  `test_no_probe_where_drafting_cannot_pay`.
- the censored-window update removed: `test_a_fully_accepted_window_lets_k_grow` (K stuck below the ceiling).
- `NgramDrafter` fixed mode using the cost model: `test_fixed_ngram_drafts_k_wherever_a_match_is_found`.
- `expected_tokens` from a flat 0.7 instead of the estimates: five of the pure tests.
- `acceptance_seed` without the backend filter: `test_acceptance_seed_from_the_metrics_log`.
Elsewhere (tests/engine/backends/exllamav2/test_backend.py, tests/tui/test_pure_parts.py,
tests/engine/session/test_chat_session.py): the exl2 probe never due, its K-0 rounds not counted, its rounds not
recorded; the `K 5→3` text dropped; the live K as the last round's instead of the median; the session sending
`k_mode="fixed"` — each turned its test red.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.decoding.adaptive_k import (
    MAX_PROBE_BACKOFF,
    PROBE_BUDGET,
    PROBE_INTERVAL,
    PROBE_LENGTH,
    AdaptiveK,
    conditional_from_per_position,
    drafting_can_pay,
    probe_spacing,
)
from engine.decoding.cost_model import MAX_DRAFT_LENGTH, VerifyCostModel
from engine.decoding.drafters.ngram import NgramDrafter
from engine.storage import metrics
from tests.support.draft_pairs import (
    CPU_CURVE,
    LONG_CYCLE,
    FrozenCosts,
    pair,
    reply,
    request,
    tokens,
    with_tokenizer,
)
from tests.support.tiny_models import build_tiny_llama

# A GPU-like one: extra tokens in a pass are nearly free.
FLAT_CURVE = {w: 1.0 + 0.02 * (w - 1) for w in range(1, MAX_DRAFT_LENGTH + 2)}


# --- the rule, pure ----------------------------------------------------------------------------------------


def run_rounds(tuner: AdaptiveK, costs: VerifyCostModel, k_max: int, accepts, rounds: int) -> list[int]:
    """K chosen per round, where a round of k drafts accepts `accepts(round, k)` of them."""
    chosen = []
    for r in range(rounds):
        k = tuner.choose(k_max, costs)
        chosen.append(k)
        if k:
            tuner.record(k, min(accepts(r, k), k))
    return chosen


def test_a_useless_cheap_draft_is_off_within_16_rounds():
    chosen = run_rounds(AdaptiveK(), FrozenCosts(FLAT_CURVE, 0.05), 6, lambda r, k: 0, 64)
    assert chosen[0] > 0  # it starts out trying
    first_off = chosen.index(0)
    assert first_off <= 16
    # From then on only probes, PROBE_LENGTH long: the first after PROBE_INTERVAL rounds, then each one that
    # finds drafting still off waits twice as long.
    probes = [i for i, k in enumerate(chosen[first_off:]) if k]
    assert all(chosen[first_off + i] == PROBE_LENGTH for i in probes)
    first = PROBE_INTERVAL - 1
    assert probes[:2] == [first, first + 2 * PROBE_INTERVAL]
    assert len(probes) == 2


def test_probes_back_off_while_drafting_stays_off_and_come_back_when_it_pays():
    tuner = AdaptiveK()
    costs = FrozenCosts(FLAT_CURVE, 0.05)
    chosen = run_rounds(tuner, costs, 6, lambda r, k: 0, 4000)
    first_off = chosen.index(0)
    probes = [i for i, k in enumerate(chosen) if k and i > first_off]
    gaps = [b - a for a, b in zip([first_off - 1, *probes], probes, strict=False)]
    ceiling = PROBE_INTERVAL * MAX_PROBE_BACKOFF
    expected = [min(PROBE_INTERVAL * 2**i, ceiling) for i in range(len(gaps))]
    assert gaps == expected  # 16, 32, 64, ... rounds apart, never more than the ceiling
    assert gaps[:3] == [PROBE_INTERVAL, 2 * PROBE_INTERVAL, 4 * PROBE_INTERVAL]
    assert gaps[-3:] == [ceiling] * 3
    # The draft recovers: the probe at the ceiling finds it, drafting pays, and the next stretch without drafting
    # is probed at the base interval again.
    good = run_rounds(tuner, costs, 6, lambda r, k: k, ceiling + 40)
    assert good[-5:] == [6] * 5
    assert tuner.interval == PROBE_INTERVAL
    bad = run_rounds(tuner, costs, 6, lambda r, k: 0, 60)
    off = bad.index(0)
    assert [i - off for i, k in enumerate(bad) if k and i > off][0] == PROBE_INTERVAL - 1


def test_a_draft_as_slow_as_the_target_never_pays():
    # Everything accepted, but a draft step costs a plain step: E(k) = 1 + k for r(1 + k) + k plain steps.
    tuner = AdaptiveK(prior=(1.0,) * 8)
    costs = FrozenCosts(CPU_CURVE, 1.0)
    assert run_rounds(tuner, costs, 8, lambda r, k: k, 100) == [0] * 100


def test_no_probe_where_drafting_cannot_pay():
    assert not drafting_can_pay(FrozenCosts(CPU_CURVE, 1.0), 8)
    assert drafting_can_pay(FrozenCosts(CPU_CURVE, 0.5), 8)
    tuner = AdaptiveK(prior=(0.01,))
    assert run_rounds(tuner, FrozenCosts(FLAT_CURVE, 1.0), 6, lambda r, k: k, 80) == [0] * 80
    assert tuner.probes == 0


def test_a_cheap_agreeing_draft_rises_to_the_ceiling():
    tuner = AdaptiveK()
    chosen = run_rounds(tuner, FrozenCosts(CPU_CURVE, 0.05), 8, lambda r, k: k, 40)
    assert chosen[0] < 8  # the prior (0.7 per position) does not justify K 8 on a CPU curve
    assert chosen[-10:] == [8] * 10


def test_a_fully_accepted_window_lets_k_grow():
    # Seeded from a log where only 2 positions were ever drafted, with a poor second one: positions 3+ start at
    # the last seeded rate. All accepted from now on: K must climb past the seeded window to the ceiling.
    tuner = AdaptiveK(prior=(0.9, 0.3))
    chosen = run_rounds(tuner, FrozenCosts(CPU_CURVE, 0.1), 8, lambda r, k: k, 60)
    assert chosen[0] <= 2
    assert chosen[-5:] == [8] * 5


def test_the_probe_notices_a_recovered_draft():
    tuner = AdaptiveK()
    costs = FrozenCosts(FLAT_CURVE, 0.05)
    bad = run_rounds(tuner, costs, 6, lambda r, k: 0, 30)
    assert bad[-10:].count(0) >= 9  # off, save for a probe
    wait = tuner.interval - tuner.skipped  # the probe that found nothing doubled the wait
    assert tuner.interval == 2 * PROBE_INTERVAL
    good = run_rounds(tuner, costs, 6, lambda r, k: k, 60)
    first_on = next(i for i, k in enumerate(good) if k)
    assert first_on == wait - 1
    assert good[-5:] == [6] * 5


def test_seed_from_per_position_rates():
    assert conditional_from_per_position([0.8, 0.4, 0.2]) == pytest.approx([0.8, 0.5, 0.5])
    low, high = AdaptiveK(prior=(0.05, 0.01)), AdaptiveK(prior=(0.95, 0.9, 0.86))
    costs = FrozenCosts(CPU_CURVE, 0.05)
    assert low.plan(6, costs)[0] == 0
    assert high.plan(6, costs)[0] == 6
    assert high.per_position(3) == pytest.approx([0.95, 0.9, 0.86])


def test_fixed_ngram_drafts_k_wherever_a_match_is_found():
    context = [5, 6, 7, 8, 9, 5]  # "5" matched once (a 1-token match, rarely accepted)
    expensive = FrozenCosts(CPU_CURVE, 0.0)
    fixed = NgramDrafter(costs=expensive, fixed=True)
    fixed.reset(context)
    assert fixed.propose(4) == [6, 7, 8, 9]
    adaptive = NgramDrafter(costs=expensive, tuner=AdaptiveK())
    adaptive.reset(context)
    assert adaptive.propose(4) == []  # a 1-token match does not pay on this curve


def test_adaptive_ngram_probes_a_bucket_that_backed_off():
    tuner = AdaptiveK()
    costs = FrozenCosts(CPU_CURVE, 0.0)
    drafter = NgramDrafter(costs=costs, tuner=tuner)
    drafter.reset([5, 6, 7, 8, 9, 5])
    wait = probe_spacing(costs, PROBE_LENGTH)
    assert wait == 30  # r(3) 1.3: a probe that finds nothing wastes 0.3 of a step, 1% of 30 plain steps
    proposals = [drafter.propose(4) for _ in range(wait)]
    assert proposals[:-1] == [[]] * (wait - 1)
    assert proposals[-1] == [6, 7][:PROBE_LENGTH]


def test_a_probe_that_costs_more_goes_out_less_often():
    # A mixture of experts on a CPU: each token of a pass wakes other experts (r(3) 2.4, OLMoE-1B-7B's shape).
    moe = FrozenCosts({w: 1.0 + 0.7 * (w - 1) for w in range(1, MAX_DRAFT_LENGTH + 2)}, 0.0)
    cheap = FrozenCosts(FLAT_CURVE, 0.0)
    assert probe_spacing(cheap, PROBE_LENGTH) == PROBE_INTERVAL
    assert probe_spacing(moe, PROBE_LENGTH) == 140
    assert probe_spacing(moe, 1) == 70  # a one-token probe (the MTP head's) wastes half as much
    for costs in (cheap, moe):
        tuner = AdaptiveK(prior=(0.0,))
        chosen = run_rounds(tuner, costs, 6, lambda r, k: 0, 3000)
        probes = [i for i, k in enumerate(chosen) if k]
        waste = sum(costs.ratio(1 + chosen[i]) - 1 for i in probes)
        assert waste <= PROBE_BUDGET * len(chosen)  # what probing that finds nothing costs, at most
        gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
        spacing = probe_spacing(costs, PROBE_LENGTH)
        ceiling = max(spacing, PROBE_INTERVAL * MAX_PROBE_BACKOFF)
        assert gaps[0] == min(2 * spacing, ceiling)  # doubled by the first probe that found nothing ...
        assert max(gaps) == ceiling  # ... and again by each one after, up to the ceiling


def test_acceptance_seed_from_the_metrics_log():
    def row(preset, rates, drafted, model="m", draft="ngram", backend="transformers"):
        return {
            "timestamp": 1.0,
            "preset": preset,
            "model": model,
            "draft": draft,
            "backend": backend,
            "drafted_tokens": drafted,
            "per_position_acceptance": rates,
        }

    rows = [
        row("code", [1.0, 1.0], 10),
        row("code", [0.0], 30),
        row("qa", [0.5], 10),  # another preset
        row("code", [0.9], 10, model="other"),  # another model
        row("code", [0.9], 10, draft="d"),  # another draft
        row("code", [0.9], 10, backend="llama.cpp"),  # another backend
        row("code", [0.9], 0),  # nothing drafted
    ]
    seed = metrics.acceptance_seed(rows, "code", model="m", draft="ngram", backend="transformers")
    assert seed == pytest.approx((0.25, 1.0))
    assert metrics.acceptance_seed(rows, "creative", model="m", draft="ngram", backend="transformers") == ()


# --- the transformers backend on known draft pairs ------------------------------------------------------------


class PassCounter:
    """Records the width of every forward pass of a model state (target or draft)."""

    def __init__(self, state) -> None:
        self.widths: list[int] = []
        original = state.forward

        def forward(ids, keep, timed=False):
            self.widths.append(len(ids))
            return original(ids, keep, timed)

        state.forward = forward

    def cost(self, curve: dict[int, float], scale: float = 1.0) -> float:
        """Plain target steps: each pass priced by the cost curve, times the model's cost relative to the target."""
        return scale * sum(curve.get(w, curve[max(curve)] + 0.15 * (w - max(curve))) for w in self.widths)


@pytest.fixture(scope="module")
def random_draft_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny random Llama with SmolLM2's tokenizer (other seed): its guesses are the target's by chance."""
    folder = tmp_path_factory.mktemp("tiny-random-draft")
    vocab_size = int(json.loads((smol_dir / "config.json").read_text())["vocab_size"])
    build_tiny_llama(folder, vocab_size, seed=999)
    return with_tokenizer(folder, smol_dir)


PROMPT = [1, 9690, 198, 5248, 314, 253, 1493, 30, 2, 198, 1, 520, 9531, 198]


@pytest.mark.slow
def test_target_as_its_own_draft_runs_at_plain_cost(tiny_model_dir: Path):
    """Acceptance ~100%, cost ratio 1 (the draft is the target): drafting must not run, within 5% of plain."""
    backend = pair(tiny_model_dir, tiny_model_dir, CPU_CURVE, 1.0)
    try:
        target_counter, draft_counter = PassCounter(backend.target), PassCounter(backend.draft_state)
        plain, _ = reply(backend, request(PROMPT, 0, 48, mode="fixed"))
        plain_cost = target_counter.cost(CPU_CURVE)
        assert len(tokens(plain)) >= 24

        fixed, _ = reply(backend, request(PROMPT, 6, 48, mode="fixed"))
        assert tokens(fixed) == tokens(plain)
        assert sum(c.accepted for c in fixed) / sum(c.drafted for c in fixed) > 0.9  # it does agree

        target_counter.widths.clear()
        draft_counter.widths.clear()
        adaptive, _ = reply(backend, request(PROMPT, 6, 48))
        assert tokens(adaptive) == tokens(plain)
        adaptive_cost = target_counter.cost(CPU_CURVE) + draft_counter.cost(CPU_CURVE, scale=1.0)
        assert adaptive_cost <= 1.05 * plain_cost, (adaptive_cost, plain_cost)
        assert all(c.k == 0 for c in adaptive)
    finally:
        backend.close()


@pytest.mark.slow
def test_a_random_draft_is_off_within_16_rounds(tiny_model_dir: Path, random_draft_dir: Path):
    backend = pair(tiny_model_dir, random_draft_dir, FLAT_CURVE, 0.05)
    try:
        plain, _ = reply(backend, request(PROMPT, 0, 64, mode="fixed"))
        chunks, _ = reply(backend, request(PROMPT, 6, 64))
        assert tokens(chunks) == tokens(plain)
        assert sum(c.accepted for c in chunks) <= 0.1 * max(sum(c.drafted for c in chunks), 1)
        ks = [c.k for c in chunks]
        assert ks[0] > 0
        off = ks.index(0)
        assert off <= 16
        assert all(k in (0, PROBE_LENGTH) for k in ks[off:])  # afterwards only probes
    finally:
        backend.close()


@pytest.mark.slow
def test_a_cheap_agreeing_draft_rises_to_the_ceiling_and_a_probe_brings_it_back(
    long_copy_dir: Path, random_draft_dir: Path
):
    # The copy model drafting for itself: always right; the cost model makes its step cheap (a small draft).
    prompt = [*LONG_CYCLE[:10], 1, 2, *LONG_CYCLE[:3]]
    good = pair(long_copy_dir, long_copy_dir, CPU_CURVE, 0.05)
    bad = pair(long_copy_dir, random_draft_dir, CPU_CURVE, 0.05)
    try:
        plain, _ = reply(good, request(prompt, 0, 96, mode="fixed"))
        expected = tokens(plain)
        chunks, _ = reply(good, request(prompt, 8, 96))
        assert tokens(chunks) == expected
        ks = [c.k for c in chunks]
        assert ks[0] < 8 and 8 in ks  # rose to the ceiling ...
        assert set(ks[ks.index(8) : -1]) == {8}  # ... and stayed there (the last round is cut by the budget)

        # The same preset's state on a draft that is always wrong: drafting goes off.
        bad.tuners = good.tuners
        chunks, _ = reply(bad, request(prompt, 8, 40))
        assert tokens(chunks) == expected[:40]
        assert [c.k for c in chunks][-8:].count(0) >= 7
        # The draft recovers (the good one is back): at the next probe drafting is on again, then rises.
        tuner = next(iter(good.tuners.values()))
        wait = tuner.probe_wait(FrozenCosts(CPU_CURVE, 0.05)) - tuner.skipped
        # (A longer reply: a probe costs 0.4 of a step on this curve, so it waits 40 rounds, not 16.)
        chunks, _ = reply(good, request(prompt, 8, 160))
        assert tokens(chunks)[:96] == expected
        ks = [c.k for c in chunks]
        # (Its first rounds may draft from the n-gram lookup beside the draft model; then the probe.)
        probe = next(i for i, k in enumerate(ks) if k and i and not ks[i - 1])
        assert probe <= wait
        assert all(ks[probe:]) and max(ks[probe:]) >= 8  # on again from the probe, and risen
    finally:
        good.close()
        bad.close()


@pytest.mark.slow
def test_fixed_k_drafts_every_round(tiny_model_dir: Path, random_draft_dir: Path):
    backend = pair(tiny_model_dir, random_draft_dir, CPU_CURVE, 1.0)
    try:
        chunks, _ = reply(backend, request(PROMPT, 3, 24, mode="fixed"))
        assert all(c.drafted == c.k for c in chunks)
        assert [c.k for c in chunks[:-3]] == [3] * (len(chunks) - 3)  # the last rounds: cut by the budget
    finally:
        backend.close()
