"""What the engines that drive a library's own generator share (ExLlamaV2, ExLlamaV3): the base backend, the lazy
import of a library that compiles CUDA code, and the loaded models' common shape. Re-exports only."""

from engine.backends.library_generator.backend import (
    OOM_HINT,
    JobAsk,
    JobTimes,
    LibraryGeneratorBackend,
    LoadStage,
    Reply,
)
from engine.backends.library_generator.library import GpuLibrary, short_cause
from engine.backends.library_generator.models import LibraryVocab, LoadedModels, round_up_to_page, vocab_view

__all__ = [
    "OOM_HINT",
    "GpuLibrary",
    "JobAsk",
    "JobTimes",
    "LibraryGeneratorBackend",
    "LibraryVocab",
    "LoadStage",
    "LoadedModels",
    "Reply",
    "round_up_to_page",
    "short_cause",
    "vocab_view",
]
