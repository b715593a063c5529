"""The contract every engine implements.

A backend knows nothing of presets or UI: `ChatSession` turns a preset into a `GenerationRequest`
(plain numbers), and the backend streams `Chunk`s, then one `Done`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engine.events import BackendInfo, Chunk, Done
from engine.request import GenerationRequest

ProgressCallback = Callable[[str, float | None], None]


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """What every engine is built from (`registry.build`): the settings an engine reads, one type for all.

    Each engine reads the fields it needs: a local engine the model, draft, cache modes and context; llama.cpp the
    threads too; transformers the device; the ExLlama engines the GPU split; the remote engine the endpoint, the
    API key's variable and the model to ask for. Cache modes may be "auto" (the engine's default).
    """

    model: Path | None = None  # a model file or folder; None: the embedded model
    draft: str = "ngram"
    cache_mode: str = "auto"
    draft_cache_mode: str = "auto"
    max_context: int | None = None
    threads: int | None = None
    device: str = "auto"
    gpu_split: tuple[float, ...] | None = None
    endpoint: str | None = None
    api_key_env: str | None = None
    remote_model: str | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> EngineArgs:
        """The fields of `settings` (a `Settings`, or any object with some of these attributes)."""
        split = getattr(settings, "gpu_split", None)
        return cls(
            model=getattr(settings, "model", None),
            draft=getattr(settings, "draft", "ngram"),
            cache_mode=getattr(settings, "cache_mode", "auto"),
            draft_cache_mode=getattr(settings, "draft_cache_mode", "auto"),
            max_context=getattr(settings, "max_context", None),
            threads=getattr(settings, "threads", None),
            device=getattr(settings, "device", "auto") or "auto",
            gpu_split=tuple(split) if split is not None else None,
            endpoint=getattr(settings, "endpoint", None),
            api_key_env=getattr(settings, "api_key_env", None),
            remote_model=getattr(settings, "remote_model", None),
        )


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
