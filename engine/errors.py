"""The user-facing errors: one base, `UserError`, that every error whose message is written for the user subclasses.

A user error's message is one line (whitespace is collapsed), says what to do, and may carry a `title`, what a
dialog calls the failure. The front ends catch that one type and show its message as it is, never a traceback
(the TUI in one place, `tui/screens/error.py`'s `describe_error`). A leaf: the errors of higher modules (config,
presets, models, the store ...) subclass `UserError` where they are defined, so nothing here imports upward.
Subclasses here exist only where a caller catches them apart from the rest.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure whose message is fit to show a user as it is (one line, says what to do), with an optional title."""

    title: str | None = None

    def __init__(self, message: object = "", *, title: str | None = None) -> None:
        super().__init__(" ".join(str(message).split()))
        if title is not None:
            self.title = title


class SpecchatError(UserError):
    """The chat session's own refusals (an unknown preset, an empty message, nothing to regenerate, out of memory
    loading): the CLI's chat start catches it apart (an unknown preset in the settings opens the chat on auto).
    Errors from below (a model, the store, an engine) pass through the session as they are, with their title."""


class BackendError(UserError):
    """An engine's failure (loading, an engine that cannot run here, a reply already running): the round loop and
    the benchmarks catch it apart from other errors."""


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an exception's message; where it has none, `default`, else the exception type's name."""
    lines = str(exc).strip().splitlines()
    if lines:
        return lines[0]
    return default if default is not None else type(exc).__name__
