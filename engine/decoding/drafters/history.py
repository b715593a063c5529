"""The history drafter: drafts copied from what the chat already wrote outside the current context.

A regenerated reply, an edited question's old branch, the same task asked again in a new chat: the text repeats,
but not in the context, where the n-gram drafter looks. The session hands the engine a corpus (other variants and
branches of this chat, then past chats: `engine.request.HistoryCorpus`); `engine/decoding/history_corpus.py`
tokenizes it for the loaded model and builds one `TokenIndex` per part in a background thread. This drafter, asked
beside the primary drafter each round (the name map's `beside`), looks up the longest suffix of the context, up to
`SORT_DEPTH` tokens, in the parts built so far, and drafts what followed it there, as vLLM's suffix method does:
from the occurrences of the match, the most frequent next token, its probability the share of occurrences it
follows (`MIN_TOKEN_PROB` ends the walk, `HISTORY_DRAFT_MAX` tokens at most). Adaptive K prices the draft with
those probabilities, calibrated per match length by what the target accepted (`ProbabilityCalibration`), so a
draft goes out only where it beats a plain step and the primary's plan.

The index: a suffix array over the corpus (documents split by `SEPARATOR`), sorted to `SORT_DEPTH` tokens by
prefix doubling in numpy; a lookup is a binary search over it, and a round's match starts from the last one (the
longest match can only grow by the tokens the round emitted), so a reply that does not follow the corpus pays one
search per round. Built alone (the contract test, `build_drafters("history")`), it also looks up the reply's own
context, as the n-gram drafter does, and sends the better plan.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engine.decoding.adaptive_k import ProbabilityCalibration, best_length, match_bucket
from engine.decoding.cost_model import FreeDraftCosts, VerifyCostModel
from engine.decoding.drafters.base import DraftContext, Plan
from engine.decoding.drafters.ngram import NgramDrafter

SEPARATOR = -1  # between documents: no match runs across it, no draft past it
SORT_DEPTH = 32  # suffixes are sorted by their first 32 tokens: a match is measured up to this length
MIN_MATCH = 4  # a shorter match into a large corpus says little: not looked up
HISTORY_DRAFT_MAX = 24  # vLLM's suffix_decoding_max_tree_depth
LONG_MATCH = 12  # from this match length on, a draft may run past the preset's K (up to HISTORY_DRAFT_MAX)
MIN_TOKEN_PROB = 0.1  # the walk stops where the drafted path's probability falls below this (vLLM's default)
SAMPLE = 64  # occurrences a walk counts at most, spread evenly over the (sorted) matched range


def suffix_order(tokens: np.ndarray, depth: int = SORT_DEPTH) -> np.ndarray:
    """The corpus's suffixes in order of their first `depth` tokens (ties in any order), by prefix doubling: each
    step sorts pairs of ranks of the previous length. A suffix shorter than `depth` sorts before its extensions;
    SEPARATOR before every token."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 1  # SEPARATOR -> 0
    order = np.argsort(rank, kind="stable")
    h = 1
    while h < depth and n > 1:
        following = np.zeros(n, np.int64)  # past the end: 0, below every rank + 1
        following[: n - h] = rank[h:] + 1
        key = rank * (int(rank.max()) + 2) + following
        del following
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        del key
        fresh = np.empty(n, np.int64)
        fresh[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        del ordered
        rank = fresh
        h *= 2
        if int(rank.max()) == n - 1:  # every prefix of this length is unique: the order is final
            break
    return order.astype(np.int32)


def _int_array(values: np.ndarray) -> array:
    out = array("i")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int32).tobytes())
    return out


