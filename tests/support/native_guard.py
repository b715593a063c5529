"""One native crash must not take the test suite down.

llama.cpp is C++: a segfault in it (its AMX weight repacking on some Xeons, llama.cpp#20824) kills the pytest
process and every test after it. Test modules that load quantized GGUFs call `survives(path)` in their model
fixture first: a child process loads the model with the llama.cpp backend as the tests will (the same repack
choice and trial, `engine.backends.llamacpp.native`) and generates a few tokens plainly and with n-gram
drafting. A child killed by a signal fails that fixture with one line naming the signal, so its tests fail and
the rest of the suite goes on. Verdicts are kept per process, and a pass is remembered on disk (beside the
backend's own trial verdicts) under the key the backend's trials use (files, llama.cpp build, CPU flags) and the
repack setting: a known (file, build, CPU) is not tried again in the next run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.llamacpp.native import signal_name
from tests.support.paths import ROOT

_verdicts: dict[tuple, str | None] = {}
PASSES_FILE = "tests-native-guard.json"
PASSED = {"crashed": None}


def _disk_key(path: Path, draft: Path | None) -> str | None:
    """The backend's trial key of each file with the repack override; None where a file is not there."""
    from engine.backends.llamacpp import native

    try:
        keys = [native.trial_key(Path(file), repack=False) for file in (path, draft) if file is not None]
    except OSError:
        return None
    return "|".join([*keys, os.environ.get(native.REPACK_ENV, "")])


def _passes_path() -> Path:
    from engine.paths import cache_dir

    return cache_dir() / PASSES_FILE


def child_command(path: Path, draft: Path | None = None) -> list[str]:
    command = [sys.executable, "-m", "tests.support.native_guard", str(path)]
    return command + ([str(draft)] if draft is not None else [])


def survives(path: Path, draft: Path | None = None, command: list[str] | None = None) -> None:
    """pytest.fail (one line, naming the signal) when loading and decoding `path` kills a child process."""
    from engine.backends.llamacpp.native import load_verdicts, remember_verdict

    key = (str(path), str(draft), tuple(command or ()))
    disk = _disk_key(path, draft) if command is None else None
    if key not in _verdicts and disk is not None and load_verdicts(_passes_path()).get(disk) == PASSED:
        _verdicts[key] = None
    if key not in _verdicts:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(
            command or child_command(path, draft), capture_output=True, text=True, env=env, timeout=600
        )
        crashed = signal_name(done.returncode)
        _verdicts[key] = (
            None if crashed is None else f"{crashed}: {(done.stderr.strip().splitlines() or [''])[-1]}"
        )
        if crashed is None and disk is not None:
            remember_verdict(_passes_path(), disk, PASSED)
    verdict = _verdicts[key]
    if verdict is not None:
        pytest.fail(
            f"llama.cpp killed a child process loading {Path(path).name} ({verdict}); "
            "the tests that need it cannot run in this process",
            pytrace=False,
        )


def _child(path: str, draft: str | None) -> int:
    """Load as the tests do, then a short plain reply and a short n-gram (or draft-model) reply."""
    import threading

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.errors import BackendError
    from engine.request import GenerationRequest, SamplerSettings

    backend = LlamaCppBackend(path, draft=draft or "ngram", max_context=1024)
    try:
        backend.load()
    except BackendError as exc:  # a clean refusal (e.g. every trial crashed) is not a crash of this process
        print(f"load refused: {exc}", file=sys.stderr)
        return 0
    ids = backend.encode_chat([{"role": "user", "content": "What is the capital of France? Say it twice."}])
    for k in (0, 4):
        request = GenerationRequest(
            prompt_ids=tuple(ids),
            sampler=SamplerSettings(),
            max_new_tokens=12,
            num_draft_tokens=k,
            drafting=k > 0,
        )
        for _ in backend.generate(request, threading.Event()):
            pass
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
