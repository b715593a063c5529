"""ChatSession saving to a real store and metrics log: when rows appear, what a cancelled or failed reply leaves,
regenerated variants, continuing a stored chat, and a data folder that cannot be written."""

from __future__ import annotations

import threading
import time
from dataclasses import fields
from pathlib import Path

import orjson
import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.errors import BackendError
from engine.events import MessageStats, ReplyFailed, ReplyFinished
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store, StoreError


def make_session(data_dir: Path, backend: ScriptedBackend, save: bool = True) -> ChatSession:
    session = ChatSession(Settings(data_dir=data_dir), backend=backend, presets=load_presets(None), save=save)
    session.load()
    session.set_mode("qa")
    return session


def send(session: ChatSession, text: str):
    return session.send(text, lambda e: None, threading.Event())


def metrics_rows(data_dir: Path) -> list[dict]:
    path = data_dir / "metrics.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Background:
    """`session.send` in a thread of its own, as the chat app runs it: `cancel` it, `wait` for its result."""

    def __init__(self, session: ChatSession, text: str) -> None:
        self.cancel = threading.Event()
        self.result: ReplyFinished | ReplyFailed | None = None

        def run() -> None:
            self.result = session.send(text, lambda e: None, self.cancel)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self, timeout: float) -> ReplyFinished | ReplyFailed | None:
        self.thread.join(timeout)
        return self.result


def test_nothing_is_written_without_save(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend("Paris."), save=False)
    assert isinstance(send(session, "Capital of France?"), ReplyFinished)
    assert list(tmp_path.iterdir()) == []


def test_user_message_is_stored_before_generation_and_the_reply_while_it_streams(tmp_path: Path):
    gate = threading.Event()
    backend = ScriptedBackend("one two three four five six seven eight", gate=gate, gate_after_rounds=1)
    session = make_session(tmp_path, backend)
    handle = Background(session, "Count for me")
    wait_for(lambda: session.live.new_tokens > 0)
    # Another reader (another process would see the same) finds the question and the reply row already.
    reader = Store.open(tmp_path)
    (chat,) = reader.chats()
    assert chat.title == "Count for me"
    user, reply = reader.conversation(chat.id)
    assert (user.role, user.text) == ("user", "Count for me")
    assert reply.role == "assistant" and reply.stop_reason is None and reply.parent_id == user.id
    assert (reply.preset, reply.k) == ("qa", session.presets["qa"].k)
    gate.set()
    result = handle.wait(10)
    assert isinstance(result, ReplyFinished)
    (_, reply) = reader.conversation(chat.id)
    assert reply.text == result.text and reply.stop_reason == "end_of_turn"
    assert reply.stats == result.stats.to_dict()


def test_cancelled_reply_is_kept_with_its_stop_reason(tmp_path: Path):
    gate = threading.Event()
    session = make_session(tmp_path, ScriptedBackend("a b c d e f g h i j", gate=gate, gate_after_rounds=2))
    handle = Background(session, "Letters please")
    wait_for(lambda: session.live.rounds >= 2)
    handle.cancel.set()
    result = handle.wait(10)
    assert isinstance(result, ReplyFinished) and result.cancelled and result.text
    store = Store.open(tmp_path)
    (chat,) = store.chats()
    _, reply = store.conversation(chat.id)
    assert (reply.text, reply.stop_reason) == (result.text, "cancelled")
    assert metrics_rows(tmp_path) == []  # a cancelled reply is not a finished one


def test_cancel_before_any_text_stores_nothing(tmp_path: Path):
    gate = threading.Event()
    session = make_session(tmp_path, ScriptedBackend("never shown", gate=gate))
    handle = Background(session, "Hold on")
    wait_for(lambda: session.chat_id is not None and session.active is not None)
    handle.cancel.set()
    handle.wait(10)
    store = Store.open(tmp_path)
    # The prompt went back to the user, not into the history: no message, and no empty chat either.
    assert store.chats() == []


class FailingBackend(ScriptedBackend):
    """Streams the first round of its reply, then fails as a backend would (out of memory, a lost device)."""

    def generate(self, request, cancel):
        for i, event in enumerate(super().generate(request, cancel)):
            if i == 1:
                raise BackendError("the device went away")
            yield event


def test_failed_reply_is_kept_with_its_error(tmp_path: Path):
    session = make_session(tmp_path, FailingBackend("alpha beta gamma delta epsilon"))
    result = send(session, "Go")
    assert isinstance(result, ReplyFailed) and result.partial_text
    store = Store.open(tmp_path)
    (chat,) = store.chats()
    user, reply = store.conversation(chat.id)
    assert user.text == "Go"
    assert (reply.text, reply.stop_reason, reply.error) == (
        result.partial_text,
        "error",
        "the device went away",
    )