class TokenIndex:
    """A suffix array over a token corpus: where the longest suffix of a context occurs, and what followed it."""

    def __init__(self, tokens: np.ndarray, documents: int = 0) -> None:
        self.documents = documents
        order = suffix_order(tokens)
        # Plain arrays: a binary search compares slices of them, far faster in python than numpy scalars.
        self.tokens = _int_array(tokens)
        self.order = _int_array(order)

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]]) -> TokenIndex:
        pieces: list[np.ndarray] = []
        for doc in documents:
            if len(doc):
                pieces.append(np.asarray(doc, dtype=np.int32))
                pieces.append(np.array([SEPARATOR], dtype=np.int32))
        tokens = np.concatenate(pieces) if pieces else np.empty(0, np.int32)
        return cls(tokens, documents=len(pieces) // 2)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return len(self.tokens) * self.tokens.itemsize + len(self.order) * self.order.itemsize

    def _lower(self, pattern: array, lo: int, hi: int) -> int:
        """The first place in order[lo:hi] whose suffix is not below `pattern` (on its first len(pattern))."""
        tokens, order, size = self.tokens, self.order, len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            start = order[mid]
            if tokens[start : start + size] < pattern:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _upper(self, pattern: array, lo: int, hi: int) -> int:
        tokens, order, size = self.tokens, self.order, len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            start = order[mid]
            if tokens[start : start + size] <= pattern:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find(self, pattern: Sequence[int]) -> int:
        """Where `pattern` first occurs in suffix order, or -1 (`pattern` at most SORT_DEPTH tokens)."""
        key = array("i", pattern)
        at = self._lower(key, 0, len(self.order))
        if at < len(self.order):
            start = self.order[at]
            if self.tokens[start : start + len(key)] == key:
                return at
        return -1

    def span(self, pattern: Sequence[int], first: int) -> tuple[int, int]:
        """The range of suffix order whose suffixes start with `pattern` (`first`: what `find` said)."""
        return first, self._upper(array("i", pattern), first, len(self.order))

    def walk(
        self, length: int, lo: int, hi: int, limit: int, vocab_size: int
    ) -> tuple[list[int], list[float]]:
        """Up to `limit` tokens following a match of `length` tokens (order[lo:hi]), each the most frequent next
        token among the occurrences that followed the draft so far, with its share of them."""
        tokens, order, n = self.tokens, self.order, len(self.tokens)
        width = hi - lo
        if width <= SAMPLE:
            at = [order[i] + length for i in range(lo, hi)]
        else:
            at = [order[lo + (i * width) // SAMPLE] + length for i in range(SAMPLE)]
        drafts: list[int] = []
        chances: list[float] = []
        path = 1.0
        while len(drafts) < limit and at:
            counts: dict[int, int] = {}
            for q in at:
                if q < n:
                    token = tokens[q]
                    if token != SEPARATOR:
                        counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token = max(counts, key=counts.__getitem__)
            chance = counts[token] / len(at)
            if path * chance < MIN_TOKEN_PROB or not 0 <= token < vocab_size:
                break
            path *= chance
            drafts.append(token)
            chances.append(chance)
            at = [q + 1 for q in at if q < n and tokens[q] == token]
        return drafts, chances


class CorpusView(Protocol):
    """The corpus of one reply as the drafter sees it (engine/decoding/history_corpus.py): parts appear once
    built, so a reply that starts before its index is ready drafts without it, then with it."""

    def parts(self) -> tuple[TokenIndex, ...]:
        """The parts built so far that hold tokens, in priority order."""

    def may_offer(self) -> bool:
        """Some part holds tokens, or is still being built."""


class _PartMatch:
    """One part's longest match of the context's tail, kept from round to round."""

    def __init__(self, index: TokenIndex) -> None:
        self.index = index
        self.bound = SORT_DEPTH  # the longest match is at most this long (unknown at first)

    def grow(self, emitted: int) -> None:
        self.bound = min(self.bound + emitted, SORT_DEPTH)

    def match(self, tail: Sequence[int]) -> tuple[int, int, int]:
        """(length, lo, hi) of the longest suffix of `tail` found here (length 0: none of MIN_MATCH tokens)."""
        top = min(self.bound, len(tail))
        index = self.index
        found = index.find(tail[-top:]) if top >= MIN_MATCH else -1
        if found >= 0:
            length = top  # the longest: it holds while the reply follows the corpus
        else:
            length, low, high = MIN_MATCH - 1, MIN_MATCH, top - 1
            while low <= high:  # found for length L means found for every shorter one: a binary search
                mid = (low + high) // 2
                at = index.find(tail[-mid:])
                if at >= 0:
                    length, found, low = mid, at, mid + 1
                else:
                    high = mid - 1
        self.bound = length
        if length < MIN_MATCH:
            return 0, 0, 0
        return (length, *index.span(tail[-length:], found))


class HistoryDrafter:
    """Drafts from the corpus's longest match of the context's tail, priced by adaptive K (drafters/base.py)."""

    name = "history"

    def __init__(
        self,
        costs: object,
        calibration: ProbabilityCalibration,
        view: CorpusView | None,
        vocab_size: int,
        *,
        fixed: bool = False,
        local: NgramDrafter | None = None,
    ) -> None:
        """`fixed`: draft up to K wherever a match is found (K not adaptive). `local`: the reply's own context,
        looked up too (built alone, with no n-gram drafter beside it)."""
        self.costs = costs
        self.calibration = calibration
        self.view = view
        self.vocab_size = vocab_size
        self.fixed = fixed
        self.local = local
        self.step_times: list[float] = []
        self.tail: list[int] = []
        self._parts: list[_PartMatch] = []
        self._pending: tuple[int, list[float]] | None = None  # the last plan's bucket and probabilities
        self._local_sent = False
        self.last_match_length = 0

    # --- the Drafter interface (drafters/base.py) ---

    def begin(self, prompt: Sequence[int], cancel: threading.Event) -> None:
        self.tail = list(prompt[-SORT_DEPTH:])
        self._parts = []
        self._pending = None
        if self.local is not None:
            self.local.begin(prompt, cancel)

    def plan(self, k: int, k_long: int) -> Plan:
        start = time.perf_counter()
        plan = self._plan(k, k_long)
        self.step_times.append(time.perf_counter() - start)
        return plan

    def draft(self, plan: Plan, seq: Sequence[int]) -> list[int]:
        return plan.tokens or []

    def accept(self, drafted: int, accepted: int) -> None:
        if self.local is not None:
            self.local.accept(drafted if self._local_sent else 0, accepted if self._local_sent else 0)
        if self._pending is not None and drafted > 0 and not self._local_sent:
            bucket, chances = self._pending
            self.calibration.record(bucket, chances[:drafted], accepted)
        self._pending = None

    def extend(self, token_ids: Sequence[int]) -> None:
        if not token_ids:
            return
        self.tail.extend(token_ids)
        del self.tail[:-SORT_DEPTH]
        for part in self._parts:
            part.grow(len(token_ids))
        if self.local is not None:
            self.local.extend(token_ids)

    def end(self, kept: Sequence[int]) -> None:
        """Nothing to drop: the corpus is not this reply's, the tail is."""

    # --- planning ---

    def _plan(self, k: int, k_long: int) -> Plan:
        self._pending, self._local_sent = None, False
        found = self._history_plan(k, k_long)
        tokens, rate = found if found is not None else ([], 1.0)
        if self.local is not None:
            local = self.local.plan(k, k_long)
            if local.offered and (not tokens or local.rate > rate):
                self._pending, self._local_sent = None, True
                return Plan(self, k, local.rate, local.tokens, local.wanted_longer)
        return Plan(self, k, rate, tokens)

    def _current_parts(self) -> list[_PartMatch]:
        if self.view is None:
            return self._parts
        built = self.view.parts()
        if len(built) != len(self._parts):  # a part was built since the last round: it joins, in its place
            kept = {id(p.index): p for p in self._parts}
            self._parts = [kept.get(id(index)) or _PartMatch(index) for index in built]
        return self._parts

    def _history_plan(self, k: int, k_long: int) -> tuple[list[int], float] | None:
        best: tuple[_PartMatch, tuple[int, int, int]] | None = None
        for part in self._current_parts():
            found = part.match(self.tail)
            if found[0] and (best is None or found[0] > best[1][0]):
                best = part, found
        self.last_match_length = best[1][0] if best is not None else 0
        if best is None or k <= 0:
            return None
        part, (length, lo, hi) = best
        ceiling = k if length < LONG_MATCH or self.fixed else max(k, min(k_long, HISTORY_DRAFT_MAX))
        tokens, chances = part.index.walk(length, lo, hi, ceiling, self.vocab_size)
        if not tokens:
            return None
        bucket = match_bucket(length)
        if self.fixed:
            count, rate = len(tokens), 1.0
        else:
            expected, run = [1.0], 1.0
            for chance in self.calibration.chances(bucket, chances):
                run *= chance
                expected.append(expected[-1] + run)
            count, rate = best_length(expected.__getitem__, self.costs, len(tokens), HISTORY_DRAFT_MAX)
        if count == 0:
            return None
        self._pending = bucket, chances[:count]
        return tokens[:count], rate


def build(context: DraftContext) -> HistoryDrafter:
    """The name map's factory (drafters/registry.py). Beside another drafter: the corpus alone, its drafts free
    (c = 0). Alone: the reply's own context too, as the n-gram drafter looks it up."""
    target = context.target
    costs = FreeDraftCosts(target.costs) if target.costs is not None else VerifyCostModel()
    local = None
    if not context.beside:
        local = NgramDrafter(costs=target.costs, fixed=not context.adaptive, tuner=context.tuner)
    return HistoryDrafter(
        costs,
        context.tuner.history,
        context.history,
        context.vocab_size,
        fixed=not context.adaptive,
        local=local,
    )


def offers(context: DraftContext) -> bool:
    """Worth asking beside another drafter this reply: a corpus was handed in and some part of it holds tokens or
    is still being built (an empty or absent corpus costs nothing: the drafter is not built)."""
    return context.history is not None and context.history.may_offer()
