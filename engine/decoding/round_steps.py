"""One reply's rounds as named steps: plan, draft, verify, accept, account (round_loop.py drives them).

As llama.cpp's server step (`common_speculative_draft`, one target batch over the last token and the drafts,
`common_sampler_sample_and_accept_n`, `common_speculative_accept`) and vLLM's v1/spec_decode (a proposer's
`propose`, the rejection sampler's accepted count, `SpecDecodingStats`): each step is one function over three small
objects, `ReplyState` (what the reply has produced, carried from round to round), `Round` (what one round's steps
fill in, in order) and `ReplyTally` (what the reply's Done reports of its rounds).
"""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.decoding.cost_model import round_cost, round_limit
from engine.decoding.drafters import best_plan
from engine.decoding.sampling import choose_tokens, count_accepted, reply_uniforms
from engine.decoding.stop_rules import REPETITION_NOTE, RepetitionGuard, StopStringWatch
from engine.events import Chunk, Done

if TYPE_CHECKING:
    import threading

    from engine.decoding.drafters import Drafter, Plan
    from engine.decoding.round_loop import LoopSetup, TextStream
    from engine.events import StopReason
    from engine.request import GenerationRequest, SamplerSettings

NO_CROP_NOTE = "drafting off: this model's cache cannot drop rejected drafts (each would cost a re-prefill)"


@dataclass
class ReplyState:
    """One reply as its rounds grow it: the rules decided at its start, its tokens, its text, why it stopped."""

    prompt: list[int]
    settings: SamplerSettings
    max_new: int
    k_requested: int  # the preset's K as this reply may use it (0: plain decoding)
    adaptive: bool  # K is adaptive: a long match may draft past it
    uniforms: list[float]  # one pre-drawn uniform per reply position (engine/decoding/sampling.py)
    drafters: list[Drafter]  # asked every round, the primary first; none where K is 0
    text: TextStream
    watch: StopStringWatch
    guard: RepetitionGuard = field(default_factory=RepetitionGuard)
    seq: list[int] = field(init=False)  # prompt + reply; seq[-1] is not in the target's cache yet
    reply: list[int] = field(default_factory=list)
    ends: list[int] = field(
        default_factory=list
    )  # text length after each reply token (for stop strings only)
    # With stop strings a token goes out with its text: tokens whose text is held back (it may begin a stop
    # string) wait here, so no chunk ever carries a token the reply then loses.
    reply_origins: list[bool] = field(default_factory=list)
    sent_tokens: int = 0
    stop: StopReason | None = None

    def __post_init__(self) -> None:
        self.seq = list(self.prompt)


@dataclass
class ReplyTally:
    """What the reply's Done says of its rounds, gathered as they run."""

    capped: bool  # the draft cap shaped this reply (its note is said)
    cached: int = 0  # prompt tokens the target's cache already held
    prefill_s: float = 0.0
    # A plain step as it runs in this reply: the target's one-token passes (the rounds that did not draft).
    plain_pass_times: list[float] = field(default_factory=list)
    round_costs: list[float] = field(
        default_factory=list
    )  # each round in plain steps, as its drafter prices it
    long_rounds: int = 0  # long-match rounds: drafts past the preset's K
    longest: int = 0  # the longest draft


@dataclass
class Round:
    """One round, as its steps fill it in."""

    k: int  # the most drafts the preset's K, the token budget and the context allow
    k_long: int = 0  # long-match mode's ceiling: what the round could take beyond K (adaptive only)
    plan: Plan | None = None  # the plan the round sends (None: a plain step)
    drafts: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)  # the target's own token at each verified position
    accepted: int = 0  # drafts equal to the target's samples, in a row from the first
    emitted: list[int] = field(
        default_factory=list
    )  # what the reply takes: accepted drafts, the target's token
    kept_drafts: int = 0  # accepted drafts the reply took (none past a stop)
    cut: int | None = None  # where a stop string begins in the reply's text
    delta: str = ""  # the text that goes out with this round


def reply_k(setup: LoopSetup, request: GenerationRequest) -> tuple[int, bool]:
    """The reply's K (0: decode plainly) and whether the draft cap shaped it."""
    k_requested = max(0, min(request.effective_k, setup.max_draft)) if setup.drafters else 0
    capped = request.effective_k > setup.max_draft
    if k_requested and not setup.target.can_crop:
        # Every rejected draft would re-prefill the whole context: decode plainly instead, and say so.
        k_requested = 0
        setup.notes.append(NO_CROP_NOTE)
    return k_requested, capped


def start_reply(setup: LoopSetup, request: GenerationRequest) -> tuple[ReplyState, ReplyTally]:
    """A reply's rules, decided once: K, the uniforms of its positions, the drafters it asks."""
    k_requested, capped = reply_k(setup, request)
    seed = request.seed if request.seed is not None else random.getrandbits(63)
    max_new = max(0, request.max_new_tokens)
    state = ReplyState(
        prompt=list(request.prompt_ids),
        settings=request.sampler,
        max_new=max_new,
        k_requested=k_requested,
        adaptive=request.k_mode == "adaptive",
        uniforms=reply_uniforms(seed, max_new),
        # Every round asks each drafter for its plan and sends the best (drafters/base.py): where the context
        # repeats itself, n-gram lookup beside a draft model costs no draft-model steps. All are verified alike.
        drafters=list(setup.drafters) if k_requested else [],
        text=setup.new_text(),
        watch=StopStringWatch(setup.stop_strings),
    )
    setup.target.step_times = []
    return state, ReplyTally(capped=capped)


