"""What the chat shows, in the real app under Pilot (most at 80x24): toasts off the prompt and the status bar,
replies and messages with their line breaks and code blocks, help and the inspector fitting the screen and
scrolling to their end, the status bar and the footer at 80 columns, draft colours over the Markdown, auto
mode, one speed in the status bar and the stats line, keys in the help as people read them, the dialog's keys
in the footer.

The test names keep the numbers of the problems issue 9 listed.
"""

from __future__ import annotations

import re

from textual.errors import NoWidget
from textual.geometry import Region
from textual.widgets import Footer
from textual.widgets._footer import FooterKey
from textual.widgets._markdown import MarkdownFence, MarkdownParagraph
from textual.widgets._toast import Toast

from engine.backends.scripted import DEFAULT_REPLY, ScriptedBackend
from tests.support.isolation import isolated_config  # noqa: F401 (autouse)
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.help import HelpScreen
from tui.screens.inspector import InspectorScreen
from tui.widgets.message import DRAFT_STYLE

SMALL = (80, 24)
POEM = "The sea at night\nis dark and wide,\nthe moon a lamp\nupon the tide."


def visible(app: SpecchatApp, widget) -> Region:
    """The part of `widget` that is actually on screen (clipped by its scrolling parents and the screen)."""
    geometry = app.screen.find_widget(widget)
    return geometry.region.intersection(geometry.clip).intersection(app.screen.region)


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


async def test_7_auto_mode_shows_auto_before_the_next_message():
    app = make_app(ScriptedBackend(replies=[POEM]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a short poem about the sea at night")
        assert "creative" in app.chat.chat_log.replies()[-1].header
        await pilot.press("f1")
        assert status(app).startswith("○ auto │ K – │ T – │")


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


async def test_14_the_footer_shows_the_dialog_keys_while_a_dialog_is_open():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await pilot.pause(0.2)
        shown = [k.description for k in app.screen.query(FooterKey) if visible(app, k).width]
        assert "close" in shown and "regenerate" not in shown
