"""First start of exllamav2 on a GPU: its CUDA extension is compiled when the package is first imported.

exllamav2 0.3.2 (`exllamav2/ext.py`) imports a prebuilt `exllamav2_ext` module where a wheel carries one, and
otherwise builds it with torch's JIT loader (`torch.utils.cpp_extension.load`, ninja, ~50 C++/CUDA files, many
minutes). That build is silent, so this module says it is coming, watches ninja's files in the build folder
(`build.ninja` names every object, `.ninja_log` gets a line as each one finishes) and reports "k/n files, elapsed"
through the load's progress callback (the CLI's stderr line, the chat's loading banner). It also sets MAX_JOBS to
every core (torch's ninja build reads it) unless the user set it, and turns a failed build into one line naming a
log file with the compiler's output.

exllamav3 (engine/backends/exllamav3/) builds its `exllamav3_ext` through the same loader: every function takes
the package's and the extension's names, which each engine's library module keeps (PACKAGE, EXTENSION,
BUILD_STAGE).

A leaf module: only the standard library at import time; torch is imported inside the functions.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

BUILD_LOG_NAME = "specchat-build-error.log"
OBJECT_RULES = ("compile", "cuda_compile")

Report = Callable[[str, float | None], None]


def use_all_cores() -> str:
    """MAX_JOBS for torch's ninja build: every core, unless the user chose a number."""
    return os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))


def build_directory(extension: str) -> Path:
    """Where torch's JIT loader builds `extension` (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/pyXY_cuZZ)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return Path(root) / extension
    import torch

    accelerator = (
        f"rocm{torch.version.hip.replace('.', '')}"
        if torch.version.hip
        else f"cu{torch.version.cuda.replace('.', '')}"
        if torch.version.cuda
        else "cpu"
    )
    folder = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{accelerator}"
    try:
        from torch.utils.cpp_extension import get_default_build_root

        base = Path(get_default_build_root())
    except ImportError:  # pragma: no cover - present in every torch this project supports
        base = Path.home() / ".cache" / "torch_extensions"
    return base / folder / extension


def build_coming(package: str, extension: str) -> Path | None:
    """The build folder when importing `package` is about to compile its `extension`, else None.

    None where a prebuilt extension module is installed, where a JIT build already left the library, and where no
    build can start at all (no CUDA GPU for torch, no CUDA toolkit): then the import is quick, or fails quickly.
    """
    if package in sys.modules or importlib.util.find_spec(extension) is not None:
        return None
    try:
        import torch
        from torch.utils import cpp_extension

        if not torch.cuda.is_available() or getattr(cpp_extension, "CUDA_HOME", None) is None:
            return None
        folder = build_directory(extension)
    except Exception:  # a broken torch: the import will say so itself
        return None
    if (folder / f"{extension}.so").is_file() or (folder / f"{extension}.pyd").is_file():
        return None
    return folder


def ninja_objects(build_ninja: str) -> list[str]:
    """The object files a torch-written build.ninja compiles (`build X.o: compile ...`, `X.cuda.o: cuda_compile`)."""
    objects = []
    for line in build_ninja.splitlines():
        if not line.startswith("build "):
            continue
        outputs, _, rest = line[len("build ") :].partition(": ")
        rule = rest.split(" ", 1)[0]
        if rule in OBJECT_RULES:
            objects.append(outputs.strip())
    return objects


def ninja_finished(ninja_log: str) -> set[str]:
    """Outputs that ninja's log (v5+: start, end, mtime, output, hash; tab-separated) records as built."""
    done = set()
    for line in ninja_log.splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) >= 5:
            done.add(fields[3])
    return done


def build_progress(folder: Path) -> tuple[int, int | None]:
    """(files compiled, files in all) of the build in `folder` so far; total None before build.ninja exists."""
    try:
        objects = ninja_objects((folder / "build.ninja").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return 0, None
    try:
        finished = ninja_finished((folder / ".ninja_log").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        finished = set()
    return sum(1 for o in objects if o in finished), len(objects) or None


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


class BuildWatcher:
    """A thread that reports the build's progress: on every finished file, and every `heartbeat_s` regardless."""

    def __init__(
        self,
        folder: Path,
        report: Report,
        stage: str,
        poll_s: float = 1.0,
        heartbeat_s: float = 15.0,
    ) -> None:
        self.folder = folder
        self.stage = stage
        self.report = report
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{folder.name}-build-progress", daemon=True)
        self._last: tuple[int, int | None] | None = None
        self._last_report = 0.0

    def __enter__(self) -> BuildWatcher:
        jobs = os.environ.get("MAX_JOBS", "?")
        self.report(f"{self.stage}: {jobs} parallel jobs", 0.0)
        self._last_report = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()  # the last word: all files, when the build finished

    def poll(self) -> None:
        compiled, total = build_progress(self.folder)
        now = time.monotonic()
        if (compiled, total) == self._last and now - self._last_report < self.heartbeat_s:
            return
        self._last, self._last_report = (compiled, total), now
        elapsed = format_elapsed(now - self.started)
        if total:
            self.report(f"{self.stage}: {compiled}/{total} files, {elapsed}", compiled / total)
        else:
            self.report(f"{self.stage}: preparing, {elapsed}", None)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()


def is_build_failure(exc: BaseException, extension: str) -> bool:
    """torch's JIT loader says "Error building extension 'NAME'" (with ninja's output) when compiling fails."""
    return isinstance(exc, RuntimeError) and f"Error building extension '{extension}'" in str(exc)


def write_build_log(folder: Path | None, exc: BaseException) -> Path:
    """Save the compiler output carried by the exception; the path, for the one-line message."""
    target_dir = folder if folder is not None else Path.home() / ".cache" / "specchat"
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        path = target_dir / BUILD_LOG_NAME
        path.write_text(str(exc), encoding="utf-8")
    except OSError:
        import tempfile

        path = Path(tempfile.gettempdir()) / BUILD_LOG_NAME
        path.write_text(str(exc), encoding="utf-8")
    return path
