"""The real app under Pilot on the scripted backend: streaming, presets, cancel, regenerate, copy, keymap, failures."""

from __future__ import annotations

import re
import threading

import pytest
from textual.widgets.markdown import MarkdownBlock

from engine.backends.scripted import DEFAULT_REPLY, ScriptedBackend
from engine.config import Settings
from engine.errors import UserError
from engine.presets import Preset
from engine.session import ChatSession
from tests.support.isolation import isolated_config  # noqa: F401
from tests.support.tui import SIZE, make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.error import ErrorScreen
from tui.screens.help import HelpScreen
from tui.screens.inspector import InspectorScreen
from tui.screens.presets import PresetPickerScreen
from tui.widgets.message import DRAFT_STYLE, ReplyMessage, UserMessage


def drafted_by_block(reply: ReplyMessage) -> list[str]:
    """Per rendered Markdown block with text, the characters shown in the draft colour."""
    out = []
    for block in reply.markdown.query(MarkdownBlock):
        content = block._content
        if content.plain:
            out.append(
                "".join(content.plain[s.start : s.end] for s in content.spans if str(s.style) == DRAFT_STYLE)
            )
    return out


def stats_text(reply: ReplyMessage) -> str:
    return plain(reply.query_one(".stats"))


async def test_reply_streams_into_log_with_stats_line_and_status():
    app = make_app(ScriptedBackend(tokens_per_s=400))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.state == "ready"
        await send(pilot, "Write a python function that greets")
        reply = app.chat.chat_log.replies()[-1]
        assert reply.text == DEFAULT_REPLY
        assert reply.markdown.source == DEFAULT_REPLY
        line = stats_text(reply)
        assert re.search(
            r"^18 tok · [\d.]+ tok/s · ttft \d+ ms · accept \d+% · τ [\d.]+ · K 6 · T 0.20 · auto → code$",
            line,
        )
        assert "auto → code" in reply.header  # the router's choice and reason head the reply
        bar = status(app)
        assert re.search(r"accept \d+%", bar)
        # Auto mode between replies: the next reply's preset is not chosen yet (the stats line keeps the last).
        assert bar.startswith("○ auto │") and "scripted·cpu" in bar and "ctx " in bar
        assert len(app.query(UserMessage)) == 1


async def test_status_bar_is_live_while_streaming():
    gate = threading.Event()
    backend = ScriptedBackend(gate=gate, gate_after_rounds=2)
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Explain what a list is", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds == 2)
        # The bar redraws on a timer: it may still show round 1 (3 of 5, 60%) until the next tick.
        # Two rounds with K=5 accepted 3 and 1 drafts of 10; the gate holds the reply there.
        await wait_until(pilot, lambda: "accept 40%" in app.chat.status_bar.plain)
        bar = app.chat.status_bar.plain
        assert bar.startswith("● ")
        assert "auto → qa" in bar and "K 5" in bar
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        assert app.chat.status_bar.plain.startswith("○ ")


async def test_function_keys_switch_preset_in_status_bar_at_once():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.prompt.has_focus  # priority bindings work while typing
        await pilot.press("f4")
        assert app.session.mode == "creative"
        assert app.chat.status_bar.plain.startswith("○ creative │ K 3 │ T 0.90")
        await pilot.press("f2")
        assert app.chat.status_bar.plain.startswith("○ code │ K 6 │ T 0.20")
        await pilot.press("f3")
        assert app.chat.status_bar.plain.startswith("○ qa │ K 5 │ T 0.50")
        await pilot.press("f1")
        assert app.chat.status_bar.plain.startswith("○ auto │")


async def test_preset_switch_applies_to_next_reply():
    backend = ScriptedBackend()
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f4")
        await send(pilot, "Write a python function")  # the router would say code; the hand choice wins
        assert backend.requests[-1].num_draft_tokens == 3
        line = stats_text(app.chat.chat_log.replies()[-1])
        assert line.endswith("K 3 · T 0.90 · creative")


async def test_draft_off_is_said_not_zero_percent():
    presets = {
        "plain": Preset(name="plain", description="no drafting", k=4, temperature=0.3, drafting=False),
    }
    backend = ScriptedBackend()
    session = ChatSession(Settings(preset="plain"), backend=backend, presets=presets)
    app = SpecchatApp(Settings(preset="plain"), session=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "K off" in status(app)
        await send(pilot, "hello")
        assert backend.requests[-1].effective_k == 0
        assert "draft off" in status(app)
        assert "0%" not in status(app)
        assert "draft off" in stats_text(app.chat.chat_log.replies()[-1])


async def test_escape_cancels_and_keeps_partial_text():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=2))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Tell me something", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds == 2)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.generating)
        reply = app.chat.chat_log.replies()[-1]
        assert reply.text and DEFAULT_REPLY.startswith(reply.text) and reply.text != DEFAULT_REPLY
        assert reply.cancelled and stats_text(reply).endswith("cancelled")
        assert app.session.turns[-1].cancelled
        assert app.chat.prompt.text == ""


