"""Every drafter in the name map keeps the Drafter contract (engine/decoding/drafters/base.py), alone and beside
the drafters its entry names: it is built by its factory and named by its entry, its plan is its own and never
longer than the round allows, it learns and ends without error, and a greedy reply through the round loop with it
is token for token the plain reply (the target verifies every draft), while it drafts. A drafter added to the map
runs here without a line of this file changing."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters import DRAFTERS, DraftContext, Plan, best_plan, build_drafters
from engine.decoding.round_loop import LoopSetup, run_reply
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings

VOCAB = 40
PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
BUILT = sorted(name for name, spec in DRAFTERS.items() if spec.build is not None)


def follows(token: int) -> int:
    """The target's greedy rule: a cycle of 12 tokens, so the reply repeats itself (lookups find it)."""
    return (token + 1) % 12 + 1


class RuleModel:
    """A CachedModel whose greedy next token is `rule(last token)`, whatever came before."""

    def __init__(self, rule, costs: VerifyCostModel | None) -> None:
        self.rule = rule
        self.ids: list[int] = []
        self.step_times: list[float] = []
        self.costs = costs
        self.can_crop = True

    def prefill(self, ids, cancel=None) -> int:
        reused = 0
        while reused < min(len(ids), len(self.ids)) and ids[reused] == self.ids[reused]:
            reused += 1
        self.ids = list(ids)
        return reused

    def score(self, tokens):
        self.ids.extend(tokens)
        self.step_times.append(0.001)
        rows = torch.full((len(tokens), VOCAB), -10.0)
        for i, token in enumerate(tokens):
            rows[i, self.rule(token)] = 10.0
        return rows

    def next_logits(self, tokens):
        return self.score(tokens)[-1]

    def crop(self, length: int) -> None:
        del self.ids[length:]

    # As the MTP drafter's head (drafters/mtp.py MtpHeadModel): it decodes every token at once, so nothing lags.
    def catch_up(self, cancel=None) -> None:
        pass

    def skip_behind(self, keep: int) -> None:
        pass


class Text:
    def push(self, token_ids, final: bool = False) -> str:
        return "".join(chr(65 + t) for t in token_ids)


def models() -> tuple[RuleModel, RuleModel]:
    # A cheap verify pass and a cheap draft model, so that drafting pays wherever a drafter plans by cost; the
    # draft model is wrong after a 5 or a 9 (rejections too, the last round's included).
    costs = VerifyCostModel.from_ratios({w: 1.0 + 0.02 * (w - 1) for w in range(1, 50)}, draft_ratio=0.05)
    target = RuleModel(follows, costs)
    draft = RuleModel(lambda t: follows(t) if t not in (5, 9) else (follows(t) + 1) % VOCAB, None)
    return target, draft


def context(adaptive: bool, beside: bool = False) -> DraftContext:
    target, draft = models()
    return DraftContext(
        target=target, draft=draft, tuner=AdaptiveK(), adaptive=adaptive, vocab_size=VOCAB, beside=beside
    )


def reply(drafters: list, target: RuleModel, adaptive: bool, max_new: int = 40) -> list[Chunk | Done]:
    setup = LoopSetup(
        target=target,
        drafters=drafters,
        stop_token_ids=frozenset(),
        end_of_turn_id=None,
        max_context=512,
        vocab_size=VOCAB,
        new_text=Text,
        max_draft=16,
    )
    request = GenerationRequest(
        prompt_ids=tuple(PROMPT),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=4,
        drafting=True,
        seed=0,
        k_mode="adaptive" if adaptive else "fixed",
    )
    return list(run_reply(setup, request, threading.Event()))


def tokens_of(events: list[Chunk | Done]) -> list[int]:
    return [t for e in events if isinstance(e, Chunk) for t in e.token_ids]


