"""The contract every engine implements.

A backend knows nothing of presets or UI: `ChatSession` turns a preset into a `GenerationRequest`
(plain numbers), and the backend streams `Chunk`s, then one `Done`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import field, make_dataclass
from typing import Any, Protocol, runtime_checkable

from engine.backends.registry import EngineOption, engine_arg_options
from engine.events import BackendInfo, Chunk, Done
from engine.request import GenerationRequest

ProgressCallback = Callable[[str, float | None], None]


def engine_args_type(options: tuple[EngineOption, ...]) -> type:
    """A frozen dataclass with one field per option (its setting's default), and `from_settings`."""

    def from_settings(cls: type, settings: Any) -> Any:
        """The fields of `settings` (a `Settings`, or any object with some of these attributes)."""
        values = {}
        for option in options:
            value = getattr(settings, option.name, option.default)
            values[option.name] = option.to_arg(value) if option.to_arg is not None else value
        return cls(**values)

    fields = [(option.name, Any, field(default=option.default)) for option in options]
    made = make_dataclass(
        "EngineArgs", fields, frozen=True, slots=True, namespace={"from_settings": classmethod(from_settings)}
    )
    made.__module__ = __name__
    made.__doc__ = (
        "What every engine is built from (`registry.build`): the engine options of the registry's table "
        "(`ENGINE_OPTIONS`, those with `engine_arg`), one type for all; each engine reads the fields it needs "
        "(the option's `engines` say which). Cache modes may be \"auto\" (the engine's default)."
    )
    return made


# model, draft, cache_mode, draft_cache_mode, max_context, endpoint, api_key_env, remote_model (the remote engine),
# threads (llama.cpp), device (transformers), gpu_split (the ExLlama engines): see ENGINE_OPTIONS.
EngineArgs = engine_args_type(engine_arg_options())


@runtime_checkable
class Backend(Protocol):
    """An engine: loads once, then generates one reply at a time."""

    name: str

    @property
    def info(self) -> BackendInfo: ...

    def load(self, progress: ProgressCallback | None = None) -> None:
        """Load weights and caches. Raises BackendError with a user-facing message."""

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Render `messages` with the model's chat template (generation prompt added) and tokenize."""

    def decode(self, token_ids: list[int]) -> str: ...

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        """Stream Chunks, then exactly one Done. Checks `cancel` every round."""

    def close(self) -> None: ...


def usable_cpus() -> int:
    """Logical CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
