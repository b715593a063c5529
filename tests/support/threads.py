"""Threads under the test runner: the count a test gives llama.cpp where it wants a fixed one (no measuring at
load), and the share of the CPUs each pytest-xdist worker keeps to (tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence


def fixed_threads() -> int:
    """Two where this process may use two cores; one where pytest-xdist gave this worker one core: two llama.cpp
    threads on one core wait a time slice at every ggml barrier, and a test then runs minutes instead of seconds."""
    # Imported here: tests/conftest.py imports this module before it pins a worker, and the engine's package
    # brings numpy, whose BLAS sizes its threads from the CPUs it sees when it loads.
    from engine.backends.base import usable_cpus

    return min(2, usable_cpus())


def xdist_worker() -> tuple[str, int]:
    """This process's pytest-xdist worker name ("" outside xdist) and the number of workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def worker_share(worker: str, count: int, cpus: Sequence[int]) -> list[int] | None:
    """The CPUs pytest-xdist's `worker` ("gw0", "gw1", ...) of `count` keeps to: every count-th of `cpus` from its
    index. None outside xdist, with one worker, or with fewer CPUs than workers (then they share them all)."""
    if not worker.startswith("gw") or count < 2 or len(cpus) < count:
        return None
    return sorted(cpus)[int(worker[2:]) % count :: count]


def worker_group(module: str, params: dict[str, int]) -> str:
    """The pytest-xdist group (`make test` runs `--dist loadgroup`) of a test in `module` whose module-scoped
    parametrized fixtures take the param indexes `params` (name -> index). A module's tests run on one worker, which
    builds its module-scoped fixtures once (a loaded model, a GPU bundle, a prefilled cache); a module parametrized
    by one (the exactness harness's engines) splits by param: each engine's tests on one worker, the engines spread.
    Under `load`, and under `loadgroup` with a test alone, a module's tests went to both workers and both built
    them: the Qwen2.5-Coder pair prefilled its 600-token prompt on each.

    The name never ends in "]": pytest-xdist takes the group from a test id only where its last "@" follows its
    last "]" (xdist/scheduler/loadgroup.py `_split_scope`); a name like "module[engine]" leaves every test alone."""
    if not params:
        return module
    return module + ":" + ",".join(f"{name}={index}" for name, index in sorted(params.items()))
