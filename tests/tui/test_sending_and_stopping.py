"""Sending and stopping in the real app under Pilot at 80x24: a message sent while the model loads waits for it
(and comes back to the prompt when the load fails or esc takes it back), regenerate or esc before the first
token keeps what was there, the prompt's ctrl+e / ctrl+y while it holds text, a reply cut by max_new_tokens
marked truncated, and the context figure after an edited message is resent.

The test names keep the numbers of the problems issue 9 listed.
"""

from __future__ import annotations

import re
import threading

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import Preset
from engine.session import ChatSession
from tests.support.isolation import isolated_config  # noqa: F401 (autouse)
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.widgets.message import UserMessage

SMALL = (80, 24)


async def test_1_enter_while_loading_queues_the_message_and_sends_it_when_ready():
    app = make_app(ScriptedBackend(replies=["Paris."], load_delay_s=1.0))
    async with app.run_test(size=SMALL) as pilot:
        assert app.state == "loading"
        await send(pilot, "Capital of France?", wait=False)
        waiting = app.chat.chat_log.messages()
        assert len(waiting) == 1 and isinstance(waiting[0], UserMessage)
        assert "waiting" in plain(waiting[0].query_one(".role"))
        assert app.chat.prompt.text == ""
        assert not any("not ready" in n.message for n in app._notifications)
        await wait_until(pilot, lambda: len(app.session.turns) == 2 and not app.chat.generating, timeout=15)
        assert [t.content for t in app.session.turns] == ["Capital of France?", "Paris."]
        assert "waiting" not in plain(waiting[0].query_one(".role"))


async def test_1_a_waiting_message_goes_back_to_the_prompt_if_the_load_fails():
    app = make_app(ScriptedBackend(load_error="model folder /nope does not exist", load_delay_s=0.6))
    async with app.run_test(size=SMALL) as pilot:
        await send(pilot, "Are you there?", wait=False)
        await wait_until(pilot, lambda: app.state == "failed")
        await pilot.pause(0.1)
        assert not app.chat.chat_log.messages()
        assert app.chat.prompt.text == "Are you there?"


async def test_1_escape_takes_a_waiting_message_back_to_the_prompt():
    app = make_app(ScriptedBackend(load_delay_s=1.0))
    async with app.run_test(size=SMALL) as pilot:
        await send(pilot, "never mind", wait=False)
        assert app.chat.chat_log.messages()
        await pilot.press("escape")
        assert not app.chat.chat_log.messages() and app.chat.prompt.text == "never mind"
        await wait_ready(pilot)
        await pilot.pause(0.2)
        assert app.session.turns == [] and not app.chat.generating


async def test_8_regenerate_stopped_before_the_first_token_keeps_the_old_reply():
    gate = threading.Event()
    gate.set()
    app = make_app(ScriptedBackend(replies=["first answer", "second answer", "second answer"], gate=gate))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "question")
        gate.clear()
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.session.active is not None)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.generating)
        assert [(t.role, t.content) for t in app.session.turns] == [
            ("user", "question"),
            ("assistant", "first answer"),
        ]
        shown = [r.text for r in app.chat.chat_log.replies() if r.display]
        assert shown == ["first answer"]
        assert app.chat.prompt.text == ""
        gate.set()
        await pilot.press("ctrl+r")
        await wait_until(
            pilot, lambda: not app.chat.generating and app.session.turns[-1].content != "first answer"
        )
        assert [t.content for t in app.session.turns] == ["question", "second answer"]
        assert [r.text for r in app.chat.chat_log.replies()] == ["second answer"]


async def test_9_escape_during_prefill_stops_at_once_and_gives_the_prompt_back():
    app = make_app(ScriptedBackend(prefill_s=30.0))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "A long question", wait=False)
        await wait_until(pilot, lambda: app.session.active is not None)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.generating, timeout=3)
        assert app.chat.prompt.text == "A long question"
        assert app.session.turns == [] and not app.chat.chat_log.messages()


def test_9_a_cancel_before_the_reply_starts_never_reaches_the_backend():
    backend = ScriptedBackend()
    session = ChatSession(Settings(), backend=backend)
    session.load()
    cancel = threading.Event()
    cancel.set()
    result = session.send("hello", lambda _e: None, cancel)
    assert result.cancelled and result.text == ""
    assert backend.requests == [] and session.turns == []


