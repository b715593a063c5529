"""The user-facing errors: one base, `UserError`, that every error whose message is written for the user subclasses.

The front ends catch that one type and show its message as it is, on one line, never a traceback. A leaf: the
errors of higher modules (config, presets, models, the store ...) subclass `UserError` where they are defined, so
nothing here imports upward to list them.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure whose message is fit to show a user as it is (one line, says what to do)."""


class SpecchatError(UserError):
    """A user-facing failure: bad input, a missing model, an unusable backend. Never shown as a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class BackendError(UserError):
    """A backend failure with a message fit to show a user as it is (one line, says what to do)."""