def test_the_map_names_every_drafter_the_loop_can_build_and_its_companions() -> None:
    assert {"ngram", "model"} <= set(BUILT)
    for spec in DRAFTERS.values():
        assert spec.description and spec.label
        for name in spec.beside:
            assert DRAFTERS[name].build is not None, (
                f"{spec.name} is asked beside {name}, which the loop cannot build"
            )


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("name", BUILT)
def test_a_drafter_is_named_by_its_entry_and_keeps_the_interface(name: str, beside: bool) -> None:
    build = DRAFTERS[name].build
    drafter = build(context(adaptive=True, beside=beside))
    assert drafter.name == name
    for method in ("begin", "plan", "draft", "accept", "extend", "end"):
        assert callable(getattr(drafter, method)), f"{name} lacks {method}"
    assert hasattr(drafter, "costs") and drafter.step_times == []


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("name", BUILT)
def test_a_plan_is_the_drafters_own_and_never_longer_than_the_round_allows(name: str, adaptive: bool) -> None:
    ctx = context(adaptive)
    drafter = DRAFTERS[name].build(ctx)
    seq = [*PROMPT]
    for _ in range(30):
        seq.append(follows(seq[-1]))
    drafter.begin(PROMPT, threading.Event())
    drafter.extend(seq[len(PROMPT) :])
    for k, k_long in ((1, 0), (3, 0), (4, 12)):
        plan = drafter.plan(k, k_long)
        assert isinstance(plan, Plan) and plan.drafter is drafter and plan.k == k
        assert plan.rate > 0
        drafts = drafter.draft(plan, seq)
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in drafts)
        assert len(drafts) <= max(k, k_long)
        if plan.tokens is not None:
            assert drafts == plan.tokens  # what it offered is what goes out
        drafter.accept(len(drafts), len(drafts) // 2)
        drafter.extend([follows(seq[-1])])
        seq.append(follows(seq[-1]))
    drafter.end(seq)
    if ctx.draft is not None:
        assert len(ctx.draft.ids) <= len(seq)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("name", BUILT)
def test_a_greedy_reply_with_the_drafter_is_the_plain_reply_and_it_drafts(name: str, adaptive: bool) -> None:
    target, _ = models()
    plain = reply([], target, adaptive)
    assert not any(isinstance(e, Chunk) and e.drafted for e in plain)

    ctx = context(adaptive)
    drafters = build_drafters(name, ctx)
    assert drafters[0].name == name  # the entry's own drafter first: the primary
    events = reply(drafters, ctx.target, adaptive)
    assert tokens_of(events) == tokens_of(plain)
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert sum(c.drafted for c in chunks) > 0, f"{name} never drafted on a reply that repeats itself"
    assert {c.drafter for c in chunks if c.drafted} <= {d.name for d in drafters}
    assert all(c.drafter is None for c in chunks if not c.drafted)
    kept = PROMPT + tokens_of(events)
    assert ctx.target.ids == kept[: len(ctx.target.ids)] and len(ctx.target.ids) <= len(kept)
    if ctx.draft is not None:  # no rejected draft stays in the draft model's cache either
        assert ctx.draft.ids == kept[: len(ctx.draft.ids)]
    assert isinstance(events[-1], Done)


def test_the_best_plan_is_the_primarys_unless_another_offers_strictly_more() -> None:
    first, second = object(), object()
    lazy = Plan(first, 4, rate=1.2)  # a draft model's: its tokens come later
    assert best_plan([lazy, Plan(second, 4, rate=1.2, tokens=[1, 2])]) is lazy  # ties go to the primary
    better = Plan(second, 4, rate=1.5, tokens=[1, 2])
    assert best_plan([lazy, better]) is better
    assert best_plan([lazy, Plan(second, 4, rate=9.0, tokens=[])]) is lazy  # nothing offered: no contest
    empty = Plan(first, 4, rate=1.0, tokens=[])
    assert best_plan([empty, Plan(second, 4, rate=1.0, tokens=[3])]).drafter is second
