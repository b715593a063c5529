"""What the session hands the history drafter (engine/session/history.py `drafting_corpus`), on a real SQLite file:
this chat's other variants and branches first (a regenerated reply's old text, an edited question's old branch),
then past chats, most recent first; never a chat marked private; nothing with `history_drafting` off; past chats
read only when the engine asks, under a key that changes with them."""

from __future__ import annotations

import threading
from pathlib import Path

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.request import HistoryCorpus
from engine.session import ChatSession
from engine.storage.store import SCHEMA_VERSION, Store


def make_session(data_dir: Path, backend: ScriptedBackend, **settings) -> ChatSession:
    session = ChatSession(
        Settings(data_dir=data_dir, **settings), backend=backend, presets=load_presets(None), save=True
    )
    session.load()
    session.set_mode("qa")  # adaptive K: where companions are asked
    return session


def send(session: ChatSession, text: str) -> None:
    session.send(text, lambda e: None, threading.Event())


def texts(corpus: HistoryCorpus | None) -> list[list[str]]:
    return [list(part.load()) for part in corpus.parts] if corpus is not None else []


def test_a_regenerated_replys_old_text_comes_first_then_past_chats_most_recent_first(tmp_path: Path) -> None:
    backend = ScriptedBackend(
        ["old chat reply", "newer chat reply", "first answer", "second answer", "third"]
    )
    session = make_session(tmp_path, backend)
    send(session, "an old question")
    session.new_chat()
    send(session, "a newer question")
    session.new_chat()
    send(session, "the question")
    assert backend.requests[-1].history is not None
    assert texts(backend.requests[-1].history) == [
        ["a newer question", "newer chat reply", "an old question", "old chat reply"]
    ]
    session.regenerate(lambda e: None, threading.Event())
    chat, past = texts(backend.requests[-1].history)
    assert chat == ["first answer"]  # the variant the regenerate replaced
    assert past[:2] == ["a newer question", "newer chat reply"]
    # An edited question: its old branch (question and reply) is handed in, newest first.
    session.edit(0, "the question, edited", lambda e: None, threading.Event())
    chat, _ = texts(backend.requests[-1].history)
    assert chat == ["second answer", "first answer", "the question"]


def test_private_chats_are_never_handed_in_and_the_past_key_follows_the_store(tmp_path: Path) -> None:
    backend = ScriptedBackend(["secret reply", "open reply", "here"])
    session = make_session(tmp_path, backend)
    send(session, "a secret")
    secret = session.chat_id
    session.history.set_private(secret, True)
    session.new_chat()
    send(session, "open")
    session.new_chat()
    send(session, "now")
    parts = backend.requests[-1].history.parts
    assert texts(backend.requests[-1].history) == [["open", "open reply"]]
    store = session.recorder.store
    key = parts[0].key
    assert store.chat(secret).private and store.past_key(session.chat_id) == key
    store.set_private(secret, False)
    assert store.past_key(session.chat_id) != key  # the secret chat joins: a new key, a new index
    # A private chat's own variants are not handed in either.
    session.history.set_private(session.chat_id, True)
    session.regenerate(lambda e: None, threading.Event())
    assert [p.key.split(":")[0] for p in backend.requests[-1].history.parts] == ["past"]


def test_history_drafting_off_hands_nothing_in(tmp_path: Path) -> None:
    backend = ScriptedBackend(["a", "b"])
    session = make_session(tmp_path, backend, history_drafting=False)
    send(session, "one")
    session.new_chat()
    send(session, "two")
    assert backend.requests[-1].history is None
    assert Settings(data_dir=tmp_path).history_drafting  # on by default


def test_past_chats_are_read_only_when_the_engine_asks(tmp_path: Path, monkeypatch) -> None:
    backend = ScriptedBackend(["a", "b"])
    session = make_session(tmp_path, backend)
    send(session, "one")
    session.new_chat()
    reads: list[int | None] = []
    real = Store.past_texts
    monkeypatch.setattr(Store, "past_texts", lambda self, chat: reads.append(chat) or real(self, chat))
    send(session, "two")
    assert reads == []  # the send read only the key
    assert texts(backend.requests[-1].history) == [["one", "a"]] and reads == [session.chat_id]


def test_the_store_marks_chats_private_from_schema_3_on(tmp_path: Path) -> None:
    assert SCHEMA_VERSION >= 3
    store = Store.open(tmp_path)
    chat = store.create_chat("t")
    assert store.chat(chat).private is False
    store.set_private(chat, True)
    assert store.chat(chat).private is True and store.chats()[0].private is True