async def test_escape_before_any_text_puts_the_prompt_back():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is a monad?", wait=False)
        await wait_until(pilot, lambda: app.session.active is not None)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.generating)
        assert app.chat.prompt.text == "What is a monad?"
        assert not app.chat.chat_log.messages()
        assert app.session.turns == []


async def test_regenerate_replaces_the_last_reply():
    backend = ScriptedBackend(replies=["first answer", "second answer"])
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "question")
        await pilot.press("ctrl+r")
        await wait_until(
            pilot, lambda: not app.chat.generating and app.chat.chat_log.replies()[-1].text == "second answer"
        )
        assert [r.text for r in app.chat.chat_log.replies()] == ["second answer"]
        assert [t.content for t in app.session.turns] == ["question", "second answer"]


async def test_edit_and_resend_last_message():
    backend = ScriptedBackend(replies=["one", "two"])
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first try")
        await pilot.press("ctrl+e")
        assert app.chat.prompt.text == "first try"
        # Editing hides nothing: the exchange stays until the edit is sent (esc would cancel it).
        assert len(app.chat.chat_log.messages()) == 2 and len(app.session.turns) == 2
        await pilot.press("end", *" again", "enter")
        await wait_until(pilot, lambda: not app.chat.generating and app.session.turns[-1].content == "two")
        assert [t.content for t in app.session.turns] == ["first try again", "two"]
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 2)


async def test_copy_reply_and_its_last_code_block():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "code please")
        await pilot.press("ctrl+y")
        assert app.clipboard == DEFAULT_REPLY
        await pilot.press("ctrl+b")
        assert app.clipboard == "def greet(name):\n    return f'hello {name}'"


async def test_select_reply_with_keys_and_mouse_then_inspect():
    app = make_app(ScriptedBackend(replies=["alpha", "beta"]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        first, second = app.chat.chat_log.replies()
        await pilot.press("alt+up")
        assert app.focused is second
        await pilot.press("alt+up")  # the message "two": alt+up steps through every message
        assert isinstance(app.focused, UserMessage) and app.focused.text == "two"
        await pilot.press("alt+up")
        assert app.focused is first
        await pilot.press("ctrl+y")
        assert app.clipboard == "alpha"
        await pilot.press("enter")
        assert isinstance(app.screen, InspectorScreen)
        assert app.screen.stats is first.stats
        await pilot.press("escape")
        assert not isinstance(app.screen, InspectorScreen)
        await pilot.click(second)
        assert app.focused is second
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, InspectorScreen) and app.screen.stats is second.stats


async def test_inspector_shows_every_figure():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a python function")
        await pilot.press("ctrl+s")
        screen = app.screen
        assert isinstance(screen, InspectorScreen)
        fields = plain(screen.query_one("#inspector-fields"))
        for label in ("predicted speedup", "prompt tokens", "cached", "acceptance rate", "router", "α"):
            assert label in fields
        positions = plain(screen.query_one("#inspector-positions"))
        assert "pos  1" in positions and "pos  6" in positions
        histogram = plain(screen.query_one("#inspector-histogram"))
        assert "accepted" in histogram


async def test_draft_highlighting_colours_accepted_text():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "code")
        reply = app.chat.chat_log.replies()[-1]
        await pilot.press("f6")
        assert reply.markdown.display  # the colours go on top of the Markdown rendering
        accepted = sum(1 for t in app.session.turns[-1].origins if t)
        assert accepted == reply.stats.accepted_tokens
        paragraph, fence = drafted_by_block(reply)[0], drafted_by_block(reply)[1]
        # "Here is a" was drafted-and-accepted in round one; " small" is the target's own token.
        assert paragraph.startswith("Here is a") and not paragraph.startswith("Here is a small")
        assert fence  # code blocks are coloured too, keeping their syntax highlighting
        await pilot.press("f6")
        assert reply.markdown.display and not any(drafted_by_block(reply))


async def test_command_palette_offers_presets():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"preset: use creative")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.session.mode == "creative")
        assert "creative" in status(app)


async def test_preset_picker_lists_user_presets():
    presets = {
        "code": Preset(name="code", k=6, temperature=0.2),
        "terse": Preset(name="terse", description="mine", k=2, temperature=0.1, source="~/terse.toml"),
    }
    session = ChatSession(Settings(), backend=ScriptedBackend(), presets=presets)
    app = SpecchatApp(Settings(), session=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, PresetPickerScreen)
        await pilot.press("down", "down", "enter")  # auto, code, terse
        assert app.session.mode == "terse"
        assert status(app).startswith("○ terse │ K 2 │ T 0.10")


