"""The chat as a daily tool (issue 9): one test per numbered problem, on the real app under Pilot.

Each test reproduces the problem as the issue describes it and checks what a user should see instead.
"""

from __future__ import annotations

import re
import threading

import pytest
from textual.errors import NoWidget
from textual.geometry import Region
from textual.widgets import Footer
from textual.widgets._footer import FooterKey
from textual.widgets._markdown import MarkdownFence, MarkdownParagraph
from textual.widgets._toast import Toast

from engine.backends.scripted import DEFAULT_REPLY, ScriptedBackend
from engine.config import Settings
from engine.presets import Preset
from engine.session import ChatSession
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.error import ErrorScreen
from tui.screens.help import HelpScreen
from tui.screens.inspector import InspectorScreen
from tui.widgets.message import DRAFT_STYLE, UserMessage

SMALL = (80, 24)
POEM = "The sea at night\nis dark and wide,\nthe moon a lamp\nupon the tide."


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    monkeypatch.delenv("SPECCHAT_MODEL", raising=False)


def visible(app: SpecchatApp, widget) -> Region:
    """The part of `widget` that is actually on screen (clipped by its scrolling parents and the screen)."""
    geometry = app.screen.find_widget(widget)
    return geometry.region.intersection(geometry.clip).intersection(app.screen.region)


# 1 ---------------------------------------------------------------------------------------------------------


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


# 2 ---------------------------------------------------------------------------------------------------------


async def test_2_toasts_stay_off_the_prompt_and_status_bar():
    app = make_app()
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await wait_ready(pilot)
        app.notify(
            "Model loaded: a toast long enough to wrap onto more than one line of the rack", timeout=30
        )
        await wait_until(pilot, lambda: any(t.region.height for t in app.screen.query(Toast)))
        for toast in app.screen.query(Toast):
            region = visible(app, toast)
            assert region.bottom <= SMALL[1] // 2
            assert not region.overlaps(visible(app, app.chat.prompt))
            assert not region.overlaps(visible(app, app.chat.status_bar))


# 3 ---------------------------------------------------------------------------------------------------------


