"""The round loop's steps one at a time (engine/decoding/round_steps.py), on a model whose next token is a fixed
rule and drafters that propose what they are told: what each step decides from what it is given."""

from __future__ import annotations

import threading

import torch

from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters import Plan
from engine.decoding.round_loop import LoopSetup
from engine.decoding.round_steps import (
    NO_CROP_NOTE,
    Round,
    accept_round,
    account_round,
    finish_reply,
    open_round,
    plan_round,
    price_round,
    reply_k,
    start_reply,
    verify_round,
)
from engine.decoding.stop_rules import MIN_REPEATED_TOKENS
from engine.request import GenerationRequest, SamplerSettings

VOCAB = 32
PROMPT = [1, 2, 3]


def successor(token: int) -> int:
    return token % 20 + 1


class RuleModel:
    """A CachedModel whose greedy next token is `successor(last token)`."""

    def __init__(self, can_crop: bool = True) -> None:
        self.ids: list[int] = []
        self.step_times: list[float] = []
        self.costs = VerifyCostModel.from_ratios(
            {w: 1.0 + 0.1 * (w - 1) for w in range(1, 40)}, draft_ratio=0.0
        )
        self.can_crop = can_crop
        self.crops: list[int] = []

    def prefill(self, ids, cancel=None) -> int:
        self.ids = list(ids)
        return 0

    def score(self, tokens):
        self.ids.extend(tokens)
        self.step_times.append(0.01 * len(tokens))
        rows = torch.full((len(tokens), VOCAB), -10.0)
        for i, token in enumerate(tokens):
            rows[i, successor(token)] = 10.0
        return rows

    def crop(self, length: int) -> None:
        self.crops.append(length)
        del self.ids[length:]


class Told:
    """A drafter that plans and drafts what it is told, and remembers what it learns."""

    def __init__(self, name: str, tokens: list[int], rate: float = 2.0, wanted_longer: bool = False) -> None:
        self.name = name
        self.tokens = tokens
        self.rate = rate
        self.wanted_longer = wanted_longer
        self.costs = VerifyCostModel.from_ratios({w: 1.0 for w in range(1, 40)}, draft_ratio=0.5)
        self.step_times: list[float] = []
        self.asked: list[tuple[int, int]] = []
        self.learned: list[tuple[int, int]] = []
        self.grown: list[int] = []

    def begin(self, prompt, cancel) -> None:
        pass

    def plan(self, k: int, k_long: int) -> Plan:
        self.asked.append((k, k_long))
        return Plan(self, k, self.rate, self.tokens[: max(k, k_long)], self.wanted_longer)

    def draft(self, plan: Plan, seq) -> list[int]:
        return list(plan.tokens)

    def accept(self, drafted: int, accepted: int) -> None:
        self.learned.append((drafted, accepted))

    def extend(self, token_ids) -> None:
        self.grown.extend(token_ids)

    def end(self, kept) -> None:
        pass


class Letters:
    def push(self, token_ids, final: bool = False) -> str:
        return "".join(chr(64 + t) for t in token_ids)


def make(
    drafters=(),
    k: int = 4,
    max_new: int = 40,
    stops=frozenset(),
    end_of_turn=None,
    stop_strings=(),
    max_draft: int = 16,
    adaptive: bool = True,
    can_crop: bool = True,
):
    setup = LoopSetup(
        target=RuleModel(can_crop),
        drafters=list(drafters),
        stop_token_ids=frozenset(stops),
        end_of_turn_id=end_of_turn,
        max_context=256,
        vocab_size=VOCAB,
        new_text=Letters,
        stop_strings=stop_strings,
        max_draft=max_draft,
        cap_note="drafts capped: test",
    )
    request = GenerationRequest(
        prompt_ids=tuple(PROMPT),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
        k_mode="adaptive" if adaptive else "fixed",
    )
    state, tally = start_reply(setup, request)
    return setup, state, tally


def verified(drafts: list[int], samples: list[int], accepted: int) -> Round:
    return Round(k=len(drafts), drafts=drafts, samples=samples, accepted=accepted)


# --- the reply's K ---------------------------------------------------------------------------------------------


def test_the_replys_k_is_capped_by_the_widest_pass_and_says_the_cap_shaped_it() -> None:
    setup, _, _ = make(drafters=[Told("a", [])], k=4, max_draft=3)
    assert reply_k(setup, GenerationRequest(tuple(PROMPT), SamplerSettings(), 10, 6)) == (3, True)
    assert reply_k(setup, GenerationRequest(tuple(PROMPT), SamplerSettings(), 10, 3)) == (3, False)


