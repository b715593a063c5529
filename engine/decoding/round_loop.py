"""The speculative round loop, once, for every backend whose loop is ours (transformers, llama.cpp).

A backend supplies a `CachedModel` for its target (and for a draft model, if any): prefill, a scoring pass over
the cache, a crop. This module does the rest, the same way for both: the round limit, drafting (n-gram lookup or
the draft model's greedy steps), one verify pass over the last token plus the drafts, the shared sampler, the
accepted prefix, stop tokens, stop strings, the repetition guard, text deltas, cost bookkeeping and the chunk of
each round.

Cache semantics, defined here and nowhere else:
- Between rounds the target's cache holds `seq[:-1]` (prompt + reply so far, less the last token, which opens the
  next round). A verify pass appends the last token and the drafts; the crop after it keeps the last token and
  the accepted drafts.
- At the end of a reply, whatever stopped it, the caches hold at most prompt + reply: never a stop token, a
  token past a stop string, nor a rejected draft. Plain and speculative decoding therefore leave the same cache
  behind, and the next turn prefills the same rows through the same kernels.
- `crop(n)` is exact: afterwards the cache holds exactly `ids[:n]`. A cache that cannot drop a tail rebuilds
  the prefix (`CachedModel.crop` re-prefills) or raises BackendError; it never loses context silently.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel, round_cost, round_limit
from engine.decoding.drafters import DraftContext, Drafter, best_plan, build_drafters, common_prefix
from engine.decoding.history_corpus import CorpusView, HistoryIndexes
from engine.decoding.sampling import choose_tokens, count_accepted, reply_uniforms
from engine.decoding.stop_rules import REPETITION_NOTE, RepetitionGuard, StopStringWatch
from engine.errors import BackendError, first_line
from engine.events import Chunk, Done, StopReason
from engine.request import GenerationRequest

NO_CROP_NOTE = "drafting off: this model's cache cannot drop rejected drafts (each would cost a re-prefill)"


class CachedModel(Protocol):
    """A model with its KV cache, as the round loop drives it (a backend's target or draft model)."""

    ids: list[int]  # the tokens whose keys/values the cache holds, in order
    step_times: list[float]
    costs: VerifyCostModel | None
    can_crop: bool  # False: dropping a tail costs a re-prefill (a recurrent or otherwise uncroppable cache)

    def prefill(self, ids: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Bring the cache to a prefix of `ids` (all of it unless `cancel` is set), reusing the longest common
        prefix with what it holds; return the reused length."""

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """Run `tokens` on top of the cache (which then holds ids + tokens); their logits, one row each, as a
        float tensor [len(tokens), vocab]. Timed: the pass's width feeds `costs`."""

    def next_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Run `tokens` on top of the cache; the logits of the last one (a draft model's step)."""

    def crop(self, length: int) -> None:
        """Keep exactly the first `length` cached positions (re-prefill if the cache cannot drop a tail)."""


class TextStream(Protocol):
    """Text deltas of a growing token list (the backend's detokenizer)."""

    def push(self, token_ids: Sequence[int], final: bool = False) -> str: ...


@dataclass
class LoopSetup:
    """What a backend hands the loop for one reply: its models, tokens and limits."""

    target: CachedModel
    # The drafters asked every round, the primary first (engine/decoding/drafters/); none: plain decoding.
    drafters: list[Drafter]
    stop_token_ids: frozenset[int]
    end_of_turn_id: int | None
    max_context: int
    vocab_size: int  # drafts are never proposed past the target's vocabulary
    new_text: Callable[[], TextStream]
    # Text that ends a reply where no single token does (a plain fallback template's "\nUser:").
    stop_strings: tuple[str, ...] = ()
    # The most drafts one verify pass may carry (a backend's batch size, or the widest pass proven exact).
    max_draft: int = 16
    # Why `max_draft` is what it is, where it caps drafts below what the loop could send (the kernel probe's
    # "drafts capped at N: ..."); said on a reply that the cap shaped.
    cap_note: str | None = None
    # Notes for this reply's stats (e.g. a backend that switched threads mid-reply appends here).
    notes: list[str] = field(default_factory=list)
    # Called after every round with the round's verify time and width (a backend watching for stalls).
    on_round: Callable[[float, int], None] | None = None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def run_reply(
    setup: LoopSetup, request: GenerationRequest, cancel: threading.Event
) -> Iterator[Chunk | Done]:
    """Generate one reply: Chunks (one per round), then exactly one Done.

    An unexpected error inside a model (an architecture the backend handles badly) is one line for the user, a
    BackendError: the reply fails, the text so far is kept by the session, and the app goes on.
    """
    try:
        yield from _run_reply(setup, request, cancel)
    except (BackendError, MemoryError):
        raise
    except Exception as exc:
        line = first_line(exc, default="")
        detail = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
        raise BackendError(f"generation failed inside the model ({detail[:200]})") from exc


def _run_reply(
    setup: LoopSetup, request: GenerationRequest, cancel: threading.Event
) -> Iterator[Chunk | Done]:
    prompt = list(request.prompt_ids)
    if not prompt:
        raise BackendError("nothing to generate from: the prompt is empty")
    if len(prompt) >= setup.max_context:
        yield Done("context", prompt_tokens=len(prompt))
        return
    target = setup.target
    settings = request.sampler
    max_new = max(0, request.max_new_tokens)
    k_requested = max(0, min(request.effective_k, setup.max_draft)) if setup.drafters else 0
    capped = request.effective_k > setup.max_draft  # the cap shaped this reply (said in its notes)
    if k_requested and not target.can_crop:
        # Every rejected draft would re-prefill the whole context: decode plainly instead, and say so.
        k_requested = 0
        setup.notes.append(NO_CROP_NOTE)
    seed = request.seed if request.seed is not None else random.getrandbits(63)
    uniforms = reply_uniforms(seed, max_new)
    adaptive = request.k_mode == "adaptive"
    # Every round asks each drafter for its plan and sends the best (drafters/base.py): where the context repeats
    # itself, n-gram lookup beside a draft model costs no draft-model steps. All are verified alike: same output.
    drafters = list(setup.drafters) if k_requested else []
    target.step_times = []
    # A plain step as it runs in this reply: the target's one-token passes (the rounds that did not draft).
    plain_pass_times: list[float] = []

    # Prefill everything but the last prompt token: it opens the first round, which can then draft too.
    start = time.perf_counter()
    cached = target.prefill(prompt[:-1], cancel)
    for drafter in drafters:
        drafter.begin(prompt, cancel)
    prefill_s = time.perf_counter() - start

    seq = list(prompt)  # prompt + reply; seq[-1] is not in the target's cache yet
    reply: list[int] = []
    ends: list[int] = []  # text length after each reply token (tracked for stop strings only)
    # With stop strings a token goes out with its text: tokens whose text is held back (it may begin a stop
    # string) wait here, so no chunk ever carries a token the reply then loses.
    reply_origins: list[bool] = []
    sent_tokens = 0
    round_costs: list[float] = []
    text = setup.new_text()
    watch = StopStringWatch(setup.stop_strings)
    guard = RepetitionGuard()
    stop: StopReason | None = None
    long_rounds = longest = 0  # long-match rounds (drafts past the preset's K) and the longest draft
    try:
        while stop is None:
            stop, k = round_limit(
                cancelled=cancel.is_set(),
                produced=len(reply),
                max_new=max_new,
                context_used=len(seq),
                max_context=setup.max_context,
                k_requested=k_requested,
            )
            if stop is not None:
                break
            # Long-match mode's ceiling: what the round could take beyond the preset's K (adaptive only).
            k_long = _long_room(setup, len(reply), max_new, len(seq)) if k > 0 and adaptive else 0
            plan = (
                best_plan([drafter.plan(k, k_long) for drafter in drafters]) if k > 0 and drafters else None
            )
            drafts = plan.drafter.draft(plan, seq) if plan is not None else []
            if plan is not None and plan.wanted_longer and k_long >= setup.max_draft:
                capped = True  # a long match would have drafted past the widest proven pass
            if len(drafts) > k_requested:
                long_rounds += 1
                longest = max(longest, len(drafts))
            if target.costs is not None:
                # What this round cost in plain steps, as its drafter counts it (lookups take no draft steps).
                round_costs.append(round_cost(plan.drafter.costs if plan else target.costs, len(drafts)))

            t0 = time.perf_counter()
            logits = target.score([seq[-1], *drafts])
            if not drafts and target.step_times:
                plain_pass_times.append(target.step_times[-1])
            samples = choose_tokens(logits, settings, len(reply), seq, drafts, uniforms)
            accepted = count_accepted(drafts, samples)
            # The cache saw the last token and every draft; keep it up to the accepted ones.
            target.crop(len(seq) + accepted)
            if setup.on_round is not None:
                setup.on_round(time.perf_counter() - t0, 1 + len(drafts))

            emitted: list[int] = []
            cut: int | None = None
            for token in [*drafts[:accepted], samples[accepted]]:
                if token in setup.stop_token_ids:
                    stop = "end_of_turn" if token == setup.end_of_turn_id else "eos"
                    break
                emitted.append(token)
                if watch.stops:
                    cut = watch.add(text.push([token]))
                    ends.append(len(watch.text))
                    if cut is not None:
                        stop = "stop_string"
                        # Keep the tokens whose text lies wholly before the stop string; the string may have
                        # begun in an earlier round (its text held back), so earlier tokens can go too.
                        keep = max(bisect.bisect_right(ends, cut), sent_tokens)
                        if keep < len(reply):
                            del reply[keep:], reply_origins[keep:], seq[len(prompt) + keep :], emitted[:]
                        else:
                            del emitted[keep - len(reply) :]
                        break
                period = guard.push(token)
                if period is not None:
                    stop = "repetition"
                    setup.notes.append(REPETITION_NOTE.format(period=period))
                    break
            if len(reply) + len(emitted) >= max_new and stop is None:
                stop = "max_new_tokens"
            if not watch.stops:
                watch.add(text.push(emitted, final=stop is not None))
            elif stop is not None and stop != "stop_string":
                watch.add(text.push([], final=True))  # bytes held back for a half character
            delta = watch.release(final=stop is not None, end=cut)
            kept_drafts = min(accepted, len(emitted))
            # One figure for what users see and what the drafters learn: drafts past a stop (a stop token or
            # string among the accepted ones) are not counted as accepted by either. The drafters whose plan
            # did not go out learn nothing from this round.
            for drafter in drafters:
                sent = plan is not None and drafter is plan.drafter
                drafter.accept(len(drafts) if sent else 0, kept_drafts if sent else 0)
            origins = [True] * kept_drafts + [False] * (len(emitted) - kept_drafts)
            reply.extend(emitted)
            seq.extend(emitted)
            for drafter in drafters:
                drafter.extend(emitted)
            if not emitted and not drafts and not delta:
                break  # the round produced nothing (its own tokens, before any wait for their text)
            if watch.stops:  # the tokens whose text is out: all of them once the reply ends
                reply_origins.extend(origins)
                ready = len(reply) if stop is not None else bisect.bisect_right(ends, watch.sent)
                emitted, origins = reply[sent_tokens:ready], reply_origins[sent_tokens:ready]
                sent_tokens = max(sent_tokens, ready)
            yield Chunk(
                text=delta,
                token_ids=tuple(emitted),
                drafted=len(drafts),
                accepted=kept_drafts,
                origins=tuple(origins),
                t=time.perf_counter(),
                temperature=settings.temperature_at(max(0, len(reply) - 1)),
                k=len(drafts),
                drafter=plan.drafter.name if drafts and plan is not None else None,
            )
    finally:
        # Whatever stopped the reply: no stop token, nothing past a stop string, no rejected draft stays cached.
        kept = prompt + reply
        target.crop(common_prefix(target.ids, kept))
        for drafter in drafters:
            drafter.end(kept)

    if long_rounds:
        setup.notes.append(
            f"long-match mode: {long_rounds} round{'s' if long_rounds != 1 else ''} copied from the context "
            f"past K {k_requested} (drafts up to {longest})"
        )
    if capped and setup.cap_note:
        setup.notes.append(setup.cap_note)
    # A plain step: this reply's one-token passes, else (every round drafted) the one measured at load.
    one_token_s = target.costs.one_token_s if target.costs is not None else None
    yield Done(
        stop_reason=stop or "eos",
        prompt_tokens=len(prompt),
        cached_tokens=cached,
        prefill_s=prefill_s,
        # The primary drafter's steps (a draft model's one-token steps, or the lookups of n-gram alone).
        draft_step_s=_mean(drafters[0].step_times) if drafters else 0.0,
        target_step_s=_mean(plain_pass_times) or one_token_s or _mean(target.step_times),
        verify_cost=tuple(target.costs.ratio(w) for w in range(2, k_requested + 2))
        if target.costs is not None
        else (),
        round_cost=_mean(round_costs) if round_costs else None,
        notes=tuple(setup.notes),
    )


def _long_room(setup: LoopSetup, produced: int, max_new: int, context_used: int) -> int:
    """The most drafts a round could take past the preset's K: token budget, context, the widest exact pass."""
    return round_limit(
        cancelled=False,
        produced=produced,
        max_new=max_new,
        context_used=context_used,
        max_context=setup.max_context,
        k_requested=setup.max_draft,
    )[1]


class RoundLoopBackend:
    """What the transformers and llama.cpp backends share around the loop: one reply at a time, the adaptive-K
    state per tuning key, and a reply's LoopSetup. A backend supplies `_loop_options()` (vocabulary size, text
    stream, draft cap) and may adjust the setup in `_prepare_setup()`."""

    target: CachedModel | None
    draft_state: CachedModel | None
    draft_mode: str
    stop_token_ids: frozenset[int]
    end_of_turn_id: int | None
    max_context: int
    template: ChatTemplate | None
    tuners: dict[str, AdaptiveK]
    _lock: threading.Lock
    history_indexes: HistoryIndexes | None = None  # the history corpus for this tokenizer, made at first use

    def _require_loaded(self) -> None:
        raise NotImplementedError

    def _loop_options(self) -> dict:
        raise NotImplementedError

    def encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Render `messages` with the model's chat template (generation prompt added) and tokenize."""
        self._require_loaded()
        try:
            text = self.template.render(messages)
        except ChatTemplateError as exc:
            raise BackendError(str(exc)) from exc
        return self.encode_text(text)

    def _prepare_setup(self, setup: LoopSetup) -> None:
        """A backend's last word on a reply's setup (llama.cpp watches for stalls here)."""

    def _drafter_name(self) -> str:
        """The name map's drafter this backend's replies draft with (the draft mode's own by default; llama.cpp's
        MTP head reports the draft mode "model", as exllamav3's does, and drafts as "mtp")."""
        return self.draft_mode

    def history_view(self, request: GenerationRequest) -> CorpusView | None:
        """The request's history corpus as indexed for this backend's tokenizer so far (built in the background:
        engine/decoding/history_corpus.py); None where none was handed in or nothing drafts."""
        if request.history is None or not request.effective_k or request.k_mode != "adaptive":
            return None  # companions are asked only where adaptive K plans the rounds
        if self.history_indexes is None:
            self.history_indexes = HistoryIndexes(self.encode_text)
        return self.history_indexes.view(request.history)

    def tuner(self, key: str, prior: Sequence[float] = ()) -> AdaptiveK:
        """The adaptive-K state of one tuning key (a preset), started from `prior` the first time."""
        if key not in self.tuners:
            self.tuners[key] = AdaptiveK(prior)
        return self.tuners[key]

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        self._require_loaded()
        if not self._lock.acquire(blocking=False):
            raise BackendError("a reply is already being generated")
        try:
            template = self.template
            options = self._loop_options()
            context = DraftContext(
                target=self.target,
                draft=self.draft_state,
                tuner=self.tuner(request.tuning_key, request.acceptance_prior),
                adaptive=request.k_mode == "adaptive",
                vocab_size=options["vocab_size"],
                history=self.history_view(request),
            )
            setup = LoopSetup(
                target=self.target,
                drafters=build_drafters(self._drafter_name(), context),
                stop_token_ids=self.stop_token_ids,
                end_of_turn_id=self.end_of_turn_id,
                max_context=self.max_context,
                stop_strings=template.text_stops() if template is not None else (),
                **options,
            )
            self._prepare_setup(setup)
            yield from run_reply(setup, request, cancel)
        finally:
            self._lock.release()
