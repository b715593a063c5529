"""Thinking replies: reasoning folded under one line, counted apart in the stats, left out of the context."""

from __future__ import annotations

import threading

from textual.widgets import Collapsible

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.reasoning import split_reasoning, thinking_end
from engine.session import ChatSession
from tests.support.isolation import isolated_config  # noqa: F401
from tests.support.tui import make_app, plain, send, wait_ready, wait_until
from tui.screens.inspector import InspectorScreen
from tui.widgets.message import ReplyMessage

THINKING_REPLY = (
    "<think>\nThe user says hello.\nI should greet back briefly.\n</think>\n\nHello! How can I help?"
)


def test_split_reasoning_shapes():
    split = split_reasoning(THINKING_REPLY)
    assert split.thinking == "The user says hello.\nI should greet back briefly."
    assert split.answer == "Hello! How can I help?"
    assert THINKING_REPLY[split.answer_start :] == split.answer
    assert THINKING_REPLY[split.thinking_start :].startswith(split.thinking)
    # The template opened the reasoning in the prompt: only the closing tag is in the reply.
    assert split_reasoning("plan it</think> Done.").thinking == "plan it"
    # Streaming: still thinking (a partial closing tag is held back), or not sure yet.
    assert split_reasoning("<think>step one</th") == split_reasoning("<think>step one</th")
    assert (
        split_reasoning("<think>step one</th").thinking == "step one"
        and not split_reasoning("<think>x").closed
    )
    assert split_reasoning("<thi").undecided
    plain_reply = split_reasoning("No reasoning <b>here</b>")
    assert not plain_reply.has_thinking and plain_reply.answer == "No reasoning <b>here</b>"
    assert thinking_end("plain") == 0 and thinking_end(THINKING_REPLY) == THINKING_REPLY.index("Hello")


def test_session_counts_thinking_tokens_apart_and_keeps_them_out_of_the_context():
    backend = ScriptedBackend(replies=[THINKING_REPLY, "Fine."], accept_pattern=(2, 0, 1))
    session = ChatSession(Settings(preset="qa"), backend=backend)
    session.load()
    result = session.send("hello", lambda _e: None, threading.Event())
    stats = result.stats
    reasoning_tokens = backend.encode(THINKING_REPLY[: THINKING_REPLY.index("Hello")])
    assert 0 < stats.thinking_tokens < stats.new_tokens
    # Chunks that start inside the reasoning are counted there: at most one round's worth more than its tokens.
    assert len(reasoning_tokens) <= stats.thinking_tokens <= len(reasoning_tokens) + 3
    assert 0 < stats.thinking_drafted_tokens < stats.drafted_tokens
    session.send("and you?", lambda _e: None, threading.Event())
    context = backend.decode(list(backend.requests[-1].prompt_ids))
    assert "Hello! How can I help?" in context and "greet back" not in context


async def test_reasoning_is_folded_under_one_line_and_expands():
    app = make_app(ScriptedBackend(replies=[THINKING_REPLY]))
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        reply = app.chat.chat_log.replies()[-1]
        folded = reply.query_one(Collapsible)
        assert folded.display and folded.collapsed
        assert folded.title == f"thinking · {reply.stats.thinking_tokens} tok · accept " + (
            f"{reply.stats.thinking_acceptance_rate * 100:.0f}%"
        )
        assert reply.markdown.source == "Hello! How can I help?"
        assert reply.thinking_markdown.source == "The user says hello.\nI should greet back briefly."
        assert f"(thinking {reply.stats.thinking_tokens})" in plain(reply.query_one(".stats"))
        await pilot.click(folded.query_one("CollapsibleTitle"))
        await pilot.pause(0.1)
        assert not folded.collapsed and reply.thinking_markdown.region.height > 0
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, InspectorScreen)
        fields = plain(app.screen.query_one("#inspector-fields"))
        assert "thinking tokens" in fields and "acceptance thinking / answer" in fields


async def test_a_reply_without_reasoning_shows_no_fold():
    app = make_app(ScriptedBackend(replies=["Just an answer."]))
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        reply = app.chat.chat_log.replies()[-1]
        assert not reply.query_one(Collapsible).display
        assert reply.markdown.source == "Just an answer." and reply.stats.thinking_tokens == 0


async def test_reasoning_streams_into_the_fold_before_the_answer():
    gate = threading.Event()
    app = make_app(
        ScriptedBackend(replies=[THINKING_REPLY], gate=gate, gate_after_rounds=2, accept_pattern=(1,))
    )
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds == 2)
        reply = app.chat.chat_log.replies()[-1]
        await wait_until(pilot, lambda: reply.thinking_markdown.source.startswith("The user"))
        assert reply.query_one(Collapsible).title.startswith("thinking…")
        assert reply.markdown.source == ""  # the answer has not begun
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        assert reply.markdown.source == "Hello! How can I help?"
        assert reply.query_one(Collapsible).title.startswith("thinking · ")


async def test_copy_takes_the_answer_without_the_reasoning():
    app = make_app(ScriptedBackend(replies=[THINKING_REPLY]))
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("ctrl+y")
        assert app.clipboard == "Hello! How can I help?"


async def test_a_reply_that_ends_right_after_its_reasoning_opens_finishes():
    """The reasoning's stream is made but never written, then stopped in the same handler, with no turn of the
    event loop between: its task was cancelled before its first step, and stopping it raised CancelledError into
    the app's message loop (the UI froze; CI saw it under load as a pilot timeout)."""
    app = make_app()
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        reply = ReplyMessage(highlight=False)
        await app.chat.chat_log.mount(reply)
        await reply.append_runs([("<think>\n", False)])
        await reply.finish(THINKING_REPLY, None)
        assert reply.markdown.source == "Hello! How can I help?"
        assert reply.thinking_markdown.source == "The user says hello.\nI should greet back briefly."
