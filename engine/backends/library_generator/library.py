"""A library whose import compiles a CUDA extension (exllamav2, exllamav3): imported lazily, its build followed, and
every failure one line.

Both packages build their extension with torch's JIT loader on the first import and fail without CUDA, so each
engine's `library.py` imports its package only inside one function, through `GpuLibrary.load`, and probes it through
`GpuLibrary.probe`; what differs (the names imported, the hint, a pinned release) is the engine's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar

from engine.backends.base import ProgressCallback
from engine.errors import BackendError, first_line

T = TypeVar("T")


def short_cause(exc: BaseException) -> str:
    """One line saying why importing the library failed."""
    text = str(exc).strip()
    if "CUDA_HOME" in text:
        return "CUDA_HOME not set"
    return f"{type(exc).__name__}: {first_line(exc)}"[:160] if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class GpuLibrary:
    """One such package: its import name, its extension's module name, the build's progress stage, the advice
    after "unusable here", and the release the engine is written against (None: any)."""

    package: str
    extension: str
    build_stage: str
    unusable_hint: str
    pinned: str | None = None

    def load(self, progress: ProgressCallback | None, importer: Callable[[], T]) -> T:
        """What `importer` imports; BackendError where the package cannot be imported here.

        The first import on a GPU compiles the extension: `progress` hears that it is coming and then files
        compiled / total and the elapsed time (engine/backends/extension_build.py); the build uses every core.
        """
        from engine.backends import extension_build

        extension_build.use_all_cores()
        folder = extension_build.build_coming(self.package, self.extension) if progress is not None else None
        try:
            if folder is not None and progress is not None:
                with extension_build.BuildWatcher(folder, progress, stage=self.build_stage):
                    importlib.import_module(self.package)
            return importer()
        except Exception as exc:
            if extension_build.is_build_failure(exc, self.extension):
                log = extension_build.write_build_log(folder or self._build_folder_or_none(), exc)
                raise self.unusable(f"its CUDA extension failed to build (compiler output: {log})") from exc
            # Anything else: OSError (no CUDA_HOME), ImportError (not installed, no triton), RuntimeError (no
            # visible device to build for), and whatever torch's cpp_extension raises on a CUDA build of torch
            # with no GPU (IndexError).
            raise self.unusable(short_cause(exc)) from exc

    def unusable(self, why: str) -> BackendError:
        return BackendError(f"{self.package} is unusable here: {why}; {self.unusable_hint}")

    def probe(
        self, progress: ProgressCallback | None, load: Callable[[ProgressCallback | None], SimpleNamespace]
    ) -> tuple[bool, str]:
        """Whether the package can run here (a CUDA GPU and an importable, built package), with the reason.

        Without a CUDA GPU the package is not imported at all (its import would start a build that cannot work).
        """
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a hard dependency
            return False, f"torch is missing ({exc})"
        try:
            if not torch.cuda.is_available():
                return False, "no CUDA GPU visible to torch"
            ex = load(progress)
            device = torch.cuda.get_device_name(0)
        except BackendError as exc:
            prefix = f"{self.package} is unusable here: "
            return False, str(exc).removeprefix(prefix).removesuffix(f"; {self.unusable_hint}")
        except Exception as exc:  # a broken driver or torch build: still "unusable here", never a traceback
            return False, short_cause(exc)
        pinned = "" if self.pinned in (None, ex.version) else f", not the pinned {self.pinned}"
        return True, f"{self.package} {ex.version}{pinned} on {device}"

    def _build_folder_or_none(self) -> Path | None:
        from engine.backends import extension_build

        try:
            return extension_build.build_directory(self.extension)
        except Exception:
            return None
