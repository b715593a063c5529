"""`make test` runs pytest on one worker per core (pytest-xdist), each pinned to its share of the CPUs, and the tests
about llama.cpp's thread count alone afterwards (marker `all_cores`): see tests/conftest.py and the Makefile."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.threads import fixed_threads, worker_group, worker_share, xdist_worker

TESTS = Path(__file__).parent


def test_each_worker_takes_every_count_th_cpu_from_its_index() -> None:
    assert worker_share("gw0", 2, [1, 0]) == [0]
    assert worker_share("gw1", 2, [0, 1]) == [1]
    assert worker_share("gw2", 4, list(range(16))) == [2, 6, 10, 14]
    assert worker_share("gw1", 3, [0, 1]) is None  # fewer CPUs than workers: they share all
    assert worker_share("gw0", 1, [0, 1]) is None
    assert worker_share("", 2, [0, 1]) is None  # not under xdist


def test_a_modules_tests_form_one_group_per_module_scoped_param_named_so_xdist_reads_it() -> None:
    harness = "tests/engine/backends/test_exactness_harness.py"
    pair = worker_group(harness, {"engine": 3})
    assert pair == f"{harness}:engine=3" and pair != worker_group(harness, {"engine": 0})
    assert worker_group("tests/x.py", {"b": 1, "a": 0}) == "tests/x.py:a=0,b=1"
    assert worker_group("tests/x.py", {}) == "tests/x.py"  # no module-scoped params: the module is the group
    # pytest-xdist's loadgroup takes the group after the id's last "@" only where no "]" follows it.
    test_id = f"{harness}::test_two_turns_on_one_cache_equal_plain[llamacpp-qwen-pair]@{pair}"
    assert test_id.rfind("@") > test_id.rfind("]")


@pytest.fixture(scope="module", params=["only"])
def grouped(request: pytest.FixtureRequest) -> str:
    return request.param


def test_make_test_groups_by_module_and_its_scoped_params_and_this_test_got_its_group(
    grouped: str, request: pytest.FixtureRequest
) -> None:
    """`make test` asks for `--dist loadgroup`; under it, this test's id carries its group (tests/conftest.py marked
    it before pytest-xdist named the groups)."""
    makefile = (TESTS.parent / "Makefile").read_text()
    assert re.search(r"pytest .*-n \$\(TEST_WORKERS\) --dist loadgroup", makefile)
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("[only]@tests/test_suite_workers.py:grouped=0"), request.node.nodeid


def test_this_worker_keeps_to_its_share() -> None:
    worker, count = xdist_worker()
    if not worker or count < 2:
        pytest.skip("not under pytest-xdist with two or more workers")
    cpus = os.sched_getaffinity(0)
    assert len(cpus) == len(worker_share(worker, count, list(range(os.cpu_count() or 1))) or cpus)
    assert fixed_threads() == min(2, len(cpus))


def test_a_test_that_fixes_two_llama_cpp_threads_runs_alone() -> None:
    """A module that asks for two threads outright either runs alone (all_cores) or asks `fixed_threads()`."""
    sources = {path.relative_to(TESTS).as_posix(): path.read_text() for path in TESTS.rglob("test_*.py")}
    offenders = [
        name
        for name, text in sources.items()
        if re.search(r"threads=2\b|LlamaCppModel\([^)]*, 2, ", text) and "all_cores" not in text
    ]
    assert offenders == []


def test_the_tmux_checks_start_a_tmux_server_of_their_own() -> None:
    """A tmux session's programs are its server's children and keep the CPU affinity of whoever started the server:
    a check that joined another worker's server ran specchat on that worker's core. tests/e2e/tmux_lib.sh sends
    every tmux command to a server named after the check's session."""
    import shutil
    import subprocess

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    script = (
        f"NAME=check SIZE=80x24 SESSION=own-server-$$ SPECCHAT=/bin/true; source '{TESTS / 'e2e' / 'tmux_lib.sh'}'; "
        "tmux new-session -d -s \"$SESSION\" 'sleep 30'; tmux list-sessions -F '#{socket_path} #{session_name}'"
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    socket, session = result.stdout.split()
    assert Path(socket).name == session and session.startswith("own-server-"), result.stdout
    assert not Path(socket).exists(), "the check's server and its socket are gone when it ends"


def test_a_file_the_tests_quantize_is_made_once_per_machine_and_again_for_a_newer_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The row-invariance weights (IQ4_NL of the embedded model: ~45 s on a Zen 1 core) were quantized into a temporary
    # folder on every run; now into specchat's cache, like the models the tests fetch or build.
    from tests.support import models_2026

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    made: list[str] = []

    def quantize(source: Path, dest: Path, ftype: str) -> Path:
        made.append(ftype)
        dest.write_bytes(source.read_bytes() + ftype.encode())
        return dest

    monkeypatch.setattr(models_2026, "quantize", quantize)
    source = tmp_path / "model.F16.gguf"
    source.write_bytes(b"GGUF")
    first = models_2026.quantized(source, "iq4_nl")
    assert first.read_bytes() == b"GGUFIQ4_NL" and first.is_relative_to(tmp_path / "cache")
    assert models_2026.quantized(source, "IQ4_NL") == first and made == ["IQ4_NL"]  # the cached file
    os.utime(source, (first.stat().st_mtime + 10, first.stat().st_mtime + 10))  # a source written since
    assert models_2026.quantized(source, "IQ4_NL") == first and made == ["IQ4_NL", "IQ4_NL"]
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no partial file left
