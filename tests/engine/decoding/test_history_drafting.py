"""History drafting on the real embedded model (llama.cpp, SmolLM2 F16): a regenerated reply drafted from its
earlier variant is token for token the plain reply, greedy and seeded, and its rounds say "history" and are
accepted; an empty corpus changes no round; a session handed a store of 1M tokens of past chats replies at once,
without waiting for the index; and the per-source counts of a reply agree in its stats, the store and the metrics
log. Verify passes are priced free (`FreeVerify`), so that drafting pays whatever the machine's load."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.events import Chunk, Done, ReplyFinished
from engine.request import CorpusPart, GenerationRequest, HistoryCorpus, SamplerSettings
from tests.support.drafting import FreeVerify

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that checks whether a number is prime, with a docstring."
GREEDY = {"temperature": 0.0}
SEEDED = {"temperature": 0.8, "top_p": 0.95}
MAX_NEW = 64


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf

    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=2048)
    backend.load()
    backend.target.costs = FreeVerify()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompt(backend) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": PROMPT}])


def run(backend, prompt, key: str, k: int = 6, history=None, **sampler) -> list[Chunk]:
    request = GenerationRequest(
        prompt_ids=tuple(prompt),
        sampler=SamplerSettings(**(sampler or GREEDY)),
        max_new_tokens=MAX_NEW,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=7,
        k_mode="adaptive",
        tuning_key=key,  # each run its own adaptive-K state: runs compared start alike
        history=history,
    )
    events = list(backend.generate(request, threading.Event()))
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, Chunk)]


def tokens(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def indexed(backend, *texts: str, key: str) -> HistoryCorpus:
    """A corpus of `texts`, its index built before the reply (the reply would not wait for it)."""
    corpus = HistoryCorpus((CorpusPart(key, lambda: texts),))
    backend.history_view(GenerationRequest((1,), SamplerSettings(), 1, 4, k_mode="adaptive", history=corpus))
    assert backend.history_indexes.wait(60)
    return corpus


def history_rounds(chunks: list[Chunk]) -> tuple[int, int]:
    ours = [c for c in chunks if c.drafter == "history"]
    return sum(c.drafted for c in ours), sum(c.accepted for c in ours)


def test_a_greedy_regenerate_drafted_from_history_is_the_plain_reply(backend, prompt) -> None:
    plain = tokens(run(backend, prompt, "plain-greedy", k=0))
    earlier = backend.decode(plain)
    corpus = indexed(backend, "an unrelated reply about sorting lists in place", earlier, key="greedy")
    chunks = run(backend, prompt, "history-greedy", history=corpus)
    assert tokens(chunks) == plain
    drafted, accepted = history_rounds(chunks)
    assert accepted > 0 and accepted >= len(plain) // 2, (drafted, accepted, len(plain))


def test_a_seeded_reply_with_history_drafting_is_the_plain_reply(backend, prompt) -> None:
    plain = tokens(run(backend, prompt, "plain-seeded", k=0, **SEEDED))
    greedy = backend.decode(tokens(run(backend, prompt, "plain-greedy-2", k=0)))
    corpus = indexed(backend, greedy, backend.decode(plain), key="seeded")
    chunks = run(backend, prompt, "history-seeded", history=corpus, **SEEDED)
    assert tokens(chunks) == plain
    assert history_rounds(chunks)[1] > 0


def test_an_empty_corpus_changes_no_round(backend, prompt) -> None:
    rounds = [
        [(c.token_ids, c.drafted, c.accepted, c.drafter) for c in chunks]
        for chunks in (
            run(backend, prompt, "none-a"),
            run(backend, prompt, "none-b", history=indexed(backend, "", "   ", key="empty")),
        )
    ]
    assert rounds[0] == rounds[1]


def filler_chats(total_tokens: int) -> list[list[str]]:
    """Past chats of about `total_tokens` SmolLM2 tokens: code-like questions and answers (~3.5 chars a token)."""
    chats, size, i = [], 0, 0
    while size < total_tokens:
        lines = [f"def helper_{i}_{j}(value):\n    return value * {j} + {i}  # step {j}" for j in range(40)]
        chats.append([f"Write helpers number {i}.", "\n".join(lines)])
        size += sum(len(t) for t in chats[-1]) // 3
        i += 1
    return chats


def test_a_session_with_a_large_history_replies_at_once_and_counts_each_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp")
    import time

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.config import Settings
    from engine.models import ensure_embedded_gguf
    from engine.presets import load_presets
    from engine.session import ChatSession
    from engine.storage.store import Store

    # 1M tokens of past chats in the store, written in one transaction.
    store = Store.open(tmp_path)
    now = time.time()
    for chat in filler_chats(1_000_000):
        chat_id = store.create_chat(chat[0])
        rows = [
            (chat_id, role, text, now, now) for role, text in zip(("user", "assistant"), chat, strict=True)
        ]
        store.database.write(
            lambda con, rows=rows: con.executemany(
                "INSERT INTO messages (chat_id, role, text, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        )
    store.close()
    # The index is held back until the first reply is over: it must not wait for it.
    release = threading.Event()
    real = Store.past_texts

    def held(self, chat):
        release.wait(120)
        yield from real(self, chat)

    monkeypatch.setattr(Store, "past_texts", held)
    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=2048)
    session = ChatSession(
        Settings(data_dir=tmp_path, seed=7), backend=backend, presets=load_presets(None), save=True
    )
    session.load()
    backend.target.costs = FreeVerify()
    session.set_mode("code")
    session.set_overrides(max_new_tokens=MAX_NEW)
    try:
        first = session.send(PROMPT, lambda e: None, threading.Event())
        assert isinstance(first, ReplyFinished) and first.text
        indexes = backend.history_indexes
        assert indexes is not None and not indexes.wait(0)  # the index is still being built
        release.set()
        assert indexes.wait(120)
        assert 900_000 < indexes.tokens_indexed <= 2_000_000

        again = session.regenerate(lambda e: None, threading.Event())
        assert isinstance(again, ReplyFinished)
        stats = again.stats
        assert stats.drafted_by.get("history", 0) > 0 and stats.accepted_by.get("history", 0) > 0
        assert sum(stats.drafted_by.values()) == stats.drafted_tokens
        assert sum(stats.accepted_by.values()) == stats.accepted_tokens
        stored = session.recorder.store.messages(session.chat_id)[-1].stats
        logged = session.metrics_rows()[-1]
        for record in (stored, logged):
            assert record["drafted_by"] == stats.drafted_by and record["accepted_by"] == stats.accepted_by
    finally:
        release.set()
        backend.close()