async def test_12_ctrl_e_and_ctrl_y_edit_the_prompt_while_it_holds_text():
    app = make_app(ScriptedBackend(replies=["an answer"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "question")
        await pilot.press(*"hello world", "home", "ctrl+e")
        assert app.chat.prompt.cursor_location == (0, len("hello world"))
        assert app.chat.prompt.text == "hello world" and len(app.session.turns) == 2  # no "edit last"
        await pilot.press("ctrl+z")
        undone = app.chat.prompt.text
        assert undone != "hello world"
        app.copy_to_clipboard("untouched")
        await pilot.press("ctrl+y")
        assert app.chat.prompt.text == "hello world" and app.clipboard == "untouched"  # redo, no copy
        # An empty prompt hands the keys to the app: copy the last reply, edit the last message.
        app.chat.prompt.clear()
        await pilot.press("ctrl+y")
        assert app.clipboard == "an answer"
        await pilot.press("ctrl+e")
        # The message is being edited; the conversation stays as it was until the edit is sent (esc cancels).
        assert app.chat.prompt.text == "question" and app.chat.editing == 0 and len(app.session.turns) == 2


async def test_14_a_reply_cut_by_max_new_tokens_is_marked_truncated():
    presets = {"short": Preset(name="short", k=2, temperature=0.0, max_new_tokens=5)}
    session = ChatSession(Settings(preset="short"), backend=ScriptedBackend(), presets=presets)
    app = SpecchatApp(Settings(preset="short"), session=session)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "tell me everything")
        line = plain(app.chat.chat_log.replies()[-1].query_one(".stats"))
        assert "truncated" in line


async def test_14_ctx_is_updated_after_edit_last():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        assert not re.search(r"ctx 0/", status(app))
        used = re.search(r"ctx (\d+)/2048", status(app)).group(1)
        # The edited message replaces the old exchange: resent as it was, the context counts it once.
        await pilot.press("ctrl+e", "enter")
        await wait_until(pilot, lambda: not app.chat.generating and app.chat.editing is None)
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 2)
        assert re.search(r"ctx (\d+)/2048", status(app)).group(1) == used


async def test_a_streaming_reply_hands_the_interpreter_lock_back_quickly_and_restores_it_after():
    """While a reply streams the generation thread waits at most GIL_SWITCH_INTERVAL_S for the lock the UI thread
    holds (tui/streaming.py); after the reply the interpreter's own interval is back."""
    import sys

    from tui.streaming import GIL_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    assert before != GIL_SWITCH_INTERVAL_S
    seen: list[float] = []
    app = make_app(ScriptedBackend(replies=["one two three four five six seven eight"], tokens_per_s=20))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "count", wait=False)
        await wait_until(pilot, lambda: app.chat.generating)
        seen.append(sys.getswitchinterval())
        await wait_until(pilot, lambda: not app.chat.generating)
        seen.append(sys.getswitchinterval())
    assert seen == [GIL_SWITCH_INTERVAL_S, before]


async def test_what_would_change_the_conversation_waits_for_the_streaming_reply_and_says_so():
    """ctrl+n (the key), and the actions a key hides while a reply streams (the palette still offers them), say
    "wait" once each and leave the conversation alone."""
    from tui.keymap import key_for

    reply = " ".join(["word"] * 60)
    app = make_app(ScriptedBackend(replies=[reply], tokens_per_s=20), keymap={"reply.cancel": "ctrl+g"})
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "count", wait=False)
        await wait_until(pilot, lambda: app.chat.generating)
        chat = app.chat
        await pilot.press(key_for("chat.new", chat.keymap))
        await pilot.pause(0.1)
        for action in (chat.action_regenerate, chat.action_edit_last, chat.action_continue_reply):
            await action()
        await chat.action_page_variant(-1)
        await pilot.pause(0.1)  # notify posts a message to the app
        told = [n.message for n in app._notifications if n.message.startswith("Wait for the reply to finish")]
        assert chat.generating and len(told) == 5
        assert all(m.endswith("or press ctrl+g.") for m in told), told  # the stop key in force, remapped
        await wait_until(pilot, lambda: not chat.generating, timeout=15)
        assert [t.content for t in app.session.turns] == ["count", reply]


async def test_the_redraws_take_a_smaller_share_of_a_core_where_the_model_takes_them_all():
    """A backend computing with as many threads as this process has cores gets the contended UI budget; one
    that leaves a core free, or says nothing of threads, the usual one (tui/streaming.py)."""
    from engine.backends.base import usable_cpus
    from tui.streaming import CONTENDED_UI_BUDGET, UI_BUDGET

    budgets = []
    for threads in (usable_cpus(), None):
        backend = ScriptedBackend(replies=[" ".join(["word"] * 20)], tokens_per_s=20)
        backend.threads = threads
        app = make_app(backend)
        async with app.run_test(size=SMALL) as pilot:
            await wait_ready(pilot)
            await send(pilot, "count", wait=False)
            await wait_until(pilot, lambda app=app: app.chat.generating)
            budgets.append(app.chat.lifecycle._pace.budget)
            await wait_until(pilot, lambda app=app: not app.chat.generating)
    assert budgets == [CONTENDED_UI_BUDGET, UI_BUDGET]
