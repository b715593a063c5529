"""The exllamav3 package, imported lazily: the names the backend uses, and whether it can run here at all.

exllamav3 ships as a pure-Python wheel with ~194 C++/CUDA sources that `exllamav3/ext.py` compiles with torch's JIT
loader on the first import (unless a prebuilt `exllamav3_ext` module is importable), so `import exllamav3` happens
only inside these functions and every failure becomes one line. The build is announced and followed file by file
by the same watcher as exllamav2's (engine/backends/extension_build.py, through the shared `GpuLibrary`,
engine/backends/library_generator/library.py, with exllamav3's names).

The backend is written against one release, `PINNED_VERSION`: unknown keywords to `Generator` and `Job` are
swallowed by `**kwargs` there, so tests/engine/backends/exllamav3/test_signatures.py checks every name used here against that release's
real source, and another installed version is named in the backend's notes.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

from engine.backends.base import ProgressCallback
from engine.backends.library_generator.library import GpuLibrary, short_cause

PINNED_VERSION = "1.6.5"
# sha256 of exllamav3-1.6.5-py3-none-any.whl on PyPI (the signature test verifies the wheel it downloads).
PINNED_WHEEL_SHA256 = "550c0d04c755f249840e5c1edc26b0e80c7342c33b5d99ad17479abb407e8ded"
PACKAGE = "exllamav3"
EXTENSION = "exllamav3_ext"
BUILD_STAGE = "building exllamav3's CUDA extension (first start only; ~194 files, can take many minutes)"
UNUSABLE_HINT = "use --backend auto for the CPU backends"
INSTALL_HINT = f"pip install exllamav3=={PINNED_VERSION} for EXL3 folders and MTP"
LIBRARY = GpuLibrary(PACKAGE, EXTENSION, BUILD_STAGE, UNUSABLE_HINT, pinned=PINNED_VERSION)

__all__ = [
    "INSTALL_HINT",
    "LIBRARY",
    "PINNED_VERSION",
    "UNUSABLE_HINT",
    "import_exllamav3",
    "probe_exllamav3",
    "short_cause",
]


def _modules() -> tuple[ModuleType, type]:
    import exllamav3
    from exllamav3.generator.sampler import ComboSampler

    return exllamav3, ComboSampler


def import_exllamav3(progress: ProgressCallback | None = None) -> SimpleNamespace:
    """The exllamav3 names the backend uses; BackendError where the package cannot be imported here."""
    exllamav3, combo_sampler = LIBRARY.load(progress, _modules)
    version = _installed_version(exllamav3)
    return SimpleNamespace(
        version=version,
        Config=exllamav3.Config,
        Model=exllamav3.Model,
        Tokenizer=exllamav3.Tokenizer,
        Cache=exllamav3.Cache,
        CacheLayer_fp16=exllamav3.CacheLayer_fp16,
        CacheLayer_quant=exllamav3.CacheLayer_quant,
        Generator=exllamav3.Generator,
        Job=exllamav3.Job,
        ComboSampler=combo_sampler,
    )


def _installed_version(module: object) -> str:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from exllamav3.version import __version__

        return str(__version__)
    except Exception:
        return "?"


def probe_exllamav3(progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """Whether exllamav3 can run here (a CUDA GPU and an importable, built package), with the reason.

    Without a CUDA GPU the package is not imported at all (its import would start a build that cannot work).
    """
    return LIBRARY.probe(progress, import_exllamav3)
