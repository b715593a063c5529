"""ChatSession without any UI: preset choice, overrides, context trimming, cancel, regenerate, edit and resend."""

from __future__ import annotations

import threading

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.errors import BackendError, SpecchatError, UserError
from engine.events import Chunk, ContextTrimmed, ReplyFailed, ReplyFinished, ReplyStarted
from engine.presets import load_presets
from engine.session import ChatSession


def make_session(backend: ScriptedBackend, **settings) -> ChatSession:
    session = ChatSession(Settings(**settings), backend=backend, presets=load_presets(None))
    session.load()
    return session


def collect(session: ChatSession, text: str, cancel: threading.Event | None = None):
    events: list[object] = []
    result = session.send(text, events.append, cancel or threading.Event())
    return result, events


def test_auto_mode_routes_and_records_reason():
    session = make_session(ScriptedBackend("Paris is the capital."))
    result, events = collect(session, "What is the capital of France?")
    started = next(e for e in events if isinstance(e, ReplyStarted))
    assert started.auto and started.preset == "qa"
    assert started.router_reason
    assert isinstance(result, ReplyFinished)
    assert result.text == "Paris is the capital."
    assert result.stats.preset == "qa"
    assert result.stats.router_reason == started.router_reason
    assert [t.role for t in session.turns] == ["user", "assistant"]


def test_fixed_preset_sets_k_and_sampler_of_the_request():
    backend = ScriptedBackend("def f(): pass")
    session = make_session(backend)
    session.set_mode("creative")
    collect(session, "Fix this bug in my python function")
    request = backend.requests[-1]
    creative = session.presets["creative"]
    assert request.num_draft_tokens == creative.k
    assert request.sampler.temperature == creative.temperature
    assert request.sampler.ramp_tokens == creative.ramp_tokens
    assert request.max_new_tokens == creative.max_new_tokens


def test_unknown_mode_is_a_clear_error():
    session = make_session(ScriptedBackend("x"))
    with pytest.raises(SpecchatError, match="unknown preset 'fast'"):
        session.set_mode("fast")


def test_overrides_replace_k_and_turn_the_ramp_off():
    backend = ScriptedBackend("ok")
    session = make_session(backend, preset="creative")
    session.set_overrides(k=2, temperature=0.0)
    collect(session, "Write a poem")
    request = backend.requests[-1]
    assert request.num_draft_tokens == 2
    assert request.sampler.temperature == 0.0
    assert request.sampler.ramp_tokens == 0


def test_drafting_off_reports_none_not_zero_percent():
    backend = ScriptedBackend("one two three", draft_mode="none")
    session = make_session(backend)
    result, _ = collect(session, "hello there")
    assert backend.requests[-1].effective_k == 0
    assert result.stats.draft_mode == "none"
    assert result.stats.acceptance_rate is None


def test_stats_follow_the_scripted_rounds():
    # 12 word tokens; K=5 (qa); accept pattern 3,1,4,0,... -> rounds of 4,2,5,1 tokens
    backend = ScriptedBackend(" ".join(f"w{i}" for i in range(12)), accept_pattern=(3, 1, 4, 0))
    session = make_session(backend, preset="qa")
    result, events = collect(session, "question?")
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert [len(c.token_ids) for c in chunks] == [4, 2, 5, 1]
    stats = result.stats
    assert stats.new_tokens == 12
    assert stats.rounds == 4
    assert stats.accepted_tokens == 8
    assert stats.drafted_tokens == 20
    assert stats.acceptance_rate == pytest.approx(8 / 20)
    assert stats.mean_accepted_length == pytest.approx(3.0)
    assert stats.acceptance_histogram == [1, 1, 0, 1, 1]
    assert result.origins == tuple(o for c in chunks for o in c.origins)
    assert session.live.new_tokens == 12