def test_a_cache_that_cannot_crop_decodes_plainly_and_says_so() -> None:
    setup, state, _ = make(drafters=[Told("a", [])], can_crop=False)
    assert state.k_requested == 0 and state.drafters == []
    assert setup.notes == [NO_CROP_NOTE]


def test_no_drafters_means_k_zero() -> None:
    _, state, _ = make(drafters=[], k=5)
    assert state.k_requested == 0


# --- open and plan ---------------------------------------------------------------------------------------------


def test_a_round_opens_within_the_token_budget_or_says_why_the_reply_stops() -> None:
    setup, state, _ = make(drafters=[Told("a", [])], k=6, max_new=3)
    assert open_round(setup, state, threading.Event()).k == 2  # 3 tokens left: 2 drafts and the target's own
    cancel = threading.Event()
    cancel.set()
    assert open_round(setup, state, cancel) is None and state.stop == "cancelled"


def test_the_round_sends_the_best_plan_and_ties_go_to_the_primary() -> None:
    primary, better = Told("primary", [4, 5], rate=2.0), Told("better", [4, 5, 6], rate=3.0)
    setup, state, _ = make(drafters=[primary, better])
    rnd = Round(k=4)
    plan_round(setup, state, rnd)
    assert rnd.plan.drafter is better
    assert primary.asked == better.asked == [(4, rnd.k_long)] and rnd.k_long > 4  # adaptive: long-match room

    tie = Told("tie", [4, 5], rate=2.0)
    setup, state, _ = make(drafters=[primary, tie], adaptive=False)
    rnd = Round(k=4)
    plan_round(setup, state, rnd)
    assert rnd.plan.drafter is primary and rnd.k_long == 0


def test_a_plain_round_asks_no_drafter() -> None:
    drafter = Told("a", [4])
    setup, state, _ = make(drafters=[drafter])
    rnd = Round(k=0)
    plan_round(setup, state, rnd)
    assert rnd.plan is None and drafter.asked == []


# --- price -----------------------------------------------------------------------------------------------------


def test_a_round_past_k_is_a_long_match_and_one_past_the_widest_pass_is_capped() -> None:
    drafter = Told("a", [], wanted_longer=True)
    setup, state, tally = make(drafters=[drafter], k=2, max_draft=6)
    plan = Plan(drafter, 2, 2.0, [4, 5, 6, 7, 8], wanted_longer=True)
    price_round(setup, state, tally, Round(k=2, k_long=6, plan=plan, drafts=[4, 5, 6, 7, 8]))
    assert (tally.long_rounds, tally.longest, tally.capped) == (1, 5, True)
    # Priced by the drafter that sent the plan: its verify pass (1.0) plus its five draft steps at 0.5.
    assert tally.round_costs == [1.0 + 5 * 0.5]
    price_round(setup, state, tally, Round(k=2, k_long=5, plan=plan, drafts=[4, 5]))
    assert (tally.long_rounds, tally.longest) == (1, 5)


# --- verify ----------------------------------------------------------------------------------------------------


def test_verify_accepts_the_drafts_the_target_would_sample_and_crops_the_rest() -> None:
    setup, state, tally = make(drafters=[Told("a", [])])
    widths: list[int] = []
    setup.on_round = lambda seconds, width: widths.append(width)
    setup.target.prefill(PROMPT[:-1])
    rnd = Round(k=4, drafts=[4, 5, 9, 7])  # the target would follow 3 with 4, 5, 6: the third draft is wrong
    verify_round(setup, state, tally, rnd)
    assert rnd.samples[:4] == [4, 5, 6, 10] and rnd.accepted == 2
    assert setup.target.crops == [len(state.seq) + 2]  # the last token and the two accepted drafts
    assert widths == [5] and tally.plain_pass_times == []  # a drafted pass is not a plain step

    plain = Round(k=0)
    verify_round(setup, state, tally, plain)
    assert plain.accepted == 0 and tally.plain_pass_times == [0.01]


# --- accept ----------------------------------------------------------------------------------------------------


def test_without_a_stop_the_round_takes_the_accepted_drafts_and_the_targets_token() -> None:
    setup, state, _ = make()
    rnd = verified([4, 5, 9], [4, 5, 6, 10], accepted=2)
    accept_round(setup, state, rnd)
    assert rnd.emitted == [4, 5, 6] and rnd.kept_drafts == 2 and state.stop is None
    assert rnd.delta == "DEF"


