"""Snapshots of the main screen, help and the inspector, at 110x34 and at 80x24 (scripted backend, frozen timings).

Regenerate after an intended visual change with `pytest tests/tui/test_snapshots.py --snapshot-update`
and look at the report before committing.
"""

from __future__ import annotations

import dataclasses
import threading

from engine.backends.scripted import ScriptedBackend, SteppingClock
from engine.config import Settings
from tests.support.isolation import isolated_config  # noqa: F401
from tests.support.tui import send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.widgets.message import ReplyMessage

SNAPSHOT_SIZE = (110, 34)


def frozen(stats):
    """Wall-clock figures replaced by fixed ones; everything else is already deterministic."""
    return dataclasses.replace(stats, ttft_s=0.125, total_s=0.5, prefill_tokens_per_s=800.0)


async def settle(pilot) -> None:
    app = pilot.app
    app.clear_notifications()
    app.chat.prompt.cursor_blink = False
    app.chat.refresh_status()  # the bar redraws on a timer; a loaded machine may not have ticked yet
    await pilot.pause(0.3)


def test_main_screen_mid_reply(snap_compare):
    gate = threading.Event()
    backend = ScriptedBackend(gate=gate, gate_after_rounds=4, clock=SteppingClock(step=0.02))
    app = SpecchatApp(Settings(), backend=backend)

    async def run_before(pilot) -> None:
        await wait_ready(pilot)
        await send(pilot, "Write a python function that greets someone", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds == 4)
        reply = app.chat.chat_log.replies()[-1]
        await wait_until(pilot, lambda: not app.chat.lifecycle.buffer.has_pending and len(reply.text) > 20)
        app.session.live.tokens_per_s = 250.0  # the wall-clock figures on screen
        app.session.live.ttft_s = 0.125
        await settle(pilot)

    try:
        assert snap_compare(app, terminal_size=SNAPSHOT_SIZE, run_before=run_before)
    finally:
        gate.set()


def test_inspector(snap_compare):
    backend = ScriptedBackend(clock=SteppingClock(step=0.02))
    app = SpecchatApp(Settings(), backend=backend)

    async def run_before(pilot) -> None:
        await wait_ready(pilot)
        await send(pilot, "Write a python function that greets someone")
        reply: ReplyMessage = app.chat.chat_log.replies()[-1]
        stats = frozen(reply.stats)
        await reply.finish(reply.text, stats)
        app.session.last_stats = stats
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SNAPSHOT_SIZE, run_before=run_before)


# --- the smallest supported terminal: 80x24 -------------------------------------------------------------------

SMALL_SIZE = (80, 24)


async def _answered_with_frozen_stats(pilot, text: str = "Write a python function that greets someone"):
    app = pilot.app
    await wait_ready(pilot)
    await send(pilot, text)
    reply: ReplyMessage = app.chat.chat_log.replies()[-1]
    stats = frozen(reply.stats)
    await reply.finish(reply.text, stats)
    app.session.last_stats = stats
    app.chat.refresh_status()
    await settle(pilot)
    return reply


def test_main_screen_80x24(snap_compare):
    app = SpecchatApp(Settings(), backend=ScriptedBackend(clock=SteppingClock(step=0.02)))

    async def run_before(pilot) -> None:
        await _answered_with_frozen_stats(pilot)

    assert snap_compare(app, terminal_size=SMALL_SIZE, run_before=run_before)


def test_help_80x24(snap_compare):
    app = SpecchatApp(Settings(), backend=ScriptedBackend(clock=SteppingClock(step=0.02)))

    async def run_before(pilot) -> None:
        await wait_ready(pilot)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SMALL_SIZE, run_before=run_before)


def test_inspector_80x24(snap_compare):
    app = SpecchatApp(Settings(), backend=ScriptedBackend(clock=SteppingClock(step=0.02)))

    async def run_before(pilot) -> None:
        await _answered_with_frozen_stats(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SMALL_SIZE, run_before=run_before)


def test_inspector_80x24_scrolled_to_the_histogram(snap_compare):
    app = SpecchatApp(Settings(), backend=ScriptedBackend(clock=SteppingClock(step=0.02)))

    async def run_before(pilot) -> None:
        await _answered_with_frozen_stats(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        await pilot.press("end")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SMALL_SIZE, run_before=run_before)


def test_settings_80x24(snap_compare):
    app = SpecchatApp(Settings(), backend=ScriptedBackend(clock=SteppingClock(step=0.02)))

    async def run_before(pilot) -> None:
        await wait_ready(pilot)
        await settle(pilot)
        await pilot.press("f12")
        # The dialog open and its focused field holding the focus (its Focus event handled: a TextArea shows its
        # cursor when that event arrives); a fixed pause caught it mid-way on a busy machine.
        await wait_until(
            pilot,
            lambda: (
                len(app.screen_stack) > 1 and app.screen.focused is not None and app.screen.focused.has_focus
            ),
        )
        from textual.widgets import Input, TextArea

        # The cursor steady. The dialog focuses the system prompt (a TextArea) and its cursor blinks, so a capture
        # caught either phase: two full CI runs drew it without the cursor once each (same text and styles
        # otherwise). Without blinking a focused TextArea always draws it; the Inputs blink no more either.
        for widget in [*app.screen.query(TextArea), *app.screen.query(Input)]:
            widget.cursor_blink = False
        await settle(pilot)
        assert app.screen.focused.id == "settings-system-prompt" and app.screen.focused._draw_cursor

    assert snap_compare(app, terminal_size=SMALL_SIZE, run_before=run_before)