def test_regenerate_keeps_both_variants_and_a_reopened_chat_continues(tmp_path: Path):
    backend = ScriptedBackend(["First variant.", "Second variant.", "Third answer."])
    session = make_session(tmp_path, backend)
    send(session, "Question one")
    session.regenerate(lambda e: None, threading.Event())
    chat_id = session.chat_id
    store = Store.open(tmp_path)
    user, reply = store.conversation(chat_id)
    assert [m.text for m in store.siblings(reply.id)] == ["First variant.", "Second variant."]

    # A new process (a new session) opens the chat: the newest variant and its stats come back ...
    backend2 = ScriptedBackend("Follow-up answer.")
    reopened = make_session(tmp_path, backend2)
    turns = reopened.open_chat(chat_id)
    assert [(t.role, t.content) for t in turns] == [
        ("user", "Question one"),
        ("assistant", "Second variant."),
    ]
    assert isinstance(turns[1].stats, MessageStats) and turns[1].stats.preset == "qa"
    # ... and the conversation continues with the same context, in the same chat.
    send(reopened, "Question two")
    prompt = backend2.decode(list(backend2.requests[-1].prompt_ids))
    assert "Question one" in prompt and "Second variant." in prompt and "Question two" in prompt
    assert [m.text for m in store.conversation(chat_id)] == [
        "Question one",
        "Second variant.",
        "Question two",
        "Follow-up answer.",
    ]
    assert len(store.chats()) == 1


def test_new_chat_starts_another_chat_and_keeps_the_old_one(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend("ok"))
    send(session, "In the first chat")
    first = session.chat_id
    session.new_chat()
    send(session, "In the second chat")
    assert session.chat_id != first
    assert [c.title for c in Store.open(tmp_path).chats()] == ["In the second chat", "In the first chat"]
    assert session.history.last_chat_id() == session.chat_id


def test_open_unknown_chat_is_a_clear_error(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend("ok"))
    with pytest.raises(StoreError, match="no chat with id 42"):  # the store's error, as it is
        session.open_chat(42)


def test_metrics_line_has_every_stats_field_and_the_setup(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend("The answer is four."))
    result = send(session, "2+2?")
    (row,) = metrics_rows(tmp_path)
    for field in fields(MessageStats):
        assert row[field.name] == getattr(result.stats, field.name), field.name
    assert row["model"] == "scripted-model" and row["backend"] == "scripted" and row["device"] == "cpu"
    assert row["cache_mode"] == "fp16" and row["draft_cache_mode"] == "fp16" and row["draft"] == "ngram"
    assert row["versions"]["python"] and "specchat" in row["versions"]
    assert len(row["fingerprint"]) == 12
    assert row["chat_id"] == session.chat_id and row["message_id"] == session.turns[-1].message_id
    assert abs(row["timestamp"] - time.time()) < 60


def test_unwritable_data_folder_chat_goes_on_in_memory(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    session = make_session(blocker / "data", ScriptedBackend(["One.", "Two."]))
    assert isinstance(send(session, "first"), ReplyFinished)
    assert isinstance(send(session, "second"), ReplyFinished)
    notices = session.take_notices()
    assert len(notices) == 2  # the store and the metrics log each say it once
    assert any("in memory" in n for n in notices) and any("metrics log" in n for n in notices)
    assert session.take_notices() == []
    assert [t.content for t in session.turns] == ["first", "One.", "second", "Two."]
    assert session.recorder is not None
    assert [c.title for c in session.recorder.store.chats()] == ["first"]  # the history screen still lists it


def test_regenerated_variants_page_and_the_chat_continues_from_the_one_shown(tmp_path: Path):
    backend = ScriptedBackend(["Variant A.", "Variant B.", "Variant C.", "Next answer."])
    session = make_session(tmp_path, backend)
    assert session.variants() == (0, 0)
    send(session, "Question")
    assert session.variants() == (1, 1)
    session.regenerate(lambda e: None, threading.Event())
    session.regenerate(lambda e: None, threading.Event())
    assert session.variants() == (3, 3) and session.turns[-1].content == "Variant C."
    assert session.show_variant(+1) is None  # already the newest
    older = session.show_variant(-1)
    assert older is not None and older.content == "Variant B." and older.stats is not None
    assert session.variants() == (2, 3)
    assert session.show_variant(-1).content == "Variant A."
    assert session.show_variant(-1) is None
    assert session.show_variant(+1).content == "Variant B."
    send(session, "Go on")
    prompt = backend.decode(list(backend.requests[-1].prompt_ids))
    assert "Variant B." in prompt and "Variant C." not in prompt
    store = Store.open(tmp_path)
    assert [m.text for m in store.conversation(session.chat_id)] == [
        "Question",
        "Variant B.",
        "Go on",
        "Next answer.",
    ]