def prefill(setup: LoopSetup, state: ReplyState, tally: ReplyTally, cancel: threading.Event) -> None:
    """Prefill everything but the last prompt token (it opens the first round, which can then draft too), and
    start the drafters."""
    start = time.perf_counter()
    tally.cached = setup.target.prefill(state.prompt[:-1], cancel)
    for drafter in state.drafters:
        drafter.begin(state.prompt, cancel)
    tally.prefill_s = time.perf_counter() - start


def open_round(setup: LoopSetup, state: ReplyState, cancel: threading.Event) -> Round | None:
    """The next round and the most drafts it may carry; None where the reply stops here (`state.stop` says why)."""
    state.stop, k = round_limit(
        cancelled=cancel.is_set(),
        produced=len(state.reply),
        max_new=state.max_new,
        context_used=len(state.seq),
        max_context=setup.max_context,
        k_requested=state.k_requested,
    )
    return Round(k) if state.stop is None else None


def plan_round(setup: LoopSetup, state: ReplyState, rnd: Round) -> None:
    """Ask every drafter what it would draft; the round sends the best plan (none where K is 0)."""
    if rnd.k > 0 and state.adaptive:
        rnd.k_long = long_room(setup, len(state.reply), state.max_new, len(state.seq))
    if rnd.k > 0 and state.drafters:
        rnd.plan = best_plan([drafter.plan(rnd.k, rnd.k_long) for drafter in state.drafters])


def draft_round(state: ReplyState, rnd: Round) -> None:
    """The tokens of the plan the round sends (a draft model steps only here)."""
    rnd.drafts = rnd.plan.drafter.draft(rnd.plan, state.seq) if rnd.plan is not None else []


def price_round(setup: LoopSetup, state: ReplyState, tally: ReplyTally, rnd: Round) -> None:
    """Count the round's drafts: a long match, the cap, what the round costs in plain steps. Before the verify
    pass, whose timing moves the target's cost model."""
    if rnd.plan is not None and rnd.plan.wanted_longer and rnd.k_long >= setup.max_draft:
        tally.capped = True  # a long match would have drafted past the widest proven pass
    if len(rnd.drafts) > state.k_requested:
        tally.long_rounds += 1
        tally.longest = max(tally.longest, len(rnd.drafts))
    target = setup.target
    if target.costs is not None:
        # What this round cost in plain steps, as its drafter counts it (lookups take no draft steps).
        costs = rnd.plan.drafter.costs if rnd.plan else target.costs
        tally.round_costs.append(round_cost(costs, len(rnd.drafts)))


def verify_round(setup: LoopSetup, state: ReplyState, tally: ReplyTally, rnd: Round) -> None:
    """One target pass over the last token and the drafts: its own sample at every position, the drafts it
    accepts, and its cache cropped to them (the cache saw the last token and every draft)."""
    target = setup.target
    t0 = time.perf_counter()
    logits = target.score([state.seq[-1], *rnd.drafts])
    if not rnd.drafts and target.step_times:
        tally.plain_pass_times.append(target.step_times[-1])
    rnd.samples = choose_tokens(
        logits, state.settings, len(state.reply), state.seq, rnd.drafts, state.uniforms
    )
    rnd.accepted = count_accepted(rnd.drafts, rnd.samples)
    target.crop(len(state.seq) + rnd.accepted)
    if setup.on_round is not None:
        setup.on_round(time.perf_counter() - t0, 1 + len(rnd.drafts))


def accept_round(setup: LoopSetup, state: ReplyState, rnd: Round) -> None:
    """What the reply takes of the accepted drafts and the target's own token: up to the first stop (a stop
    token, a stop string, a loop, the token budget), and the text that can go out with them."""
    rnd.emitted = []
    for token in [*rnd.drafts[: rnd.accepted], rnd.samples[rnd.accepted]]:
        if token in setup.stop_token_ids:
            state.stop = "end_of_turn" if token == setup.end_of_turn_id else "eos"
            break
        rnd.emitted.append(token)
        if state.watch.stops and _stop_string_ends(state, rnd, token):
            break
        period = state.guard.push(token)
        if period is not None:
            state.stop = "repetition"
            setup.notes.append(REPETITION_NOTE.format(period=period))
            break
    if len(state.reply) + len(rnd.emitted) >= state.max_new and state.stop is None:
        state.stop = "max_new_tokens"
    _release_text(state, rnd)
    # One figure for what users see and what the drafters learn: drafts past a stop (a stop token or string
    # among the accepted ones) are not counted as accepted by either.
    rnd.kept_drafts = min(rnd.accepted, len(rnd.emitted))


