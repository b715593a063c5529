"""The model cache's safe writes: `build_in_cache` makes a file or folder once, under an exclusive lock, in a
temporary folder beside it, moved in whole; the one error type of this package (`ModelError`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.errors import UserError

ProgressCallback = Callable[[str, float | None], None]


def no_progress(stage: str, fraction: float | None) -> None:
    """A progress callback that says nothing."""


class ModelError(UserError):
    """A model folder problem, worded for the user (one line, no traceback needed)."""


def build_in_cache(
    target: Path,
    lock: Path,
    ready: Callable[[], bool],
    build: Callable[[Path], None],
    disk_error: Callable[[OSError], ModelError],
) -> bool:
    """Make `target` in the model cache once: `build(work)` runs in a temporary folder beside it (and moves the
    result in itself, with one `os.replace`), under an exclusive `lock`, unless `ready()` already holds, before
    or after waiting for the lock (another process may have finished meanwhile). Safe from two processes at once;
    an interrupted build leaves no half-written file (a killed build's folder is removed first). A disk error
    becomes one line (`disk_error`). Returns whether this call built it."""
    if ready():
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(
            f"Cannot create the model cache folder {target.parent}: {exc.strerror or exc}"
        ) from exc
    with exclusive_lock(lock):
        if ready():
            return False
        _remove_stale_builds(target)
        try:
            with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as work_dir:
                build(Path(work_dir))
        except OSError as exc:
            raise disk_error(exc) from exc
    return True


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Block until this process alone holds `lock_path` (advisory; released when the process dies)."""
    try:
        handle = lock_path.open("a+b")
    except OSError as exc:
        raise ModelError(f"Cannot create the lock file {lock_path}: {exc.strerror or exc}") from exc
    with handle:
        if os.name == "nt":  # pragma: no cover - Windows
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale_builds(target: Path) -> None:
    # A build killed hard (SIGKILL, power loss) cannot clean up after itself; we hold the lock, so any build
    # folder still here belongs to nobody.
    for stale in target.parent.glob(f".{target.name}.build-*"):
        shutil.rmtree(stale, ignore_errors=True)
