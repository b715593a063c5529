"""The stats inspector at 80x24 (issue 18): ctrl+s from the prompt, then End, shows the histogram.

The daily-use check pressed ctrl+s the moment a short reply looked done on screen, before its last token: the app
said "No finished reply to inspect yet" and End scrolled the chat. Now the inspector opens at once, says the reply
is still coming in, and fills in when it finishes, keeping an End pressed meanwhile.

Mutations checked by hand (each sent a test here red): the app's pending branch removed (the old "No finished
reply" path), no anchor after an End pressed while waiting, no End binding on the screen, a reply taken off the
chat still counted as streaming.
"""

from __future__ import annotations

import threading

from textual.containers import VerticalScroll
from textual.errors import NoWidget
from textual.geometry import Region

from engine.backends.scripted import ScriptedBackend
from tests.support.tui import make_app, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.inspector import NO_STATS, WAITING, InspectorScreen

SMALL = (80, 24)


def visible(app: SpecchatApp, widget) -> Region:
    geometry = app.screen.find_widget(widget)
    return geometry.region.intersection(geometry.clip).intersection(app.screen.region)


def histogram_on_screen(app: SpecchatApp) -> bool:
    if not isinstance(app.screen, InspectorScreen) or app.screen.stats is None:
        return False
    found = app.screen.query("#inspector-histogram")
    if not found:
        return False  # being recomposed with the figures
    histogram = found.first()
    try:
        return visible(app, histogram).height == histogram.region.height > 0
    except NoWidget:  # mounted, not laid out yet
        return False


async def test_ctrl_s_then_end_shows_the_histogram_after_one_reply():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?")
        assert app.focused is app.chat.prompt  # from the prompt, as a user types
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        await pilot.press("end")
        await wait_until(pilot, lambda: histogram_on_screen(app))
        assert "accepted drafts per round" in plain(app.screen.query_one("#inspector-histogram"))


async def test_ctrl_s_before_the_last_token_opens_the_inspector_and_fills_it_in():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=2))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?", wait=False)
        await wait_until(pilot, lambda: app.chat.generating and app.chat.chat_log.replies()[-1].text)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        screen = app.screen
        assert screen.stats is None and WAITING in plain(screen.query_one("#inspector-waiting"))
        assert not any("No finished reply" in n.message for n in app._notifications)
        await pilot.press("end")  # pressed while it waits: kept for when the figures arrive
        gate.set()
        await wait_until(pilot, lambda: histogram_on_screen(app))
        reply = app.chat.chat_log.replies()[-1]
        assert screen.stats is reply.stats and not app.chat.generating
        scroller = screen.query_one(VerticalScroll)
        assert scroller.scroll_y == scroller.max_scroll_y > 0
        await pilot.press("home")  # kept at the end only until the user scrolls
        await wait_until(pilot, lambda: scroller.scroll_y == 0)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, InspectorScreen))


async def test_an_inspector_waiting_on_a_reply_stopped_before_its_first_token_says_so():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=0))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Tell me a story", wait=False)
        await wait_until(pilot, lambda: app.chat.generating)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        app.chat.action_cancel_reply()  # esc here closes the inspector; the palette's "stop" does this
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        await wait_until(pilot, lambda: NO_STATS in plain(app.screen.query_one("#inspector-waiting")))
