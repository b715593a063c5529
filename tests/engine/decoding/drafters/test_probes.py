"""While no K pays, adaptive K sends a probe now and then: the draft model's drafts PROBE_LENGTH tokens, the MTP
head's one (each head step carries the whole vocabulary's row after a catch-up; engine/decoding/drafters/mtp.py)."""

from __future__ import annotations

import math
import threading

import pytest

from engine.decoding import adaptive_k
from engine.decoding.adaptive_k import PROBE_LENGTH, AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters.base import Plan
from engine.decoding.drafters.draft_model import DraftModelDrafter
from engine.decoding.drafters.mtp import MTP_PROBE_LENGTH, MTP_PROBE_WINDOW, MtpDrafter
from tests.engine.decoding.drafters.test_draft_model_catch_up import VOCAB, BatchedModel


class Head(BatchedModel):
    """An MTP head's interface: it also says when the drafter let it skip what it lags behind."""

    def __init__(self, batch: int) -> None:
        super().__init__(batch)
        self.skips: list[int] = []
        self.catch_ups = 0

    def skip_behind(self, keep: int) -> None:
        self.skips.append(keep)

    def catch_up(self, cancel=None) -> None:
        self.catch_ups += 1


@pytest.fixture(autouse=True)
def probe_every_round(monkeypatch):
    """The tuners here probe every round (`probe_interval=1`) whatever a probe costs (no PROBE_BUDGET)."""
    monkeypatch.setattr(adaptive_k, "PROBE_BUDGET", math.inf)


def probe_lengths(cls: type[DraftModelDrafter]) -> list[int]:
    """The drafts sent over 8 rounds by a drafter nothing of which is ever accepted, probing every round."""
    model = Head(batch=64)
    tuner = AdaptiveK(prior=[0.0], probe_interval=1)
    drafter = cls(model, VOCAB, VerifyCostModel(), tuner, adaptive=True)
    seq = list(range(10))
    sent = []
    for _ in range(8):
        drafts = drafter.draft(Plan(drafter, 4, 1.0), seq)
        sent.append(len(drafts))
        drafter.accept(len(drafts), 0)
        seq.append(len(seq) % VOCAB)
    return [n for n in sent if n]


def test_the_mtp_head_probes_with_one_token_and_a_draft_model_with_two():
    assert MTP_PROBE_LENGTH == 1 < PROBE_LENGTH == 2
    mtp, model = probe_lengths(MtpDrafter), probe_lengths(DraftModelDrafter)
    assert mtp and set(mtp) == {MTP_PROBE_LENGTH}
    assert model and set(model) == {PROBE_LENGTH}


def test_a_probe_lets_the_head_skip_a_long_prompt_and_a_paying_draft_feeds_it_everything():
    # Red with the skip left out (a probe after a 600-token prompt fed the head all of it: 0.96x plain in the bench)
    # or made on every draft (a head that pays would lose its context).
    costs = VerifyCostModel()
    idle = MtpDrafter(Head(batch=64), VOCAB, costs, AdaptiveK(prior=[0.0], probe_interval=1), adaptive=True)
    assert len(idle.draft(Plan(idle, 4, 1.0), list(range(600)))) == MTP_PROBE_LENGTH
    assert idle.model.skips == [MTP_PROBE_WINDOW]
    paying = MtpDrafter(Head(batch=64), VOCAB, costs, AdaptiveK(prior=[0.95] * 4), adaptive=True)
    assert len(paying.draft(Plan(paying, 4, 1.0), list(range(600)))) > MTP_PROBE_LENGTH
    assert paying.model.skips == []


def test_a_head_that_pays_takes_the_prompt_at_the_start_of_the_reply_and_one_that_does_not_waits():
    # Red with the catch-up left out of begin (a reply's first draft then took a whole prompt in decode time: the
    # bench's first replies read 0.95-0.97x plain) or made on every reply (a head that never pays would take every
    # prompt whole, where a probe takes MTP_PROBE_WINDOW tokens).
    costs, prompt, cancel = VerifyCostModel(), list(range(600)), threading.Event()
    paying = MtpDrafter(Head(batch=64), VOCAB, costs, AdaptiveK(prior=[0.95] * 4), adaptive=True)
    fixed = MtpDrafter(Head(batch=64), VOCAB, costs, AdaptiveK(prior=[0.0]), adaptive=False)
    idle = MtpDrafter(Head(batch=64), VOCAB, costs, AdaptiveK(prior=[0.0]), adaptive=True)
    for drafter in (paying, fixed, idle):
        drafter.begin(prompt, cancel)
    assert (paying.model.catch_ups, fixed.model.catch_ups, idle.model.catch_ups) == (1, 1, 0)
