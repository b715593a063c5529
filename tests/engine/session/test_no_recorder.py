"""A session that saves nothing (`ChatSession(save=False)`) holds a `NoRecorder`, the one place that decides it: its
history answers every read empty, writes nowhere and says so where a store is needed, and it has every recorder call
the history makes (so `ChatHistory` never asks whether there is a recorder).

Rule broken on purpose while writing this: `NoRecorder.chats` removed (the history's chats() raised
AttributeError, and the call list below named it)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

import engine.session.history as history_module
from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.errors import SpecchatError
from engine.events import ReplyFinished
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.recording import ChatRecorder, NoRecorder


def test_every_recorder_call_the_history_makes_is_on_the_null_recorder_too(tmp_path: Path) -> None:
    source = Path(history_module.__file__).read_text()
    calls = set(re.findall(r"recorder\.(\w+)", source))
    assert len(calls) > 10, calls  # the history calls its recorder
    real = ChatRecorder(tmp_path)
    assert sorted(c for c in calls if not hasattr(real, c)) == []
    assert sorted(c for c in calls if c != "store" and not hasattr(NoRecorder(), c)) == []


def test_a_session_that_saves_nothing_reads_empty_and_says_so_where_a_store_is_needed(tmp_path: Path) -> None:
    backend = ScriptedBackend(["first", "second"])
    session = ChatSession(Settings(data_dir=tmp_path), backend=backend, presets=load_presets(None))
    session.load()
    session.set_mode("qa")
    assert isinstance(session.recorder, NoRecorder) and not session.history.saves
    reply = session.send("hello", lambda e: None, threading.Event())
    assert isinstance(reply, ReplyFinished)
    again = session.regenerate(lambda e: None, threading.Event())
    assert isinstance(again, ReplyFinished) and [t.content for t in session.turns] == ["hello", "second"]
    assert all(t.message_id is None for t in session.turns)
    history = session.history
    assert (history.chat_id, history.last_chat_id(), history.chats(), history.metrics_rows()) == (
        None,
        None,
        [],
        [],
    )
    assert session.variants() == (0, 0) and session.show_variant(-1) is None
    assert history.drafting_corpus(session.turns) is None and backend.requests[-1].history is None
    assert (history.memory_only, history.open_elsewhere(), history.take_notices()) == (False, 0, [])
    assert history.recent_average("qa") is None and history.check_regressions() == []
    for needs_a_store in (
        lambda: session.open_chat(1),
        lambda: history.rename_chat(1, "t"),
        lambda: history.export_chat(1),
    ):
        with pytest.raises(SpecchatError, match="does not keep a history"):
            needs_a_store()
    assert not list(tmp_path.iterdir())  # nothing written