def test_a_stop_token_among_the_accepted_drafts_ends_the_round_before_it() -> None:
    setup, state, _ = make(stops={6, 30}, end_of_turn=6)
    rnd = verified([4, 5, 6, 7], [4, 5, 6, 7, 8], accepted=4)
    accept_round(setup, state, rnd)
    assert rnd.emitted == [4, 5] and rnd.kept_drafts == 2 and state.stop == "end_of_turn"

    setup, state, _ = make(stops={6, 30}, end_of_turn=6)
    rnd = verified([4], [4, 30], accepted=1)
    accept_round(setup, state, rnd)
    assert rnd.emitted == [4] and rnd.kept_drafts == 1 and state.stop == "eos"


def test_the_token_budget_ends_the_reply_inside_a_round() -> None:
    setup, state, _ = make(max_new=3)
    state.reply[:] = [9]
    rnd = verified([4], [4, 5], accepted=1)
    accept_round(setup, state, rnd)
    assert rnd.emitted == [4, 5] and state.stop == "max_new_tokens"
    assert rnd.delta == "DE"  # final: nothing held back


def test_the_repetition_guard_stops_at_the_token_that_completes_a_loop() -> None:
    setup, state, _ = make()
    for _ in range(MIN_REPEATED_TOKENS):
        state.guard.push(7)  # one token repeated: the next 7 completes the loop
    rnd = verified([7, 7], [7, 7, 7], accepted=2)
    accept_round(setup, state, rnd)
    assert rnd.emitted == [7] and rnd.kept_drafts == 1 and state.stop == "repetition"
    assert setup.notes == ["stopped: the reply kept repeating the same 1-token span"]


def test_a_stop_string_begun_in_an_earlier_round_takes_back_its_held_tokens() -> None:
    setup, state, _ = make(stop_strings=("EFG",))
    first = verified([4], [4, 5], accepted=1)  # "DE": the "E" may begin the stop string
    accept_round(setup, state, first)
    chunk = account_round(state, first)
    assert chunk.text == "D" and chunk.token_ids == (4,)  # 5 waits with its text
    second = verified([6], [6, 7], accepted=1)  # "FG" completes "EFG"
    accept_round(setup, state, second)
    assert state.stop == "stop_string"
    assert second.emitted == [] and second.kept_drafts == 0  # nothing of this round is kept
    assert state.reply == [4] and state.seq == [*PROMPT, 4]  # the held 5 is taken back too


# --- account ---------------------------------------------------------------------------------------------------


def test_only_the_drafter_whose_plan_went_out_learns_the_round_and_every_one_sees_the_reply_grow() -> None:
    sent, other = Told("sent", []), Told("other", [])
    setup, state, _ = make(drafters=[other, sent])
    rnd = Round(k=4, plan=Plan(sent, 4, 2.0, [4, 5, 9]), drafts=[4, 5, 9], samples=[4, 5, 6], accepted=2)
    accept_round(setup, state, rnd)
    chunk = account_round(state, rnd)
    assert sent.learned == [(3, 2)] and other.learned == [(0, 0)]
    assert sent.grown == other.grown == [4, 5, 6] and state.seq == [*PROMPT, 4, 5, 6]
    assert (chunk.drafted, chunk.accepted, chunk.drafter) == (3, 2, "sent")
    assert chunk.origins == (True, True, False)


def test_a_round_that_produced_nothing_has_no_chunk() -> None:
    setup, state, _ = make(stops={4})
    rnd = verified([], [4], accepted=0)
    accept_round(setup, state, rnd)
    assert account_round(state, rnd) is None and state.stop == "eos"


# --- finish ----------------------------------------------------------------------------------------------------


def test_the_done_says_the_long_match_rounds_and_the_cap_only_where_it_shaped_the_reply() -> None:
    setup, state, tally = make(drafters=[Told("a", [])], k=2)
    tally.long_rounds, tally.longest = 1, 9
    done = finish_reply(setup, state, tally)
    assert done.notes == ("long-match mode: 1 round copied from the context past K 2 (drafts up to 9)",)
    assert done.stop_reason == "eos" and done.verify_cost == (1.1, 1.2)

    setup, state, tally = make(drafters=[Told("a", [])], k=2)
    tally.long_rounds, tally.longest, tally.capped = 3, 9, True
    state.stop = "max_new_tokens"
    done = finish_reply(setup, state, tally)
    assert (
        done.notes[0].startswith("long-match mode: 3 rounds copied")
        and done.notes[1] == "drafts capped: test"
    )
    assert done.stop_reason == "max_new_tokens"
