"""The history drafter (engine/decoding/drafters/history.py) and its corpus (engine/decoding/history_corpus.py): the
suffix index finds the longest match a brute force finds, the walk's probabilities are the match counts', no draft
runs across a document, the corpus is built off the reply path and joins a reply when ready, within its budget, and
where there is nothing to offer the drafter is not even built. A greedy reply drafted from history is the plain
reply, and its rounds say "history"."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.drafters import DraftContext, build_drafters
from engine.decoding.drafters.history import (
    MIN_MATCH,
    SORT_DEPTH,
    HistoryDrafter,
    TokenIndex,
    _PartMatch,
    suffix_order,
)
from engine.decoding.history_corpus import HistoryIndexes
from engine.events import Chunk
from engine.request import CorpusPart, HistoryCorpus
from tests.engine.decoding.drafters.test_contract import PROMPT, VOCAB, follows, models, reply, tokens_of


def brute_longest(corpus_docs: list[list[int]], tail: list[int]) -> int:
    """The longest suffix of `tail` (MIN_MATCH..SORT_DEPTH tokens) inside one document; 0 if none."""
    best = 0
    for length in range(MIN_MATCH, min(SORT_DEPTH, len(tail)) + 1):
        pattern = tail[-length:]
        if any(doc[i : i + length] == pattern for doc in corpus_docs for i in range(len(doc) - length + 1)):
            best = length
    return best


def test_the_suffix_order_sorts_every_suffix_by_its_first_tokens() -> None:
    rng = random.Random(1)
    for alphabet in (2, 3, 50):
        tokens = np.array([rng.randrange(alphabet) for _ in range(400)] + [-1, 1, 1], dtype=np.int32)
        order = suffix_order(tokens)
        keys = [tuple(tokens[i : i + SORT_DEPTH].tolist()) for i in order]
        assert keys == sorted(keys) and sorted(order.tolist()) == list(range(len(tokens)))


def test_the_longest_match_is_the_brute_forces_as_a_reply_grows() -> None:
    rng = random.Random(2)
    for _ in range(20):
        docs = [[rng.randrange(3) for _ in range(rng.randrange(5, 60))] for _ in range(4)]
        part = _PartMatch(TokenIndex.from_documents(docs))
        tail = [rng.randrange(3) for _ in range(8)]
        for _ in range(30):  # the bound kept from round to round never hides a longer match
            emitted = [rng.randrange(3) for _ in range(rng.randrange(1, 4))]
            tail = (tail + emitted)[-SORT_DEPTH:]
            part.grow(len(emitted))
            length, lo, hi = part.match(tail)
            assert length == brute_longest(docs, tail)
            if length:
                index = part.index
                starts = [index.order[i] for i in range(lo, hi)]
                assert all(list(index.tokens[s : s + length]) == tail[-length:] for s in starts)
                occurrences = sum(
                    doc[i : i + length] == tail[-length:]
                    for doc in docs
                    for i in range(len(doc) - length + 1)
                )
                assert hi - lo == occurrences


def test_the_walk_follows_the_most_frequent_continuation_with_its_share() -> None:
    stem = [10, 11, 12, 13, 14]
    index = TokenIndex.from_documents([[*stem, 20, 21], [*stem, 30], [*stem, 20, 21, 22], [5, *stem, 20]])
    part = _PartMatch(index)
    length, lo, hi = part.match([1, 2, *stem])
    assert (length, hi - lo) == (5, 4)
    drafts, chances = index.walk(length, lo, hi, 8, VOCAB)
    # 20 follows 3 of 4; then 21 follows 2 of those 3; then 22 follows 1 of 2 (the path's chance 0.25 > 0.1).
    assert drafts == [20, 21, 22] and chances == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    # Nothing is ever drafted across the end of a document (the separator).
    assert index.walk(length, lo, hi, 8, 21)[0] == [20]  # and nothing past the vocabulary


def test_a_draft_never_runs_across_documents() -> None:
    index = TokenIndex.from_documents([[1, 2, 3, 4], [5, 6, 7, 8]])
    length, lo, hi = _PartMatch(index).match([9, 1, 2, 3, 4])
    assert length == 4 and index.walk(length, lo, hi, 8, VOCAB) == ([], [])


def corpus_of(*texts: str, key: str = "past") -> HistoryCorpus:
    return HistoryCorpus((CorpusPart(key, lambda: iter(texts)),))


def encode(text: str) -> list[int]:
    return [int(word) for word in text.split()]


def context(history=None, adaptive: bool = True) -> DraftContext:
    target, draft = models()
    return DraftContext(
        target=target, draft=draft, tuner=AdaptiveK(), adaptive=adaptive, vocab_size=VOCAB, history=history
    )


def test_with_nothing_to_offer_the_history_drafter_is_not_built() -> None:
    assert [d.name for d in build_drafters("ngram", context())] == ["ngram"]  # no corpus handed in
    indexes = HistoryIndexes(encode)
    empty = indexes.view(HistoryCorpus((CorpusPart("none", lambda: iter(())),)))
    assert indexes.wait(10) and not empty.may_offer()
    assert [d.name for d in build_drafters("ngram", context(empty))] == ["ngram"]
    assert indexes.view(HistoryCorpus()) is None and indexes.view(None) is None
    # Some text: beside the primary, as the name map says; with fixed K no companion at all.
    full = indexes.view(corpus_of("1 2 3 4 5 6"))
    assert indexes.wait(10) and full.may_offer()
    assert [d.name for d in build_drafters("ngram", context(full))] == ["ngram", "history"]
    assert [d.name for d in build_drafters("model", context(full))] == ["model", "ngram", "history"]
    assert [d.name for d in build_drafters("ngram", context(full, adaptive=False))] == ["ngram"]


def test_a_part_is_built_once_per_key_within_the_budget_and_dropped_when_no_longer_handed_in() -> None:
    calls: list[str] = []

    def counting(text: str) -> list[int]:
        calls.append(text)
        return encode(text)

    indexes = HistoryIndexes(counting, budget=10)
    chat = CorpusPart("chat", lambda: iter(["1 2 3", "4 5 6"]))
    past = CorpusPart("past:1", lambda: iter(["7 8 9 10 11 12", "13 14"]))
    view = indexes.view(HistoryCorpus((chat, past)))
    assert indexes.wait(10)
    first, second = view.parts()
    assert list(first.tokens) == [1, 2, 3, -1, 4, 5, 6, -1]  # a separator after each text
    assert list(second.tokens) == [7, 8, -1]  # the chat's 8 tokens ahead of it leave 2 of the budget's 10
    assert len(calls) == 3  # the budget was spent before the past's second text
    again = indexes.view(HistoryCorpus((chat, past)))
    assert indexes.wait(10) and again.parts() == (first, second) and len(calls) == 3  # built once per key
    grown = CorpusPart("past:2", lambda: iter(["7 8 9 10 11 12", "15"]))
    indexes.view(HistoryCorpus((grown,)))
    assert indexes.wait(10) and indexes.built(("chat", "past:1")) == {}  # what is not handed in goes
    assert calls[3:] == ["15"]  # "7 8 ... 12" kept its tokens: only the new text is tokenized


def test_a_part_that_fails_to_load_is_left_out_and_said() -> None:
    def broken():
        raise OSError("the store is gone")

    indexes = HistoryIndexes(encode)
    view = indexes.view(
        HistoryCorpus((CorpusPart("broken", broken), CorpusPart("ok", lambda: iter(["1 2"]))))
    )
    assert indexes.wait(10) and len(view.parts()) == 1 and "the store is gone" in indexes.failures[0]


def test_a_reply_does_not_wait_for_the_index_and_takes_it_when_ready() -> None:
    release = threading.Event()
    sequence = [*PROMPT]
    for _ in range(60):
        sequence.append(follows(sequence[-1]))
    text = " ".join(str(t) for t in sequence)

    def held() -> list[str]:
        release.wait(10)
        return [text]

    indexes = HistoryIndexes(encode)
    view = indexes.view(HistoryCorpus((CorpusPart("held", held),)))
    drafter = HistoryDrafter(models()[0].costs, AdaptiveK().history, view, VOCAB)
    drafter.begin(PROMPT, threading.Event())
    assert view.may_offer() and not drafter.plan(4, 0).offered  # still building: nothing, and no wait
    release.set()
    assert indexes.wait(10)
    drafter.extend(sequence[len(PROMPT) : len(PROMPT) + 6])
    plan = drafter.plan(8, 0)
    assert plan.offered and plan.tokens == sequence[len(PROMPT) + 6 : len(PROMPT) + 6 + len(plan.tokens)]


def test_a_greedy_reply_drafted_from_history_is_the_plain_reply() -> None:
    target, _ = models()
    plain = tokens_of(reply([], target, True, max_new=60))
    # The corpus holds an earlier reply to the same prompt (a regenerate): the tail matches it at once.
    indexes = HistoryIndexes(encode)
    view = indexes.view(corpus_of(" ".join(str(t) for t in PROMPT[-4:] + plain)))
    assert indexes.wait(10)
    ctx = context(view)
    drafters = build_drafters("ngram", ctx)
    events = reply(drafters, ctx.target, True, max_new=60)
    assert tokens_of(events) == plain
    history = [e for e in events if isinstance(e, Chunk) and e.drafter == "history"]
    assert history and sum(c.accepted for c in history) > 0
