"""transformers + torch (any Hugging Face folder, CPU by default): `--backend transformers`.

Re-exports only, each name imported where it is first used: `specchat doctor` checks the row-invariant kernel
(`engine.backends.transformers.rowlin`) without importing the transformers library the backend module loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.transformers.backend import TransformersBackend
    from engine.backends.transformers.cache import SpecCache

# name -> the module of this package that defines it
_SOURCES = {
    "SpecCache": "cache",
    "TransformersBackend": "backend",
}
__all__ = [
    "SpecCache",
    "TransformersBackend",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
