"""The exllamav2 package, imported lazily: the names the backend uses, and whether it can run here at all.

`import exllamav2` compiles a CUDA extension on the first start (extension_build.py follows the build) and fails
without CUDA, so it happens only inside these functions (through the shared `GpuLibrary`,
engine/backends/library_generator/library.py) and every failure becomes one line.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

from engine.backends.base import ProgressCallback
from engine.backends.library_generator.library import GpuLibrary, short_cause

PACKAGE = "exllamav2"
EXTENSION = "exllamav2_ext"
BUILD_STAGE = "building exllamav2's CUDA extension (first start only; can take many minutes)"
CACHE_CLASS_NAMES = {
    "fp16": "ExLlamaV2Cache",
    "q8": "ExLlamaV2Cache_Q8",
    "q6": "ExLlamaV2Cache_Q6",
    "q4": "ExLlamaV2Cache_Q4",
}
UNUSABLE_HINT = "use --backend transformers"
LIBRARY = GpuLibrary(PACKAGE, EXTENSION, BUILD_STAGE, UNUSABLE_HINT)

__all__ = ["BUILD_STAGE", "LIBRARY", "UNUSABLE_HINT", "import_exllamav2", "probe_exllamav2", "short_cause"]


def _modules() -> tuple[ModuleType, ModuleType, tuple[type, type, type]]:
    import exllamav2
    import exllamav2.attn as attn
    from exllamav2.generator import ExLlamaV2DynamicGenerator, ExLlamaV2DynamicJob, ExLlamaV2Sampler

    return exllamav2, attn, (ExLlamaV2DynamicGenerator, ExLlamaV2DynamicJob, ExLlamaV2Sampler)


def import_exllamav2(progress: ProgressCallback | None = None) -> SimpleNamespace:
    """The exllamav2 names this backend uses; BackendError where the package cannot be imported here."""
    exllamav2, attn, (generator, job, sampler) = LIBRARY.load(progress, _modules)
    return SimpleNamespace(
        version=getattr(exllamav2, "__version__", "?"),
        Config=exllamav2.ExLlamaV2Config,
        Model=exllamav2.ExLlamaV2,
        Tokenizer=exllamav2.ExLlamaV2Tokenizer,
        caches={mode: getattr(exllamav2, name) for mode, name in CACHE_CLASS_NAMES.items()},
        Generator=generator,
        Job=job,
        Settings=sampler.Settings,
        attn=attn,
    )


def probe_exllamav2(progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """Whether exllamav2 can run here (a CUDA GPU and an importable, built package), with the reason."""
    return LIBRARY.probe(progress, import_exllamav2)
