"""The speculative round loop, once, for every backend whose loop is ours (transformers, llama.cpp).

A backend supplies a `CachedModel` for its target (and for a draft model, if any): prefill, a scoring pass over
the cache, a crop. The loop does the rest, the same way for both: the round limit, drafting (n-gram lookup or
the draft model's greedy steps), one verify pass over the last token plus the drafts, the shared sampler, the
accepted prefix, stop tokens, stop strings, the repetition guard, text deltas, cost bookkeeping and the chunk of
each round. This module drives it (`_run_reply`: plan → draft → verify → accept → account, each round); the steps
are engine/decoding/round_steps.py, the stop strings and the repetition guard engine/decoding/stop_rules.py.

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

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters import DraftContext, Drafter, build_drafters, common_prefix
from engine.decoding.history_corpus import CorpusView, HistoryIndexes
from engine.decoding.round_steps import (
    accept_round,
    account_round,
    draft_round,
    finish_reply,
    open_round,
    plan_round,
    prefill,
    price_round,
    start_reply,
    verify_round,
)
from engine.errors import BackendError, first_line
from engine.events import Chunk, Done
from engine.request import GenerationRequest


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
    """The round loop: the reply's rules once, then rounds of plan → draft → verify → accept → account
    (engine/decoding/round_steps.py) until one of them stops the reply."""
    prompt = list(request.prompt_ids)
    if not prompt:
        raise BackendError("nothing to generate from: the prompt is empty")
    if len(prompt) >= setup.max_context:
        yield Done("context", prompt_tokens=len(prompt))
        return
    state, tally = start_reply(setup, request)
    prefill(setup, state, tally, cancel)
    try:
        while state.stop is None:
            rnd = open_round(setup, state, cancel)
            if rnd is None:
                break
            plan_round(setup, state, rnd)
            draft_round(state, rnd)
            price_round(setup, state, tally, rnd)
            verify_round(setup, state, tally, rnd)
            accept_round(setup, state, rnd)
            chunk = account_round(state, rnd)
            if chunk is None:
                break
            yield chunk
    finally:
        # Whatever stopped the reply: no stop token, nothing past a stop string, no rejected draft stays cached.
        kept = state.prompt + state.reply
        setup.target.crop(common_prefix(setup.target.ids, kept))
        for drafter in state.drafters:
            drafter.end(kept)
    yield finish_reply(setup, state, tally)


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
