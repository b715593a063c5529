"""llama.cpp (llama-cpp-python's low-level API): GGUF models on CPUs, Apple silicon, AMD. `--backend llamacpp`.

Re-exports only, each name imported where it is first used: `python -m engine.backends.llamacpp.native --trial`
runs this file in a child process that must stay light (the backend module imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.llamacpp.backend import BACKEND_NAME, LlamaCppBackend
    from engine.backends.llamacpp.library import (
        ggml_cpu_library,
        patched_build,
        physical_cores,
        probe_llamacpp,
        raw_bindings,
    )
    from engine.backends.llamacpp.model import LlamaCppModel
    from engine.backends.llamacpp.probe import LONG_PROBE_POSITION, ProbeVerdict, probe_widths
    from engine.backends.llamacpp.text import resolve_gguf

# name -> the module of this package that defines it
_SOURCES = {
    "BACKEND_NAME": "backend",
    "LlamaCppBackend": "backend",
    "LlamaCppModel": "model",
    "ggml_cpu_library": "library",
    "patched_build": "library",
    "physical_cores": "library",
    "probe_llamacpp": "library",
    "raw_bindings": "library",
    "LONG_PROBE_POSITION": "probe",
    "ProbeVerdict": "probe",
    "probe_widths": "probe",
    "resolve_gguf": "text",
}
__all__ = [
    "BACKEND_NAME",
    "LONG_PROBE_POSITION",
    "LlamaCppBackend",
    "LlamaCppModel",
    "ProbeVerdict",
    "ggml_cpu_library",
    "patched_build",
    "physical_cores",
    "probe_llamacpp",
    "probe_widths",
    "raw_bindings",
    "resolve_gguf",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
