"""Branches of a saved chat on a real SQLite file: editing any earlier message makes a sibling branch that stays
reachable, a message taken back leaves no empty chat, continuing a reply cut at its token limit, two windows on one
chat (both branches reachable, each window sees the other), and the memory-only state."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support import paths


def make_session(data_dir: Path, backend: ScriptedBackend, **settings) -> ChatSession:
    session = ChatSession(
        Settings(data_dir=data_dir, **settings), backend=backend, presets=load_presets(None), save=True
    )
    session.load()
    session.set_mode("qa")
    return session


def send(session: ChatSession, text: str):
    return session.send(text, lambda e: None, threading.Event())


def contents(session: ChatSession) -> list[str]:
    return [t.content for t in session.turns]


def test_editing_an_earlier_message_makes_a_branch_and_the_old_one_stays_reachable(tmp_path: Path):
    backend = ScriptedBackend(["A1", "A2", "A3", "B2"])
    session = make_session(tmp_path, backend)
    for text in ("one", "two", "three"):
        send(session, text)
    assert contents(session) == ["one", "A1", "two", "A2", "three", "A3"]

    session.edit(2, "TWO", lambda e: None, threading.Event())
    assert contents(session) == ["one", "A1", "TWO", "B2"]
    assert session.branches(2) == (2, 2)
    assert session.branches(0) == (1, 1)

    old = session.show_branch(2, -1)
    assert old is not None and [t.content for t in old] == ["two", "A2", "three", "A3"]
    assert contents(session) == ["one", "A1", "two", "A2", "three", "A3"]
    assert session.branches(2) == (1, 2)
    assert session.show_branch(2, -1) is None  # no older one
    session.show_branch(2, 1)
    assert contents(session) == ["one", "A1", "TWO", "B2"]

    # Every message is still in the database; reopening shows the newest branch, the other one pages in.
    store = Store.open(tmp_path)
    assert sorted(m.text for m in store.messages(session.chat_id)) == sorted(
        ["one", "A1", "two", "A2", "three", "A3", "TWO", "B2"]
    )
    again = make_session(tmp_path, ScriptedBackend(["x"]))
    again.open_chat(session.chat_id)
    assert contents(again) == ["one", "A1", "TWO", "B2"]
    again.show_branch(2, -1)
    assert contents(again) == ["one", "A1", "two", "A2", "three", "A3"]


def test_editing_the_first_message_makes_a_root_branch(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["A1", "B1"]))
    send(session, "first")
    session.edit(0, "FIRST", lambda e: None, threading.Event())
    assert contents(session) == ["FIRST", "B1"]
    assert session.branches(0) == (2, 2)
    session.show_branch(0, -1)
    assert contents(session) == ["first", "A1"]


def test_an_edit_stopped_before_its_first_token_brings_the_old_branch_back(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["A1", "A2"]))
    send(session, "one")
    send(session, "two")
    cancel = threading.Event()
    cancel.set()
    session.edit(0, "ONE", lambda e: None, cancel)
    assert contents(session) == ["one", "A1", "two", "A2"]
    assert "ONE" not in [m.text for m in Store.open(tmp_path).messages(session.chat_id)]


def test_a_message_refused_as_too_long_leaves_no_empty_chat(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["ok"], max_context=64))
    result = send(session, " ".join(["word"] * 200))
    assert result.undone
    assert Store.open(tmp_path).chats() == []
    assert session.chat_id is None
    send(session, "short")  # the next message starts the chat
    assert [c.message_count for c in Store.open(tmp_path).chats()] == [2]


def test_a_first_message_stopped_before_its_first_token_leaves_no_empty_chat(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["ok"]))
    cancel = threading.Event()
    cancel.set()
    session.send("hello", lambda e: None, cancel)
    assert Store.open(tmp_path).chats() == []


def test_a_reply_cut_at_its_token_limit_continues_as_the_same_reply(tmp_path: Path):
    words = " ".join(f"w{i}" for i in range(40))
    backend = ScriptedBackend([words, words])
    session = make_session(tmp_path, backend)
    session.set_overrides(max_new_tokens=8)
    send(session, "count")
    assert session.can_continue()
    first = session.turns[-1].content
    assert first == " ".join(f"w{i}" for i in range(8))
    session.continue_reply(lambda e: None, threading.Event())
    # The model was asked to go on from the reply's last token (the partial reply closes the prompt).
    prompt = backend.decode(list(backend.requests[-1].prompt_ids))
    assert prompt.endswith(first)
    assert len(session.turns) == 2
    assert session.turns[-1].content.startswith(first) and len(session.turns[-1].content) > len(first)
    stored = Store.open(tmp_path).conversation(session.chat_id)
    assert [m.text for m in stored] == ["count", session.turns[-1].content]


def test_continue_refuses_a_reply_that_ended_by_itself(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["short answer"]))
    send(session, "hi")
    assert not session.can_continue()


def test_memory_only_is_a_lasting_state(tmp_path: Path):
    session = make_session(tmp_path, ScriptedBackend(["ok"]))
    send(session, "hi")
    assert not session.memory_only
    session.recorder.store.database.fall_back_to_memory("database or disk is full")
    assert session.memory_only
    send(session, "again")
    assert session.memory_only


OTHER_WINDOW = """
import sys, threading, time
from pathlib import Path
from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
session = ChatSession(Settings(data_dir=Path(sys.argv[1])), backend=ScriptedBackend(["from B"]),
                      presets=load_presets(None), save=True)
session.load()
session.open_chat(int(sys.argv[2]))
print("others", session.history.open_elsewhere(), flush=True)
session.send("B asks", lambda e: None, threading.Event())
print("sent", flush=True)
sys.stdin.readline()
"""


def test_two_windows_on_one_chat_both_branches_stay_reachable_and_each_sees_the_other(tmp_path: Path):
    a = make_session(tmp_path, ScriptedBackend(["first", "from A"]))
    send(a, "hello")
    chat_id = a.chat_id
    assert a.history.open_elsewhere() == 0
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_WINDOW, str(tmp_path), str(chat_id)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=paths.ROOT,
        env={**os.environ, "PYTHONPATH": str(paths.ROOT)},
    )
    try:
        assert other.stdout.readline().split() == ["others", "1"]  # B sees A
        assert other.stdout.readline().strip() == "sent"
        assert a.history.open_elsewhere() == 1  # A sees B
        send(a, "A asks")
    finally:
        other.communicate("\n", timeout=30)
    assert a.history.open_elsewhere() == 0  # B quit: its lock went with it

    reopened = make_session(tmp_path, ScriptedBackend(["x"]))
    reopened.open_chat(chat_id)
    assert contents(reopened) == ["hello", "first", "A asks", "from A"]
    assert reopened.branches(2) == (2, 2)
    reopened.show_branch(2, -1)
    assert contents(reopened) == ["hello", "first", "B asks", "from B"]
