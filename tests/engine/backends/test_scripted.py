"""The scripted backend the app's tests run on: rounds follow the accept pattern, text round-trips, cancel and
its word tokenizer."""

from __future__ import annotations

import threading

from engine.backends.scripted import ScriptedBackend, SteppingClock, scripted_words
from engine.events import Done
from engine.request import GenerationRequest, SamplerSettings


def test_scripted_backend_rounds_follow_the_pattern_and_round_trip_text():
    clock = SteppingClock(step=0.5)
    backend = ScriptedBackend(replies=["one two three four five six"], accept_pattern=(2, 0, 9), clock=clock)
    backend.load()
    prompt = backend.encode_chat([{"role": "user", "content": "hi"}])
    assert backend.decode(prompt) == "<user>\nhi\n<assistant>\n"
    request = GenerationRequest(
        tuple(prompt), SamplerSettings(temperature=0.5), max_new_tokens=100, num_draft_tokens=3
    )
    events = list(backend.generate(request, threading.Event()))
    chunks, done = events[:-1], events[-1]
    assert [c.accepted for c in chunks] == [2, 0, 1]  # the last round is cut to the tokens left
    assert [c.origins for c in chunks][0] == (True, True, False)
    assert "".join(c.text for c in chunks) == "one two three four five six"
    assert isinstance(done, Done) and done.stop_reason == "end_of_turn"
    assert [c.t for c in chunks] == [1001.0, 1001.5, 1002.0]  # the first reading is the start


def test_scripted_backend_cancel_and_words():
    backend = ScriptedBackend(replies=[scripted_words(50)])
    backend.load()
    cancel = threading.Event()
    cancel.set()
    request = GenerationRequest((1,), SamplerSettings(), max_new_tokens=100, num_draft_tokens=2)
    events = list(backend.generate(request, cancel))
    assert len(events) == 1 and events[0].stop_reason == "cancelled"
    assert len(backend.encode(scripted_words(50))) == 50
