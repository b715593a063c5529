"""The exllamav3 package, imported lazily: the names the backend uses, and whether it can run here at all.

exllamav3 ships as a pure-Python wheel with ~194 C++/CUDA sources that `exllamav3/ext.py` compiles with torch's JIT
loader on the first import (unless a prebuilt `exllamav3_ext` module is importable), so `import exllamav3` happens
only inside these functions and every failure becomes one line. The build is announced and followed file by file
by the same watcher as exllamav2's (engine/backends/extension_build.py, with exllamav3's names).

The backend is written against one release, `PINNED_VERSION`: unknown keywords to `Generator` and `Job` are
swallowed by `**kwargs` there, so tests/engine/backends/exllamav3/test_signatures.py checks every name used here against that release's
real source, and another installed version is named in the backend's notes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from engine.backends.base import ProgressCallback
from engine.errors import BackendError, first_line

PINNED_VERSION = "1.6.5"
# sha256 of exllamav3-1.6.5-py3-none-any.whl on PyPI (the signature test verifies the wheel it downloads).
PINNED_WHEEL_SHA256 = "550c0d04c755f249840e5c1edc26b0e80c7342c33b5d99ad17479abb407e8ded"
PACKAGE = "exllamav3"
EXTENSION = "exllamav3_ext"
BUILD_STAGE = "building exllamav3's CUDA extension (first start only; ~194 files, can take many minutes)"
UNUSABLE_HINT = "use --backend auto for the CPU backends"
INSTALL_HINT = f"pip install exllamav3=={PINNED_VERSION} for EXL3 folders and MTP"


def short_cause(exc: BaseException) -> str:
    """One line saying why importing exllamav3 failed."""
    text = str(exc).strip()
    if "CUDA_HOME" in text:
        return "CUDA_HOME not set"
    return f"{type(exc).__name__}: {first_line(exc)}"[:160] if text else type(exc).__name__


def import_exllamav3(progress: ProgressCallback | None = None) -> SimpleNamespace:
    """The exllamav3 names the backend uses; BackendError where the package cannot be imported here."""
    from engine.backends import extension_build

    extension_build.use_all_cores()
    folder = extension_build.build_coming(PACKAGE, EXTENSION) if progress is not None else None
    try:
        if folder is not None and progress is not None:
            with extension_build.BuildWatcher(folder, progress, stage=BUILD_STAGE):
                import exllamav3
        import exllamav3
        from exllamav3.generator.sampler import ComboSampler
    except Exception as exc:
        if extension_build.is_build_failure(exc, EXTENSION):
            log = extension_build.write_build_log(folder or _build_folder_or_none(), exc)
            raise BackendError(
                f"exllamav3 is unusable here: its CUDA extension failed to build (compiler output: {log}); "
                f"{UNUSABLE_HINT}"
            ) from exc
        # OSError (no CUDA_HOME), ImportError (not installed, no triton), RuntimeError (no visible device to
        # build for, see ext.py), and whatever a CUDA torch raises without a GPU.
        raise BackendError(f"exllamav3 is unusable here: {short_cause(exc)}; {UNUSABLE_HINT}") from exc
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
        ComboSampler=ComboSampler,
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


def _build_folder_or_none() -> Path | None:
    from engine.backends import extension_build

    try:
        return extension_build.build_directory(EXTENSION)
    except Exception:
        return None


def probe_exllamav3(progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """Whether exllamav3 can run here (a CUDA GPU and an importable, built package), with the reason.

    Without a CUDA GPU the package is not imported at all (its import would start a build that cannot work).
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        return False, f"torch is missing ({exc})"
    try:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        ex = import_exllamav3(progress)
        device = torch.cuda.get_device_name(0)
    except BackendError as exc:
        return False, str(exc).removeprefix("exllamav3 is unusable here: ").removesuffix(f"; {UNUSABLE_HINT}")
    except Exception as exc:  # a broken driver or torch build: still "unusable here", never a traceback
        return False, short_cause(exc)
    pinned = "" if ex.version == PINNED_VERSION else f", not the pinned {PINNED_VERSION}"
    return True, f"exllamav3 {ex.version}{pinned} on {device}"
