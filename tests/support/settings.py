"""The settings `engine.backends.select.create_backend` reads, as a plain namespace (the selection tests)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


def backend_settings(model: Path | None, backend: str, **overrides) -> SimpleNamespace:
    """Settings for `model` on `backend` ("auto" or an engine's name): n-gram drafting, q8 caches, 1024 tokens of
    context, unless `overrides` say otherwise."""
    fields = dict(
        model=model,
        draft="ngram",
        backend=backend,
        cache_mode="q8",
        draft_cache_mode="q8",
        max_context=1024,
        gpu_split=None,
        endpoint=None,
        threads=None,
        device=None,
    )
    return SimpleNamespace(**{**fields, **overrides})
