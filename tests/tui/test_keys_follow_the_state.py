"""The keys follow the chat's state, in the real app under Pilot: the footer says stop while a reply streams and
regenerate after, typing with a reply selected goes to the prompt, page up and down scroll the chat from the
prompt, and a server gone before the first token gives the prompt back.
"""

from __future__ import annotations

import threading

from textual.widgets._footer import FooterKey

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.errors import BackendError
from tests.support.isolation import isolated_config_and_data  # noqa: F401 (autouse)
from tests.support.tui import make_app, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.inspector import InspectorScreen

SMALL = (80, 24)


def footer_keys(app: SpecchatApp) -> list[str]:
    return [k.description for k in app.screen_stack[0].query(FooterKey)]


# --- the footer follows the state ---------------------------------------------------------------------------


async def test_footer_says_stop_while_streaming_and_regenerate_after():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=1))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.pause(0.2)
        assert "stop" not in footer_keys(app) and "regenerate" not in footer_keys(app)
        await send(pilot, "hello", wait=False)
        await wait_until(pilot, lambda: app.chat.generating and "stop" in footer_keys(app))
        assert "regenerate" not in footer_keys(app)
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        await wait_until(pilot, lambda: "regenerate" in footer_keys(app))
        assert "stop" not in footer_keys(app)


# --- typing with a reply selected goes to the prompt --------------------------------------------------------


async def test_typing_with_a_reply_selected_goes_to_the_prompt_and_fires_nothing():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("alt+up")
        assert app.focused is app.chat.chat_log.replies()[-1]
        copied = []
        app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
        await pilot.press(*"iii could you b?")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "iii could you b?"
        assert app.focused is app.chat.prompt
        assert not isinstance(app.screen, InspectorScreen) and copied == []
        # enter on a selected reply still opens its statistics (once)
        await pilot.press("alt+up", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        assert sum(isinstance(s, InspectorScreen) for s in app.screen_stack) == 1


# --- keyboard scrolling of the chat from the prompt ---------------------------------------------------------


async def test_pageup_and_pagedown_scroll_the_chat_from_the_prompt():
    app = make_app(ScriptedBackend(scripted_words(600)))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "a long one please")
        app.chat.prompt.set_text("typed")
        log = app.chat.chat_log
        await wait_until(pilot, lambda: log.max_scroll_y > 20 and log.scroll_y == log.max_scroll_y)
        bottom = log.scroll_y
        for key in ("pageup", "shift+pageup"):
            before = log.scroll_y
            await pilot.press(key)
            await wait_until(pilot, lambda before=before: log.scroll_y < before)
        assert app.focused is app.chat.prompt and app.chat.prompt.text == "typed"
        await pilot.press("pagedown", "shift+pagedown")
        await wait_until(pilot, lambda: log.scroll_y == bottom)


# --- remote: the server gone before the first token ---------------------------------------------------------


class DroppedBeforeFirstToken(ScriptedBackend):
    def generate(self, request, cancel):
        raise BackendError(
            "the server at http://127.0.0.1:9 dropped the connection (peer closed): "
            "the partial reply is kept; ask again when the server is back"
        )
        yield  # a generator, as the real backends are


async def test_a_server_gone_before_the_first_token_gives_the_prompt_back():
    app = make_app(DroppedBeforeFirstToken())
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?", wait=False)
        await wait_until(pilot, lambda: not app.chat.generating and app.chat.prompt.text)
        assert app.chat.prompt.text == "What is the capital of France?"
        assert app.chat.chat_log.messages() == [] and app.session.turns == []
        toasts = [str(n.message) for n in app._notifications]
        assert any("dropped the connection" in t for t in toasts)
        assert not any("partial reply is kept" in t for t in toasts)