async def test_3_reply_keeps_its_line_breaks_and_code_blocks():
    app = make_app(ScriptedBackend(replies=[POEM, DEFAULT_REPLY]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a short poem about the sea at night")
        poem = app.chat.chat_log.replies()[-1]
        paragraphs = poem.markdown.query(MarkdownParagraph)
        assert len(paragraphs) == 1
        assert paragraphs[0]._content.plain == POEM  # one line per line, not one run-on paragraph
        await send(pilot, "code please")
        code = app.chat.chat_log.replies()[-1]
        fences = code.markdown.query(MarkdownFence)
        assert len(fences) == 1 and fences[0].code == "def greet(name):\n    return f'hello {name}'"


async def test_3_the_user_message_keeps_its_line_breaks_too():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "line one\nline two")
        user = app.chat.chat_log.messages()[0]
        assert user.query_one(MarkdownParagraph)._content.plain == "line one\nline two"


# 4 ---------------------------------------------------------------------------------------------------------


async def _dialog_fits(app: SpecchatApp, pilot, screen_type) -> None:
    assert isinstance(app.screen, screen_type)
    await pilot.pause(0.2)
    dialog = app.screen.query_one(".dialog")
    hint = app.screen.query_one(".hint")
    assert visible(app, dialog) == dialog.region, "the dialog is cut by the screen"
    assert visible(app, hint).height == 1 and "esc close" in plain(hint)
    await pilot.press("end")
    await pilot.pause(0.2)
    last = list(app.screen.query(".dialog VerticalScroll > Static"))[-1]
    shown = visible(app, last)
    assert shown.height > 0 and shown.bottom == last.region.bottom, "End does not reach the last line"


async def test_4_help_and_inspector_fit_80x24_and_scroll_to_the_end():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a python function")
        await pilot.press("f5")
        await _dialog_fits(app, pilot, HelpScreen)
        await pilot.press("escape")
        await pilot.press("ctrl+s")
        await _dialog_fits(app, pilot, InspectorScreen)
        histogram = app.screen.query_one("#inspector-histogram")
        assert visible(app, histogram).height == histogram.region.height  # the whole histogram is on screen


# 5 ---------------------------------------------------------------------------------------------------------


async def test_5_status_bar_at_80_columns_drops_whole_fields_by_priority():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.press("f2")
        await send(pilot, "Write a python function")
        bar = status(app)
        assert len(bar) <= SMALL[0] - 2 and "…" not in bar
        for kept in ("code", "K 6", "accept ", "tok/s", "ctx "):
            assert kept in bar, kept
        assert "scripted·cpu" not in bar  # the backend goes first
        assert re.search(r"ctx \d+/2048( │|$)", bar)  # never cut mid-field


async def test_5_footer_at_80_columns_has_no_broken_words():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.pause(0.2)
        footer = app.screen_stack[0].query_one(Footer)
        for _ in range(20):
            try:
                regions = [(key, visible(app, key)) for key in footer.query(FooterKey)]
                break
            except NoWidget:  # the footer recomposed (a resize) between the query and the lookup: look again
                await pilot.pause(0.05)
        width = 0
        for key, region in regions:
            if region.width:
                assert region.width == key.region.width, f"{key.description} is cut"
                width += region.width
        assert width <= SMALL[0]


# 6 ---------------------------------------------------------------------------------------------------------


async def test_6_draft_colours_keep_the_markdown_rendering():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a python function")
        reply = app.chat.chat_log.replies()[-1]
        await pilot.press("f6")
        await pilot.pause(0.1)
        assert reply.markdown.display  # still Markdown: the fence and its highlighting stay
        assert len(reply.markdown.query(MarkdownFence)) == 1
        first = reply.markdown.query(MarkdownParagraph)[0]._content
        drafted = "".join(first.plain[s.start : s.end] for s in first.spans if str(s.style) == DRAFT_STYLE)
        # "Here is a" was drafted and accepted in round one; " small" is the target's own token.
        assert drafted.startswith("Here is a") and not drafted.startswith("Here is a small")
        await pilot.press("f6")
        await pilot.pause(0.1)
        first = reply.markdown.query(MarkdownParagraph)[0]._content
        assert not any(str(s.style) == DRAFT_STYLE for s in first.spans)


# 7 ---------------------------------------------------------------------------------------------------------


async def test_7_auto_mode_shows_auto_before_the_next_message():
    app = make_app(ScriptedBackend(replies=[POEM]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a short poem about the sea at night")
        assert "creative" in app.chat.chat_log.replies()[-1].header
        await pilot.press("f1")
        assert status(app).startswith("○ auto │ K – │ T – │")


# 8 ---------------------------------------------------------------------------------------------------------


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


# 9 ---------------------------------------------------------------------------------------------------------


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


# 10 --------------------------------------------------------------------------------------------------------


async def test_10_status_bar_and_stats_line_show_the_same_speed_with_ttft():
    app = make_app(ScriptedBackend(prefill_s=0.3, tokens_per_s=200))
    async with app.run_test(size=(150, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a python function")
        reply = app.chat.chat_log.replies()[-1]
        stats = reply.stats
        assert stats.ttft_s >= 0.3
        # Live figures at the last chunk are the message's figures: one definition, TTFT left out of tok/s.
        assert app.session.live.tokens_per_s == stats.decode_tokens_per_s
        assert app.session.live.ttft_s == stats.ttft_s
        speed = f"{stats.decode_tokens_per_s:.1f} tok/s"
        assert speed in plain(reply.query_one(".stats")) and speed in status(app)
        assert "ttft " in status(app) and "ttft " in plain(reply.query_one(".stats"))


# 11 --------------------------------------------------------------------------------------------------------


async def test_11_a_key_stolen_from_another_binding_is_an_error_and_defaults_apply():
    app = make_app(keymap={"preset.qa": "ctrl+q"})
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert any("preset.qa" in m and "app.quit" in m for m in errors), errors
        await pilot.press("f3")  # the default key still works: the bad keymap was not applied
        assert app.session.mode == "qa"
        assert app.is_running


async def test_11_an_invalid_key_name_is_an_error_and_never_shown():
    app = make_app(keymap={"preset.code": "banana key"})
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert any("preset.code" in m and "banana key" in m for m in errors), errors
        footer = app.screen_stack[0].query_one(Footer)
        assert not any("banana" in k.key_display for k in footer.query(FooterKey))
        await pilot.press("f2")
        assert app.session.mode == "code"


# 12 --------------------------------------------------------------------------------------------------------


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


# 13 --------------------------------------------------------------------------------------------------------


async def test_13_a_broken_config_opens_on_defaults_with_the_message_and_loads_the_model():
    message = "~/.config/specchat/config.toml: cache_mode: must be one of fp16, q8, q6, q4 (got 'q3')"
    app = SpecchatApp(Settings.model_construct(), backend=ScriptedBackend(), startup_error=message)
    async with app.run_test(size=SMALL) as pilot:
        await wait_until(
            pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-message")
        )
        assert "cache_mode: must be one of" in plain(app.screen.query_one("#error-message"))
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.state == "ready" and "model not loaded" not in status(app)
        assert "cache_mode" in plain(app.chat.chat_log.banner)
        await send(pilot, "hello")
        assert app.session.turns[-1].role == "assistant"


def test_13_a_bad_model_path_from_the_environment_names_specchat_model(tmp_path, monkeypatch):
    from engine.config import load_settings
    from engine.errors import UserError

    monkeypatch.setenv("SPECCHAT_MODEL", str(tmp_path / "no-such-model"))
    session = ChatSession(load_settings(backend="transformers"))
    with pytest.raises(UserError, match=r"^SPECCHAT_MODEL: .*no-such-model"):
        session.load()


# 14 --------------------------------------------------------------------------------------------------------


async def test_14_help_shows_keys_as_people_read_them():
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        text = plain(app.screen.query(".dialog Static")[1])
        assert "question_mark" not in text and "pgup / shift+pgup" in text
        assert re.search(r"^\s*f5 +on a selected reply: this help", text, re.M)
        assert re.search(r"^\s*enter +on a selected reply: statistics", text, re.M)
        assert re.search(r"on a selected reply: typed into the prompt", text, re.M)


async def test_14_a_reply_cut_by_max_new_tokens_is_marked_truncated():
    presets = {"short": Preset(name="short", k=2, temperature=0.0, max_new_tokens=5)}
    session = ChatSession(Settings(preset="short"), backend=ScriptedBackend(), presets=presets)
    app = SpecchatApp(Settings(preset="short"), session=session)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "tell me everything")
        line = plain(app.chat.chat_log.replies()[-1].query_one(".stats"))
        assert "truncated" in line


async def test_14_the_footer_shows_the_dialog_keys_while_a_dialog_is_open():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await pilot.pause(0.2)
        shown = [k.description for k in app.screen.query(FooterKey) if visible(app, k).width]
        assert "close" in shown and "regenerate" not in shown


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
