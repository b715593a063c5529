"""A reply's K is decided once (`reply.DraftChoice`): the request the backend gets, the started event, the stored row
and the stats all say the same K and the same drafting, whether the preset drafts or not.

Rule broken on purpose while writing this: the stats taking the preset's K where the reply does not draft (as the
request does not) sent it red."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.events import ReplyFinished, ReplyStarted
from engine.presets import load_presets
from engine.session import ChatSession


@pytest.mark.parametrize(("drafting", "k"), [(True, 5), (False, 0)])
def test_the_request_the_started_event_the_stored_row_and_the_stats_say_one_k(
    tmp_path: Path, drafting: bool, k: int
) -> None:
    backend = ScriptedBackend("one two three four five six")
    session = ChatSession(Settings(data_dir=tmp_path), backend=backend, presets=load_presets(None), save=True)
    session.load()
    session.set_mode("qa")
    session.set_overrides(drafting=drafting)
    events: list[object] = []
    reply = session.send("count", events.append, threading.Event())
    assert isinstance(reply, ReplyFinished)
    (started,) = [e for e in events if isinstance(e, ReplyStarted)]
    request = backend.requests[-1]
    row = session.recorder.store.messages(session.chat_id)[-1]
    assert (request.num_draft_tokens, started.num_draft_tokens, row.k, reply.stats.num_draft_tokens) == (
        k,
    ) * 4
    assert request.drafting == started.drafting == drafting
    assert started.k_mode == reply.stats.k_mode == ("adaptive" if drafting else "fixed")
    assert (reply.stats.draft_mode != "none") == drafting
