"""The chat, `specchat` with no subcommand: open the TUI on the configured model.

A bad config field or preset does not stop it: the app opens anyway (on the defaults where nothing else is left) and
shows the problem. `TypeAheadEnter` keeps an Enter typed while the app is still starting an Enter.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from tui.cli.common import cli_overrides


def run(args: argparse.Namespace) -> int:
    from engine.config import (
        ConfigError,
        Settings,
        config_file_path,
        display_path,
        env_name,
        load_settings_dropping_bad,
    )
    from engine.errors import SpecchatError
    from engine.presets import PresetError
    from engine.session import ChatSession
    from tui.app import run_app

    # The chat shows problems in the app and stays open: a bad config field (or an unknown preset) is left out
    # and the rest of the file applies, a bad preset file is skipped (the session says which); a file that is
    # not TOML at all opens on the defaults. A missing model or draft folder fails the load, in the app.
    session, problems = None, []
    try:
        settings, problems = load_settings_dropping_bad(**cli_overrides(args))
        try:
            # Loads the presets and checks the preset mode against them; opens the history store.
            session = ChatSession(settings, save=True)
        except SpecchatError as exc:
            if settings.preset == "auto":
                raise
            where = (
                "command line"
                if args.preset is not None
                else env_name("preset")
                if env_name("preset") in os.environ
                else display_path(config_file_path())
            )
            problems.append(f"{where}: preset: {exc} (ignored: auto is used)")
            settings = settings.model_copy(update={"preset": "auto"})
            session = ChatSession(settings, save=True)
    except (ConfigError, PresetError, SpecchatError) as exc:
        session, settings = None, Settings.model_construct()
        problems = [f"{exc} (opened on the defaults)"]
    startup_error = " ".join("; ".join(problems).split()) or None
    open_chat = None
    if session is not None and (args.resume or args.chat is not None):
        assert session.history.saves
        if args.chat is not None:
            open_chat = session.recorder.store.chat(args.chat).id  # StoreError: one line, exit 2
        else:
            open_chat = session.history.last_chat_id()
            if open_chat is None:
                print("specchat: no saved chat to resume: starting a new one", file=sys.stderr)
    run_app(settings, startup_error=startup_error, session=session, open_chat=open_chat)
    return 0


class TypeAheadEnter:
    """Keep an Enter typed before the app takes the terminal an Enter.

    Until Textual puts the terminal in raw mode (after a second or two of imports), the terminal driver turns
    Enter (CR) into a newline (LF, which the prompt reads as ctrl+j: a new line instead of sending). Turning off
    that translation first thing keeps a question typed at once, Enter included, a question sent. The original
    settings come back on exit.
    """

    def __init__(self) -> None:
        self._saved: list | None = None

    def __enter__(self) -> TypeAheadEnter:
        try:
            import termios

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                attrs = termios.tcgetattr(fd)
                attrs[0] &= ~termios.ICRNL  # iflag: CR stays CR
                termios.tcsetattr(fd, termios.TCSANOW, attrs)
        except (ImportError, OSError, ValueError):  # no termios (Windows), or not a real terminal
            self._saved = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            import termios

            with contextlib.suppress(OSError, ValueError):
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSANOW, self._saved)
