"""Shared helpers for the TUI tests: build the real app on a scripted backend and poll it, feed it raw terminal
bytes, set fields in its settings dialog, and the status bar's figures at full width."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual import events
from textual._xterm_parser import XTermParser
from textual.pilot import Pilot
from textual.widgets import Input, TextArea

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from tui.app import SpecchatApp
from tui.screens.settings import SettingsScreen
from tui.widgets.status_bar import StatusFigures

SIZE = (120, 36)


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the app run until `predicate()` holds, then until the screen has handled what is already posted to it
    (the app changes its state and then tells the chat in a message: what the chat does about it is in place when
    this returns); fail the test with the predicate's name after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        await pilot.pause(0.02)
        await asyncio.sleep(0)
    await pilot.pause()


def make_app(backend: ScriptedBackend | None = None, **settings: object) -> SpecchatApp:
    return SpecchatApp(Settings(**settings), backend=backend or ScriptedBackend())


async def wait_ready(pilot: Pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.state != "loading")


async def send(pilot: Pilot, text: str, wait: bool = True) -> None:
    app = pilot.app
    app.chat.prompt.focus()
    app.chat.prompt.set_text(text)
    # A reply whose reasoning opened and that ended in the next handler once froze the app here (its message
    # loop ended: WaitForScreenTimeout under load); tui/widgets/message.py's stop_stream is the fix.
    await pilot.press("enter")
    if wait:
        await wait_until(pilot, lambda: app.chat.chat_log.replies() and not app.chat.generating)


def status(app: SpecchatApp) -> str:
    app.chat.refresh_status()
    return app.chat.status_bar.plain


def plain(widget) -> str:
    """The text a Static shows, whatever renderable it holds (str, Rich Text, Table, Group)."""
    from rich.console import Console

    content = widget.content
    if isinstance(content, str):
        return content
    console = Console(width=200, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(content)
    return console.export_text()


def app_parser() -> XTermParser:
    """The parser the app's terminal driver reads with (Textual's own where the app does not choose one)."""
    return getattr(make_app().driver_class, "parser_class", XTermParser)()


def parse(raw: bytes, *splits: int) -> list[events.Event]:
    """The raw bytes through the app's parser, read in pieces cut at `splits` (as reads from the terminal are)."""
    text = raw.decode("utf-8")
    cuts = [0, *splits, len(text)]
    parser = app_parser()
    messages = []
    for start, end in zip(cuts, cuts[1:], strict=False):
        if text[start:end]:
            messages += list(parser.feed(text[start:end]))
    return messages


async def apply_settings(pilot, **fields: str) -> SettingsScreen:
    """Open F12, set the given inputs (model, draft, system-prompt), press ctrl+s."""
    app = pilot.app
    await pilot.press("f12")
    await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
    screen = app.screen
    for field, value in fields.items():
        if field == "system_prompt":
            screen.query_one("#settings-system-prompt", TextArea).text = value
        else:
            screen.query_one(f"#settings-{field}", Input).value = value
    await pilot.press("ctrl+s")
    await pilot.pause(0.1)
    return screen


def wide_figures(**changes) -> StatusFigures:
    """The status bar's figures with every field set (wide enough to need dropping at 80 columns)."""
    base = dict(
        state="idle", preset="auto → creative", k=3, temperature=0.9, acceptance=0.45, measured_drafting=True,
        spark=(0.5, 1.0), tau=2.1, tokens_per_s=12.3, ttft_s=0.41, context_used=1234, max_context=4096,
        cache_mode="q8", backend="transformers", device="cpu",
    )  # fmt: skip
    base.update(changes)
    return StatusFigures(**base)