def test_context_is_trimmed_oldest_first_and_said():
    long_reply = " ".join(f"tok{i}" for i in range(150))
    backend = ScriptedBackend(long_reply, max_context=512)
    session = make_session(backend, preset="qa", max_context=512)
    events = []
    for i in range(4):
        events += collect(session, f"question number {i} " + "padding " * 20)[1]
    result, last = collect(session, "the last question")
    trimmed = [e for e in events + last if isinstance(e, ContextTrimmed)]
    assert trimmed, "expected a ContextTrimmed event"
    assert sum(e.dropped_turns for e in trimmed) == session.context_start >= 2
    assert all(e.prompt_tokens + min(512 // 2, 512) <= 512 for e in trimmed)
    assert isinstance(result, ReplyFinished)
    # The trimmed turns stay in the conversation (on screen, in the store); the model sees from context_start.
    assert "question number 0" in session.turns[0].content
    seen = session.context_turns
    assert seen[0].role == "user" and "question number 0" not in seen[0].content
    assert session.turns[-2].content == "the last question"
    sent = [m["content"] for m in session.backend.requests[-1].messages]
    assert not any("question number 0" in text for text in sent)  # what the model got: the kept turns only


def test_message_longer_than_the_context_fails_and_keeps_nothing_half_done():
    backend = ScriptedBackend("x", max_context=256)
    session = make_session(backend, max_context=256)
    result, events = collect(session, "word " * 400)
    assert isinstance(result, ReplyFailed)
    assert "too long" in result.message
    assert session.turns == []


def test_cancel_before_any_token_puts_the_prompt_back():
    cancel = threading.Event()
    cancel.set()
    session = make_session(ScriptedBackend("never sent"))
    result, _ = collect(session, "hello", cancel)
    assert isinstance(result, ReplyFinished) and result.cancelled
    assert result.text == ""
    assert session.turns == []


def test_cancel_mid_reply_keeps_partial_text_marked_cancelled():
    gate = threading.Event()
    backend = ScriptedBackend(" ".join(f"w{i}" for i in range(40)), gate=gate, gate_after_rounds=2)
    session = make_session(backend, preset="qa")
    cancel = threading.Event()
    events: list[object] = []

    def on_event(event: object) -> None:
        events.append(event)
        if sum(isinstance(e, Chunk) for e in events) == 2:
            cancel.set()

    result = session.send("go", on_event, cancel)
    assert isinstance(result, ReplyFinished) and result.cancelled
    assert result.text and result.stats.stop_reason == "cancelled"
    assert session.turns[-1].cancelled and session.turns[-1].content == result.text


def test_regenerate_and_edit_resend():
    backend = ScriptedBackend(["first reply", "second reply"])
    session = make_session(backend)
    collect(session, "hello")
    result = session.regenerate(lambda e: None, threading.Event())
    assert result.text == "second reply"
    assert [t.content for t in session.turns] == ["hello", "second reply"]
    assert session.pop_last_exchange() == "hello"
    assert session.turns == []
    with pytest.raises(SpecchatError):
        session.regenerate(lambda e: None, threading.Event())


def test_empty_message_is_refused():
    session = make_session(ScriptedBackend("x"))
    with pytest.raises(SpecchatError, match="empty"):
        session.send("  \n", lambda e: None, threading.Event())


def test_system_prompt_is_rendered_first():
    backend = ScriptedBackend("x")
    session = make_session(backend, system_prompt="Be terse.")
    collect(session, "hi")
    prompt = backend.decode(list(backend.requests[-1].prompt_ids))
    assert prompt.startswith("<system>\nBe terse.")


def test_a_load_failure_passes_through_the_session_as_it_is():
    session = ChatSession(Settings(), backend=ScriptedBackend(load_error="model folder not found: /x"))
    with pytest.raises(BackendError, match="^model folder not found: /x$") as caught:
        session.load()
    assert not isinstance(caught.value, SpecchatError)  # the engine's own error, not re-wrapped


def test_a_titled_error_keeps_its_title_and_a_model_path_from_the_environment_names_its_source(
    tmp_path, monkeypatch
):
    class LostGpu(ScriptedBackend):
        def load(self, progress=None) -> None:
            raise BackendError("the GPU went away: load the model again", title="Model not loaded")

    session = ChatSession(Settings(), backend=LostGpu("x"))
    with pytest.raises(BackendError, match="^the GPU went away") as caught:
        session.load()
    assert caught.value.title == "Model not loaded"
    monkeypatch.setenv("SPECCHAT_MODEL", str(tmp_path))
    session = ChatSession(Settings(model=tmp_path), backend=LostGpu("x"))
    with pytest.raises(BackendError, match="^SPECCHAT_MODEL: the GPU went away") as caught:
        session.load()
    assert caught.value.title == "Model not loaded"


def test_send_refuses_an_empty_message_at_once():
    session = make_session(ScriptedBackend("x"))
    with pytest.raises(SpecchatError):
        session.send(" ", lambda e: None, threading.Event())
    assert session.turns == []


def test_requests_carry_k_mode_tuning_key_and_the_logged_acceptance(tmp_path):
    from engine.storage import metrics

    backend = ScriptedBackend("def f(): pass")
    session = make_session(backend, data_dir=tmp_path)
    info = session.info
    row = {
        "timestamp": 1.0,
        "preset": "code",
        "model": info.model,
        "draft": info.draft_model or info.draft_mode,
        "backend": info.backend,
        "drafted_tokens": 12,
        "per_position_acceptance": [0.9, 0.6],
    }
    metrics.append(tmp_path / metrics.METRICS_NAME, row)
    session.set_mode("code")
    collect(session, "Fix this bug in my python function")
    request = backend.requests[-1]
    assert (request.k_mode, request.tuning_key) == ("adaptive", "code")
    assert request.acceptance_prior == pytest.approx((0.9, 0.6))
    session.set_mode("qa")
    collect(session, "What is a cache?")
    assert backend.requests[-1].acceptance_prior == ()  # nothing logged for qa
    session.set_overrides(k_mode="fixed")
    collect(session, "What is a page?")
    assert backend.requests[-1].k_mode == "fixed"


# --- another model or draft for the same conversation (issue 9) ------------------------------------------------


@pytest.mark.slow
def test_reload_swaps_the_backend_keeps_the_turns_and_frees_the_old_one(
    tiny_model_dir, tiny_model_dir_other_vocab, tmp_path
):
    settings = Settings(model=tiny_model_dir, backend="transformers", max_context=512, data_dir=tmp_path)
    session = ChatSession(settings, presets=load_presets(None), save=True)
    session.load()
    session.set_overrides(max_new_tokens=4)
    session.send("first", lambda e: None, threading.Event())
    old = session.backend
    info = session.reload(str(tiny_model_dir_other_vocab), "none")
    assert info.model == tiny_model_dir_other_vocab.name and info.draft_mode == "none"
    assert session.backend is not old and old.target is None  # closed: its memory is given back
    assert session.settings.draft == "none" and session.model_dir == str(tiny_model_dir_other_vocab)
    assert [t.role for t in session.turns] == ["user", "assistant"]
    assert session.context_used == len(session.backend.encode_chat(session.messages(session.turns)))
    chat = session.recorder.store.chat(session.chat_id)
    assert (chat.model, chat.draft) == (str(tiny_model_dir_other_vocab), "none")


@pytest.mark.slow
def test_a_failed_reload_changes_nothing(tiny_model_dir, tiny_model_dir_other_vocab, tmp_path):
    settings = Settings(model=tiny_model_dir, backend="transformers", max_context=512)
    session = ChatSession(settings, presets=load_presets(None))
    session.load()
    backend, info, before = session.backend, session.info, session.settings
    for model, draft, why in (
        (tmp_path / "nowhere", "ngram", "model: .*nowhere does not exist"),
        (tiny_model_dir, "bananas", "draft: .*bananas does not exist"),
        (tiny_model_dir, str(tiny_model_dir_other_vocab), "cannot draft for .*vocabulary size differs"),
    ):
        with pytest.raises(UserError, match=why):
            session.reload(model, draft)
        assert session.backend is backend and session.info == info and session.settings == before
        assert backend.target is not None  # still loaded
    session.active = object()  # a reply is being generated
    with pytest.raises(SpecchatError, match="a reply is being generated") as refused:
        session.reload(tiny_model_dir, "none")
    # the engine does not know the keys (the user may have remapped them)
    assert "esc" not in str(refused.value)