def _stop_string_ends(state: ReplyState, rnd: Round, token: int) -> bool:
    """Add `token`'s text; where a stop string is now complete, stop and keep only the tokens whose text lies
    wholly before it. The string may have begun in an earlier round (its text held back), so earlier tokens
    can go too."""
    watch = state.watch
    rnd.cut = watch.add(state.text.push([token]))
    state.ends.append(len(watch.text))
    if rnd.cut is None:
        return False
    state.stop = "stop_string"
    reply = state.reply
    keep = max(bisect.bisect_right(state.ends, rnd.cut), state.sent_tokens)
    if keep < len(reply):
        del reply[keep:], state.reply_origins[keep:], state.seq[len(state.prompt) + keep :], rnd.emitted[:]
    else:
        del rnd.emitted[keep - len(reply) :]
    return True


def _release_text(state: ReplyState, rnd: Round) -> None:
    """The round's text: all of it once the reply stops, else all but a tail that may begin a stop string."""
    watch, final = state.watch, state.stop is not None
    if not watch.stops:
        watch.add(state.text.push(rnd.emitted, final=final))
    elif final and state.stop != "stop_string":
        watch.add(state.text.push([], final=True))  # bytes held back for a half character
    rnd.delta = watch.release(final=final, end=rnd.cut)


def account_round(state: ReplyState, rnd: Round) -> Chunk | None:
    """The drafters learn the round and the reply grows by it; the round's Chunk, or None where it produced
    nothing (its own tokens, before any wait for their text)."""
    for drafter in state.drafters:
        # The drafters whose plan did not go out learn nothing from this round.
        sent = rnd.plan is not None and drafter is rnd.plan.drafter
        drafter.accept(len(rnd.drafts) if sent else 0, rnd.kept_drafts if sent else 0)
    state.reply.extend(rnd.emitted)
    state.seq.extend(rnd.emitted)
    for drafter in state.drafters:
        drafter.extend(rnd.emitted)
    if not rnd.emitted and not rnd.drafts and not rnd.delta:
        return None
    return round_chunk(state, rnd)


def round_chunk(state: ReplyState, rnd: Round) -> Chunk:
    """The round as the UI sees it: with stop strings, the tokens whose text is out (all of them once the reply
    ends), each marked drafted or the target's own."""
    emitted = rnd.emitted
    origins = [True] * rnd.kept_drafts + [False] * (len(emitted) - rnd.kept_drafts)
    if state.watch.stops:
        state.reply_origins.extend(origins)
        ready = (
            len(state.reply) if state.stop is not None else bisect.bisect_right(state.ends, state.watch.sent)
        )
        emitted, origins = (
            state.reply[state.sent_tokens : ready],
            state.reply_origins[state.sent_tokens : ready],
        )
        state.sent_tokens = max(state.sent_tokens, ready)
    return Chunk(
        text=rnd.delta,
        token_ids=tuple(emitted),
        drafted=len(rnd.drafts),
        accepted=rnd.kept_drafts,
        origins=tuple(origins),
        t=time.perf_counter(),
        temperature=state.settings.temperature_at(max(0, len(state.reply) - 1)),
        k=len(rnd.drafts),
        drafter=rnd.plan.drafter.name if rnd.drafts and rnd.plan is not None else None,
    )


def finish_reply(setup: LoopSetup, state: ReplyState, tally: ReplyTally) -> Done:
    """The reply's notes and its Done: why it stopped, its timings and what its rounds cost."""
    if tally.long_rounds:
        setup.notes.append(
            f"long-match mode: {tally.long_rounds} round{'s' if tally.long_rounds != 1 else ''} copied from the "
            f"context past K {state.k_requested} (drafts up to {tally.longest})"
        )
    if tally.capped and setup.cap_note:
        setup.notes.append(setup.cap_note)
    target = setup.target
    # A plain step: this reply's one-token passes, else (every round drafted) the one measured at load.
    one_token_s = target.costs.one_token_s if target.costs is not None else None
    return Done(
        stop_reason=state.stop or "eos",
        prompt_tokens=len(state.prompt),
        cached_tokens=tally.cached,
        prefill_s=tally.prefill_s,
        # The primary drafter's steps (a draft model's one-token steps, or the lookups of n-gram alone).
        draft_step_s=_mean(state.drafters[0].step_times) if state.drafters else 0.0,
        target_step_s=_mean(tally.plain_pass_times) or one_token_s or _mean(target.step_times),
        verify_cost=tuple(target.costs.ratio(w) for w in range(2, state.k_requested + 2))
        if target.costs is not None
        else (),
        round_cost=_mean(tally.round_costs) if tally.round_costs else None,
        notes=tuple(setup.notes),
    )


def long_room(setup: LoopSetup, produced: int, max_new: int, context_used: int) -> int:
    """The most drafts a round could take past the preset's K: token budget, context, the widest exact pass."""
    return round_limit(
        cancelled=False,
        produced=produced,
        max_new=max_new,
        context_used=context_used,
        max_context=setup.max_context,
        k_requested=setup.max_draft,
    )[1]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
