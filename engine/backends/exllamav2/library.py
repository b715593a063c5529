"""The exllamav2 package, imported lazily: the names the backend uses, and whether it can run here at all.

`import exllamav2` compiles a CUDA extension on the first start (extension_build.py follows the build) and fails
without CUDA, so it happens only inside these functions and every failure becomes one line.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from engine.backends.base import ProgressCallback
from engine.errors import BackendError, first_line

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


def short_cause(exc: BaseException) -> str:
    """One line saying why importing exllamav2 failed."""
    text = str(exc).strip()
    if "CUDA_HOME" in text:
        return "CUDA_HOME not set"
    return f"{type(exc).__name__}: {first_line(exc)}"[:160] if text else type(exc).__name__


def import_exllamav2(progress: ProgressCallback | None = None) -> SimpleNamespace:
    """The exllamav2 names this backend uses; BackendError where the package cannot be imported here.

    The first import on a GPU compiles exllamav2's CUDA extension: `progress` hears that it is coming and then
    files compiled / total and the elapsed time (engine/backends/extension_build.py); the build uses every core.
    """
    from engine.backends import extension_build

    extension_build.use_all_cores()
    folder = extension_build.build_coming(PACKAGE, EXTENSION) if progress is not None else None
    try:
        if folder is not None and progress is not None:
            with extension_build.BuildWatcher(folder, progress, BUILD_STAGE):
                import exllamav2
        import exllamav2
        import exllamav2.attn as attn
        from exllamav2.generator import ExLlamaV2DynamicGenerator, ExLlamaV2DynamicJob, ExLlamaV2Sampler
    except Exception as exc:
        if extension_build.is_build_failure(exc, EXTENSION):
            log = extension_build.write_build_log(folder or _build_folder_or_none(), exc)
            raise BackendError(
                f"exllamav2 is unusable here: its CUDA extension failed to build (compiler output: {log}); "
                f"{UNUSABLE_HINT}"
            ) from exc
        # Anything else: OSError (no CUDA_HOME), ImportError, and whatever torch's cpp_extension raises on a CUDA
        # build of torch with no GPU (IndexError).
        raise BackendError(f"exllamav2 is unusable here: {short_cause(exc)}; {UNUSABLE_HINT}") from exc
    return SimpleNamespace(
        version=getattr(exllamav2, "__version__", "?"),
        Config=exllamav2.ExLlamaV2Config,
        Model=exllamav2.ExLlamaV2,
        Tokenizer=exllamav2.ExLlamaV2Tokenizer,
        caches={mode: getattr(exllamav2, name) for mode, name in CACHE_CLASS_NAMES.items()},
        Generator=ExLlamaV2DynamicGenerator,
        Job=ExLlamaV2DynamicJob,
        Settings=ExLlamaV2Sampler.Settings,
        attn=attn,
    )


def _build_folder_or_none() -> Path | None:
    from engine.backends import extension_build

    try:
        return extension_build.build_directory(EXTENSION)
    except Exception:
        return None


def probe_exllamav2(progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """Whether exllamav2 can run here (a CUDA GPU and an importable, built package), with the reason."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        return False, f"torch is missing ({exc})"
    try:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        ex = import_exllamav2(progress)
        device = torch.cuda.get_device_name(0)
    except BackendError as exc:
        return False, str(exc).removeprefix("exllamav2 is unusable here: ").removesuffix(f"; {UNUSABLE_HINT}")
    except Exception as exc:  # a broken driver or torch build: still "unusable here", never a traceback
        return False, short_cause(exc)
    return True, f"exllamav2 {ex.version} on {device}"
