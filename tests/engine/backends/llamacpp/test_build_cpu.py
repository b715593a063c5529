"""A venv moved to a CPU without the instructions its llama.cpp was compiled for (-march=native) would die with
SIGILL at the first kernel: the install records the build CPU's flags, and the probe refuses in one line first."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.llamacpp import library
from engine.errors import BackendError


def fake_cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    return path


def test_instruction_sets_the_build_used_and_this_cpu_lacks() -> None:
    built = frozenset({"fpu", "avx2", "fma", "avx512f", "avx512bw", "amx_tile"})
    assert library.missing_instructions(built, frozenset({"fpu", "avx2", "fma"})) == [
        "amx_tile",
        "avx512bw",
        "avx512f",
    ]
    assert library.missing_instructions(built, built) == []
    # nothing recorded, or no flags readable (another OS): no verdict, the import decides as before
    assert library.missing_instructions(frozenset(), frozenset({"avx2"})) == []
    assert library.missing_instructions(built, frozenset()) == []


def test_a_build_for_another_cpu_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    from engine.backends.select import create_backend
    from tests.support.settings import backend_settings

    monkeypatch.setattr(
        library, "build_cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f", "avx512_vnni"})
    )
    monkeypatch.setattr(library, "CPUINFO", str(fake_cpuinfo(tmp_path, "fpu sse4_2 avx avx2 fma f16c")))
    # (native.CPUINFO, the CPU the repack choice reads, is faked by other tests that still run the real library)
    usable, reason = library.probe_llamacpp()
    assert not usable
    assert reason == (
        "llama-cpp-python was compiled for a CPU with avx512_vnni, avx512f, which this CPU lacks (it would stop "
        "on an illegal instruction; make install builds it for this CPU)"
    )
    with pytest.raises(
        BackendError, match="^llama.cpp is unusable here: llama-cpp-python was compiled for a CPU"
    ):
        create_backend(backend_settings(None, "llamacpp"))
    # the same CPU (its flags a superset): usable
    monkeypatch.setattr(
        library, "CPUINFO", str(fake_cpuinfo(tmp_path, "avx2 fma avx512f avx512_vnni amx_tile"))
    )
    assert library.probe_llamacpp()[0]


def test_make_install_records_the_cpu_it_compiled_for() -> None:
    if not library.probe_llamacpp()[0]:
        pytest.skip("llama-cpp-python is not installed")
    recorded = library.build_cpu_flags()
    assert recorded, "scripts/build_llama_cpp.sh writes specchat-build-cpu.txt beside the installed package"
    assert library.missing_instructions(recorded) == []
