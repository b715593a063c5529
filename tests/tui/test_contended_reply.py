"""A reply where the model's CPU threads take every core this process may use (`tui.streaming.contended`): the UI's
work at a reply's start is drawn before the model starts, the first text waits a redraw interval like every
other, the header of the reply's start comes with that text, the status bar follows the text's redraws, and the
footer's keys change in place (tui/widgets/footer.py). On 2 cores each frame the UI draws while llama.cpp's two
threads compute stalls them both: a one-sentence answer ran at ~0.8x `specchat generate` before (docs/performance.md).
"""

from __future__ import annotations

import threading
import time

from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from engine.backends.base import usable_cpus
from engine.backends.scripted import ScriptedBackend
from tests.support.isolation import isolated_config  # noqa: F401 (autouse)
from tests.support.tui import make_app, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.chat_parts.reply import FIRST_TEXT_WAIT_S, STATUS_WITH_TEXT_S
from tui.widgets.message import ReplyMessage

SMALL = (80, 24)


def contended_app(backend: ScriptedBackend) -> SpecchatApp:
    """The app on `backend`, which says it computes with as many threads as this process has cores."""
    backend.threads = usable_cpus()
    return make_app(backend)


async def start_reply(pilot: Pilot, text: str) -> ReplyMessage:
    """Send `text` once the model is ready; the reply on screen once it streams."""
    app = pilot.app
    await wait_ready(pilot)
    await send(pilot, text, wait=False)
    await wait_until(pilot, lambda: app.chat.generating)
    return app.chat.lifecycle.streaming


def held_words(gate: threading.Event) -> ScriptedBackend:
    """A 40-word reply held after its first 3 rounds until `gate` is set."""
    return ScriptedBackend(
        replies=[" ".join(["word"] * 40)], tokens_per_s=400, gate=gate, gate_after_rounds=3
    )


class WatchedBackend(ScriptedBackend):
    """A scripted backend that notes what the screen had drawn when the model was asked for a reply."""

    def __init__(self, threads: int | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threads = threads
        self.app = None
        self.seen: list[dict] = []

    def generate(self, request, cancel):
        chat = self.app.chat
        reply = chat.lifecycle.streaming
        self.seen.append(
            {
                "reply_laid_out": reply is not None and reply.region.height > 0,
                "footer": [k.description for k in chat.query(FooterKey)],
            }
        )
        yield from super().generate(request, cancel)


async def test_where_the_model_takes_every_core_it_starts_once_the_reply_is_drawn():
    backend = WatchedBackend(usable_cpus(), replies=["Paris is the capital of France."] * 3)
    app = make_app(backend)
    backend.app = app
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        for text in ("Capital of France?", "Again?", "And once more?"):
            await send(pilot, text)
    assert len(backend.seen) == 3
    for seen in backend.seen:
        assert seen["reply_laid_out"], (
            seen
        )  # the reply's frame came before the model, not over its first tokens
        assert "stop" in seen["footer"] and "regenerate" not in seen["footer"], seen


async def test_where_the_model_takes_every_core_the_header_comes_with_the_first_text():
    gate = threading.Event()
    backend = held_words(gate)
    app = contended_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        reply = await start_reply(pilot, "words please")
        await wait_until(pilot, lambda: bool(reply.text))
        # Held mid-stream: its first text was drawn (by the timer, an interval after the chunk), header and all.
        assert "qa" in reply.header and ("K " in reply.header or "draft off" in reply.header), reply.header
        assert reply.header in plain(reply.query_one(".role"))
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)


async def test_the_status_bar_follows_the_text_while_a_reply_streams():
    gate = threading.Event()
    backend = held_words(gate)
    app = make_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        lifecycle = app.chat.lifecycle
        assert lifecycle.status_due()  # no reply: the timer keeps the status bar
        await send(pilot, "words please", wait=False)
        await wait_until(pilot, lambda: app.chat.generating and lifecycle.drawn_at > 0)
        assert not lifecycle.status_due()  # text just drawn, the status bar with it
        lifecycle.drawn_at = time.monotonic() - STATUS_WITH_TEXT_S
        assert lifecycle.status_due()  # a stall: the timer takes over again
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        assert lifecycle.status_due()


async def test_the_footer_keys_change_in_place_when_a_reply_starts_and_ends():
    gate = threading.Event()
    gate.set()
    backend = ScriptedBackend(replies=["One.", " ".join(["word"] * 40)], gate=gate, gate_after_rounds=1)
    app = make_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)

        def keys() -> dict[int, str]:
            return {id(k): k.description for k in app.chat.query(FooterKey)}

        await send(pilot, "first")  # the first reply adds a key (regenerate, where stop was)
        before = keys()
        assert "regenerate" in before.values()
        gate.clear()  # the second reply is held after its first round
        await send(pilot, "second", wait=False)
        await wait_until(pilot, lambda: "stop" in keys().values())
        during = keys()
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating and "regenerate" in keys().values())
        after = keys()
    # The same widgets throughout, their text swapped (a key added or dropped where the width allows): not every
    # key mounted anew (Footer.recompose).
    assert len(set(before) ^ set(during)) <= 1 and len(set(during) ^ set(after)) <= 1, (before, during, after)
    assert "regenerate" not in during.values()


async def test_a_long_prefill_shows_the_reply_start_without_waiting_for_the_text():
    """Where the model takes every core the start's header waits for the first text, but not through a prefill:
    the status timer shows it `FIRST_TEXT_WAIT_S` after the reply started."""
    backend = ScriptedBackend(replies=["Paris."], prefill_s=3.0)
    app = contended_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        reply = await start_reply(pilot, "Capital of France?")
        lifecycle = app.chat.lifecycle
        due = lifecycle.status_due()
        # Just started, the first text may come with it: not due. (On a busy machine the look itself may come later
        # than FIRST_TEXT_WAIT_S: CI read it due once, beside the other worker's model.)
        if time.monotonic() - lifecycle.started_at < FIRST_TEXT_WAIT_S:
            assert not due
        await wait_until(pilot, lambda: bool(reply.header), timeout=FIRST_TEXT_WAIT_S + 2.0)
        assert not reply.text and "qa" in reply.header  # still in its prefill
        assert "●" in app.chat.status_bar.plain  # the status bar says a reply runs
        await wait_until(pilot, lambda: not app.chat.generating)


async def test_escape_before_the_model_starts_gives_the_prompt_back():
    """Esc between the Enter and the model's start (the reply's first frame): the message comes back."""
    backend = ScriptedBackend(replies=["Paris."])
    app = contended_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        lifecycle = app.chat.lifecycle
        await lifecycle.send(
            "Capital of France?"
        )  # as Enter does: mounted, the model started after the frame
        assert lifecycle.generating and backend.requests == []
        assert lifecycle.stop()  # as esc does
        await wait_until(pilot, lambda: not app.chat.generating, timeout=3)
        assert app.chat.prompt.text == "Capital of France?"
        assert app.session.turns == [] and not app.chat.chat_log.messages() and backend.requests == []
