"""The one error type the front ends catch: its message is shown to the user as it is, on one line."""

from __future__ import annotations


class SpecchatError(Exception):
    """A user-facing failure: bad input, a missing model, an unusable backend. Never shown as a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every module-level error whose message is written for users (imported lazily: torch-free callers)."""
    from engine.backends.base import BackendError
    from engine.chat_template import ChatTemplateError
    from engine.config import ConfigError
    from engine.metrics import MetricsError
    from engine.models import ModelError
    from engine.presets import PresetError
    from engine.store import StoreError

    return (
        SpecchatError,
        BackendError,
        ChatTemplateError,
        ConfigError,
        ModelError,
        PresetError,
        StoreError,
        MetricsError,
    )