async def test_keymap_remap_from_settings():
    app = make_app(keymap={"preset.creative": "f8", "reply.cancel": "ctrl+g", "no.such": "f9"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f4")
        assert app.session.mode == "auto"
        await pilot.press("f8")
        assert app.session.mode == "creative"
        assert any("no.such" in n.message for n in app._notifications)
        await pilot.press("f5")
        assert isinstance(app.screen, HelpScreen)
        help_text = plain(app.screen.query(".dialog Static")[1])
        assert "f8" in help_text and "ctrl+g" in help_text


async def test_remapped_cancel_key_stops_a_reply():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=1), keymap={"reply.cancel": "ctrl+g"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds == 1)
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: not app.chat.generating)
        assert app.chat.chat_log.replies()[-1].cancelled


async def test_load_failure_is_shown_in_app_and_app_stays_open():
    message = "model folder ~/models/missing does not exist: set `model` in config.toml"
    app = make_app(ScriptedBackend(load_error=message))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state == "failed")
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert plain(app.screen.query_one("#error-message")) == message
        await pilot.press("enter")
        assert not isinstance(app.screen, ErrorScreen)
        assert message in plain(app.chat.chat_log.banner)
        assert "model not loaded" in status(app)
        await send(pilot, "hello?", wait=False)
        await pilot.pause(0.1)
        assert not app.chat.chat_log.messages() and app.is_running
        assert any(message in n.message for n in app._notifications)


class TitledError(UserError):
    title = "llama.cpp crashed"


@pytest.mark.parametrize(
    ("error", "title", "message"),
    [
        (TitledError("signal 11 in the trial decode"), "llama.cpp crashed", "signal 11 in the trial decode"),
        (RuntimeError("a bug"), "The model did not load", "RuntimeError: a bug"),
    ],
    ids=["user-error-with-title", "unexpected"],
)
async def test_every_failed_load_takes_the_one_path(monkeypatch, error, title, message):
    # A user error keeps its own title; a bug is named by its type; either way: banner, dialog, the typed
    # message back in the prompt, and the app open.
    backend = ScriptedBackend(load_delay_s=0.5)
    app = make_app(backend)

    def load(progress=None):
        backend.load(progress)
        raise error

    monkeypatch.setattr(app.session, "load", load)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "are you there?", wait=False)
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert app.state == "failed" and app.load_error == message
        assert plain(app.screen.query_one("#error-message")) == message
        assert title in plain(app.screen.query_one(".title"))
        assert f"{title}: {message}" in plain(app.chat.chat_log.banner)
        assert app.chat.prompt.text == "are you there?"
        await wait_until(pilot, lambda: not app.chat.chat_log.messages())
        await pilot.press("enter")
        assert app.is_running and not isinstance(app.screen, ErrorScreen)


async def test_generation_failure_is_reported_on_the_reply():
    class BrokenBackend(ScriptedBackend):
        def generate(self, request, cancel):
            yield from []
            raise RuntimeError("CUDA error: device-side assert")

    app = make_app(BrokenBackend())
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello", wait=False)
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert "device-side assert" in plain(app.screen.query_one("#error-message"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.chat.generating and app.chat.chat_log.replies()[-1].failed)


async def test_new_chat_clears_log_and_session():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("ctrl+n")
        assert not app.chat.chat_log.messages() and app.session.turns == []


async def test_ctrl_j_inserts_newline_and_enter_sends():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press(*"line one", "ctrl+j", *"line two")
        assert app.chat.prompt.text == "line one\nline two"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.chat.generating and app.session.turns)
        assert app.session.turns[0].content == "line one\nline two"


async def test_highlight_toggled_mid_reply_keeps_markdown_complete():
    app = make_app(ScriptedBackend(tokens_per_s=12))  # 18 tokens: 1.5 s of streaming
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait=False)
        # Not gated: the reply streams on, and a loaded machine's poll may first see round 2 (CI timed out on == 1).
        await wait_until(pilot, lambda: app.session.live.rounds >= 1)
        await pilot.press("f6")
        reply = app.chat.chat_log.replies()[-1]
        await wait_until(pilot, lambda: app.session.live.rounds >= 2 and len(reply.text) > 12)
        assert app.chat.generating and reply.markdown.display
        await wait_until(pilot, lambda: any(drafted_by_block(reply)))  # coloured while it streams
        await pilot.press("f6")
        assert app.chat.generating and not any(drafted_by_block(reply))
        await pilot.press("f6")
        await wait_until(pilot, lambda: not app.chat.generating)
        assert reply.markdown.source == DEFAULT_REPLY
        assert drafted_by_block(reply)[0].startswith("Here is a")
