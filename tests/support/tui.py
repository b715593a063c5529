"""Shared helpers for the TUI tests: build the real app on a scripted backend and poll it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual.pilot import Pilot

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from tui.app import SpecchatApp

SIZE = (120, 36)


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the app run until `predicate()` holds; fail the test with the predicate's name after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        await pilot.pause(0.02)
        await asyncio.sleep(0)


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
