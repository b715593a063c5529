"""The contract every engine implements.

A backend knows nothing of presets or UI: `ChatSession` turns a preset into a `GenerationRequest`
(plain numbers), and the backend streams `Chunk`s, then one `Done`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from engine.events import BackendInfo, Chunk, Done
from engine.request import GenerationRequest

ProgressCallback = Callable[[str, float | None], None]


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
