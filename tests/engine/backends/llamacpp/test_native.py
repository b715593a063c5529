"""Quantized GGUFs must not kill specchat on any x86 CPU (llama.cpp's AMX repack segfaults on some Xeons).

The decision is tested on cpuinfo files of other CPUs (a Sapphire Rapids Xeon with AMX, an AVX2 desktop), since
the machine running the tests may have no AMX. Crashes are planted for real: the trial child kills itself with
SIGSEGV (`SPECCHAT_PLANT_NATIVE_CRASH`), which its parent sees exactly as a crash inside llama.cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.llamacpp import native as native
from engine.backends.llamacpp.library import ExactKernels, exact_kernels
from engine.errors import BackendError
from tests.support import native_guard, paths

# /proc/cpuinfo of a 4th-generation Xeon (Sapphire Rapids), as a cloud VM shows it: AMX and AVX512-FP16.
SAPPHIRE_RAPIDS_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht "
    "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni "
    "pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c "
    "rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase "
    "tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
    "avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat "
    "avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg tme "
    "avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16 avx512_fp16 "
    "amx_tile amx_int8 flush_l1d arch_capabilities"
)
AVX2_DESKTOP_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 fma cx16 "
    "sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm abm sse4a bmi1 avx2 smep bmi2 rdseed adx "
    "smap clflushopt sha_ni xsaveopt xsavec xgetbv1 clzero arat"
)


def cpuinfo(tmp_path: Path, flags: str, cpus: int = 2) -> Path:
    blocks = [
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: a CPU\nphysical id\t: 0\n"
        f"core id\t\t: {i}\nflags\t\t: {flags}\n"
        for i in range(cpus)
    ]
    path = tmp_path / f"cpuinfo-{abs(hash(flags)) % 10_000}"
    path.write_text("\n".join(blocks))
    return path


# --- the decision, on other CPUs ------------------------------------------------------------------------------


def test_a_cpu_with_amx_turns_repacking_off(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS))
    assert {"amx_tile", "amx_int8", "avx512_fp16"} <= flags
    for exact in (True, False):  # specchat's backend and llama.cpp's own peers alike
        choice = native.choose_repack(flags, environ={}, exact=exact)
        assert choice.enabled is False and choice.for_amx
        assert "AMX" in choice.reason and "amx_int8" in choice.reason
        assert choice.server_args() == ["--no-repack"]


# What the patched build exports (library.exact_kernels): exact up to 64 rows, repacked Q4_K on the exact kernel.
EXACT_BUILD = ExactKernels(rows=64, repack=True)


def test_without_amx_the_peers_keep_llama_cpps_default(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS))
    for kernels in (EXACT_BUILD, None):  # whatever the build: llama.cpp's own default
        peer = native.choose_repack(flags, environ={}, exact=False, kernels=kernels)
        assert peer.enabled is True and peer.server_args() == []


def test_ours_repacks_where_the_build_says_its_repacked_kernels_are_exact(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS))
    ours = native.choose_repack(flags, environ={}, kernels=EXACT_BUILD)
    assert ours.enabled is True and ours.exact and "64" in ours.reason
    # A build without the exports (stock, or the patch before part 5): repacked kernels would pad plain steps.
    old = native.choose_repack(flags, environ={}, kernels=None)
    assert old.enabled is False and not old.for_amx and "padded" in old.reason
    # Exports saying repacked Q4_K takes the stock kernels (ARM: the patch's kernels are x86-only).
    arm = native.choose_repack(flags, environ={}, kernels=ExactKernels(rows=64, repack=False))
    assert arm.enabled is False and "padded" in arm.reason
    # Exact, but narrower than the widest verify pass the loop sends (the probe's 49 rows).
    narrow = native.choose_repack(flags, environ={}, kernels=ExactKernels(rows=32, repack=True))
    assert narrow.enabled is False and "32" in narrow.reason and "49" in narrow.reason
    assert native.choose_repack(flags, environ={}, kernels=ExactKernels(rows=49, repack=True)).enabled


def test_an_amx_cpu_keeps_repacking_off_even_with_exact_kernels(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS))
    choice = native.choose_repack(flags, environ={}, kernels=EXACT_BUILD)
    assert choice.enabled is False and choice.for_amx


def test_the_environment_overrides_exact_kernels(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS))
    off = native.choose_repack(flags, environ={native.REPACK_ENV: "off"}, kernels=EXACT_BUILD)
    assert off.enabled is False and native.REPACK_ENV in off.reason
    assert native.choose_repack(flags, environ={native.REPACK_ENV: "on"}, kernels=None).enabled is True


def test_a_file_with_weights_the_patch_leaves_stock_loads_unpacked(tmp_path: Path) -> None:
    flags = native.cpu_flags(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS))
    ours = native.choose_repack(flags, environ={}, kernels=EXACT_BUILD)
    assert ours.for_types(["Q4_K", "Q6_K", "Q8_0", "Q5_0"]) is ours  # a Qwen Q4_K_M: repacked
    q4_0 = ours.for_types(["Q4_0", "Q6_K"])
    assert q4_0.enabled is False and "Q4_0" in q4_0.reason
    # Only an exact choice is narrowed: the peers and a forced "on" repack what llama.cpp repacks.
    peer = native.choose_repack(flags, environ={}, exact=False)
    assert peer.for_types(["Q4_0"]).enabled is True
    forced = native.choose_repack(flags, environ={native.REPACK_ENV: "on"})
    assert forced.for_types(["Q4_0"]).enabled is True


def test_the_exports_are_read_from_the_ggml_cpu_library(tmp_path: Path) -> None:
    # Tiny shared libraries with and without the symbols, read as exact_kernels reads the loaded libggml-cpu.
    import ctypes
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")

    def library(name: str, source: str) -> ctypes.CDLL:
        c, so = tmp_path / f"{name}.c", tmp_path / f"lib{name}.so"
        c.write_text(source)
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(so), str(c)], check=True, timeout=60)
        return ctypes.CDLL(str(so))

    both = library(
        "both", "int specchat_exact_rows(void){return 64;} int specchat_repack_exact(void){return 1;}"
    )
    assert exact_kernels(both) == ExactKernels(rows=64, repack=True)
    arm = library(
        "arm", "int specchat_exact_rows(void){return 64;} int specchat_repack_exact(void){return 0;}"
    )
    assert exact_kernels(arm) == ExactKernels(rows=64, repack=False)
    older = library("older", "int ggml_vec_dot_f16_f32(void){return 0;}")
    assert exact_kernels(older) is None


@pytest.mark.slow
def test_the_installed_build_is_read_from_the_copy_libllama_loaded() -> None:
    # The lookup must not map a second libggml-cpu (pool.py: a pip wheel's .so and .so.0 are separate files).
    from engine.backends.llamacpp.library import loaded_ggml_cpu, patched_build

    if not patched_build():
        pytest.skip("a stock llama.cpp build")
    import llama_cpp  # noqa: F401  (libllama and its ggml mapped)

    def mapped() -> set[str]:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return {line.split()[-1] for line in maps if "libggml-cpu" in line}

    before = mapped()
    kernels = exact_kernels()
    assert loaded_ggml_cpu() is not None and mapped() == before and len(before) == 1
    if kernels is not None:  # the build with the exact quantized kernels
        assert kernels.rows >= 49


def test_the_environment_overrides_the_choice(tmp_path: Path) -> None:
    amx = native.cpu_flags(cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS))
    assert native.choose_repack(amx, environ={native.REPACK_ENV: "on"}).enabled is True
    assert native.choose_repack([], environ={native.REPACK_ENV: "off"}).enabled is False
    assert native.choose_repack([], environ={native.REPACK_ENV: "whatever"}, exact=False).enabled is True


def test_no_cpuinfo_means_no_amx(tmp_path: Path) -> None:
    assert native.cpu_flags(tmp_path / "missing") == frozenset()
    assert (
        native.choose_repack(native.cpu_flags(tmp_path / "missing"), environ={}, exact=False).enabled is True
    )


def test_llama_server_gets_no_repack_on_an_amx_cpu(tmp_path: Path, monkeypatch) -> None:
    from engine.benchmarks import llama_server

    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("SPECCHAT_LLAMA_SERVER_DIR", str(tmp_path))
    monkeypatch.delenv(native.REPACK_ENV, raising=False)
    monkeypatch.setattr(native, "CPUINFO", str(cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS)))
    assert "--no-repack" in llama_server.LlamaServer(Path("m.gguf")).args
    monkeypatch.setattr(native, "CPUINFO", str(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS)))
    assert "--no-repack" not in llama_server.LlamaServer(Path("m.gguf")).args


def test_a_crash_is_named_by_its_signal() -> None:
    assert native.signal_name(-11) == "SIGSEGV"
    assert native.signal_name(-6) == "SIGABRT"
    assert native.signal_name(0) is None and native.signal_name(2) is None


# --- the test suite survives a crash ----------------------------------------------------------------------------


def test_a_planted_crash_fails_one_test_and_the_suite_goes_on(tmp_path: Path) -> None:
    # A real pytest run over a module whose model fixture meets a child that dies of SIGSEGV: that test fails,
    # naming the signal; the next test still runs and passes.
    module = tmp_path / "test_planted.py"
    module.write_text(
        "import sys\n"
        "import pytest\n"
        "from tests.support.native_guard import survives\n"
        "CRASH = [sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)']\n"
        "@pytest.fixture\n"
        "def model():\n"
        "    survives('planted.gguf', command=CRASH)\n"
        "def test_needs_the_model(model):\n"
        "    pass\n"
        "def test_after_it():\n"
        "    assert 1 + 1 == 2\n"
    )
    root = paths.ROOT
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(module),
            "--rootdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout
    assert "1 passed, 1 error" in done.stdout, done.stdout
    assert "SIGSEGV" in done.stdout and "planted.gguf" in done.stdout


def test_the_guard_remembers_a_pass_on_disk_and_tries_a_crash_again(tmp_path: Path, monkeypatch) -> None:
    """The next run (a new process: the per-process verdicts gone) starts no child for a file that passed."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    children: list[int] = []

    def run(command, **kwargs):
        children.append(1)
        return subprocess.CompletedProcess(command, returncode=status, stdout="", stderr="Segmentation fault")

    monkeypatch.setattr(native_guard.subprocess, "run", run)
    monkeypatch.setattr(native_guard, "_verdicts", {})
    status = 0
    native_guard.survives(model)
    monkeypatch.setattr(native_guard, "_verdicts", {})
    native_guard.survives(model)
    assert len(children) == 1
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    status = -11
    with pytest.raises(pytest.fail.Exception, match="SIGSEGV"):
        native_guard.survives(other)
    monkeypatch.setattr(native_guard, "_verdicts", {})
    with pytest.raises(pytest.fail.Exception, match="SIGSEGV"):
        native_guard.survives(other)  # a crash is tried again, never remembered as a pass
    assert len(children) == 3


# --- the trial, on the embedded model's real Q4_1 GGUF ------------------------------------------------------------

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def q4_1() -> Path:
    from engine.models import ensure_embedded_gguf

    return ensure_embedded_gguf(precision="q4_1")


@pytest.mark.slow
def test_the_q4_1_gguf_has_repackable_weights_and_the_f16_none(q4_1: Path) -> None:
    from engine.models import ensure_embedded_gguf

    assert "Q4_1" in native.repacked_types(q4_1)
    assert native.repacked_types(ensure_embedded_gguf()) == []  # F16: no extra buffer type takes it, no trial


def safe_repack() -> bool:
    """Repacking where this CPU survives it, as llama.cpp's own peers get it (`choose_repack`, no override): off on
    AMX CPUs, where llama.cpp's repack of Q4 weights really crashes (llama.cpp#20824; seen on this project's AMX
    Xeon: SIGSEGV in the trial of SmolLM2 Q4_1 and Qwen 0.5B Q4_K_M)."""
    return native.choose_repack(environ={}, exact=False).enabled


def test_the_build_is_known_by_its_libraries_bytes_not_their_install_time(
    tmp_path: Path, monkeypatch
) -> None:
    """A fresh venv holding the same wheel keeps the remembered trials and probes; a rebuilt library does not."""
    import types

    lib = tmp_path / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "libllama.so").write_bytes(b"build one")
    fake = types.ModuleType("llama_cpp")
    fake.__file__ = str(tmp_path / "llama_cpp" / "__init__.py")
    fake.__version__ = "0.3.36"
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    first = native._library_identity()
    os.utime(lib / "libllama.so", ns=(1, 1))  # the same bytes installed at another time
    assert native._library_identity() == first
    (lib / "libllama.so").write_bytes(b"build two")  # same size, other bytes: another build
    os.utime(lib / "libllama.so", ns=(2, 2))
    assert native._library_identity() != first


@pytest.mark.slow
def test_a_trial_passes_once_and_is_remembered(q4_1: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(native.PLANT_ENV, raising=False)
    store = tmp_path / "trials.json"
    repack = safe_repack()
    first = native.trial_decode(q4_1, repack=repack, threads=1, store=store)
    assert first.ok and not first.remembered and first.seconds > 0
    again = native.trial_decode(q4_1, repack=repack, threads=1, store=store)
    assert again.ok and again.remembered
    other = native.trial_decode(q4_1, repack=not repack, threads=1, store=store)  # another key: a child again
    assert not other.remembered
    if repack:
        assert other.ok
    else:  # with repacking on an AMX CPU: the real crash, a verdict in the child, the parent alive
        assert other.ok or other.crashed == "SIGSEGV"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["load", "decode"])
def test_a_crash_in_the_child_is_a_verdict_not_a_dead_parent(
    q4_1: Path, tmp_path: Path, monkeypatch, point: str
) -> None:
    monkeypatch.setenv(native.PLANT_ENV, point)
    store = tmp_path / "trials.json"
    repack = safe_repack()
    trial = native.trial_decode(q4_1, repack=repack, threads=1, store=store)
    assert trial.crashed == "SIGSEGV"
    assert native.trial_decode(q4_1, repack=repack, threads=1, store=store).remembered
    monkeypatch.delenv(native.PLANT_ENV)
    assert native.trial_decode(
        q4_1, repack=repack, threads=1, store=store
    ).ok  # the planted verdict stays apart


@pytest.mark.slow
def test_a_crash_with_repacking_only_loads_without_it_and_says_so(
    q4_1: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(native.PLANT_ENV, "decode")
    monkeypatch.setenv(native.PLANT_REPACK_ONLY_ENV, "1")
    plan = native.plan_load(q4_1, native.RepackChoice(True, "on"), threads=1, store=tmp_path / "t.json")
    assert plan.repack is False
    assert len(plan.notes) == 1 and "SIGSEGV" in plan.notes[0] and "repacking is off" in plan.notes[0]


@pytest.mark.slow
def test_a_crash_every_way_is_one_line(q4_1: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(native.PLANT_ENV, "decode")
    with pytest.raises(BackendError) as caught:
        native.plan_load(q4_1, native.RepackChoice(True, "on"), threads=1, store=tmp_path / "t.json")
    message = str(caught.value)
    assert "\n" not in message and "SIGSEGV" in message and q4_1.name in message
    assert "transformers" in message and "Troubleshooting" in message


# --- the backend and the commands ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_on_an_amx_cpu_the_backend_loads_without_repacking_and_answers(
    q4_1: Path, tmp_path: Path, monkeypatch
) -> None:
    import threading

    from engine.backends.llamacpp import LlamaCppBackend
    from engine.config import load_settings
    from engine.events import ReplyFinished
    from engine.session import ChatSession

    monkeypatch.delenv(native.REPACK_ENV, raising=False)
    monkeypatch.setattr(native, "CPUINFO", str(cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS)))
    backend = LlamaCppBackend(q4_1, draft="ngram", cache_mode="fp16", max_context=512)
    session = ChatSession(load_settings(), backend=backend)
    session.load()
    try:
        assert backend.repack_by_file[q4_1] is False and backend.target.repack is False
        # Off for AMX, said as such (specchat's exact backend runs unpacked anyway: the AMX reason is what must
        # show), and off for llama.cpp's own peers too, which repack everywhere else.
        assert backend.repack.for_amx and any("AMX" in note for note in backend.info.notes)
        assert native.choose_repack(exact=False).server_args() == ["--no-repack"]
        monkeypatch.setattr(native, "CPUINFO", str(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS)))
        assert native.choose_repack(exact=False).server_args() == []
        # Greedy, with and without drafting, over two turns (the Q4_1 model answers this phrasing right).
        session.set_mode("qa")
        session.set_overrides(temperature=0.0, max_new_tokens=24)
        replies = {}
        for drafting in (True, False):
            session.set_overrides(temperature=0.0, max_new_tokens=24, drafting=drafting)
            texts = []
            for question in ("What is the capital city of France? Answer in one sentence.", "And of Italy?"):
                result = session.send(question, lambda event: None, threading.Event())
                assert isinstance(result, ReplyFinished)
                texts.append(result.text)
            replies[drafting] = texts
            session.new_chat()
        assert "Paris" in replies[False][0], replies
        assert replies[True] == replies[False]
    finally:
        backend.close()


@pytest.mark.slow
def test_without_amx_the_backend_repacks_where_the_build_is_exact_or_asked(
    q4_1: Path, tmp_path: Path, monkeypatch
) -> None:
    from engine.backends.llamacpp import LlamaCppBackend

    monkeypatch.delenv(native.REPACK_ENV, raising=False)
    monkeypatch.setattr(native, "CPUINFO", str(cpuinfo(tmp_path, AVX2_DESKTOP_FLAGS)))
    kernels = exact_kernels()
    exact = kernels is not None and kernels.repack and kernels.rows >= 49  # the installed build's own word
    for asked, expected in ((None, exact), ("on", True), ("off", False)):
        if asked:
            monkeypatch.setenv(native.REPACK_ENV, asked)
        backend = LlamaCppBackend(q4_1, draft="none", cache_mode="fp16", max_context=512, probe_kernels=False)
        backend.load()
        try:
            crashed = any("crashed" in note for note in backend.info.notes)  # only on a real AMX CPU
            assert backend.target.repack is (expected and not crashed)
            assert not any("AMX" in note for note in backend.info.notes)
        finally:
            backend.close()


REPACK_LOG_SCRIPT = """
import sys
import llama_cpp
from llama_cpp import _internals
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
params.use_extra_bufts = sys.argv[2] == "1"
_internals.LlamaModel(path_model=sys.argv[1], params=params, verbose=True)
"""


@pytest.mark.slow
def test_the_switch_reaches_llama_cpp(tmp_path: Path) -> None:
    # What use_extra_bufts does inside llama.cpp, read from its own load log on a model with repackable weights
    # (Gemma 3 270M Q4_K_M: Q4_K/Q6_K/Q8_0 take the CPU repack on AVX2/NEON CPUs, the AMX buffer on AMX ones).
    from tests.support.real_gguf import gemma3_gguf

    try:
        path = gemma3_gguf()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    native_guard.survives(path)

    def buffers(repack: bool) -> str:
        done = subprocess.run(
            [sys.executable, "-c", REPACK_LOG_SCRIPT, str(path), "1" if repack else "0"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return "\n".join(line for line in done.stderr.splitlines() if "model buffer size" in line)

    flags = native.cpu_flags()
    if not ({"avx2", "amx_int8"} & flags or "asimd" in flags):
        pytest.skip("this CPU has no repack kernels in llama.cpp")
    assert "REPACK" in buffers(True) or "AMX" in buffers(True)
    assert "REPACK" not in buffers(False) and "AMX" not in buffers(False)


@pytest.mark.slow
def test_generate_with_a_planted_crash_is_one_line_and_a_non_zero_exit(q4_1: Path, tmp_path: Path) -> None:
    import os

    env = {
        **os.environ,
        native.PLANT_ENV: "decode",
        "PYTHONPATH": str(Path(native.__file__).resolve().parents[2]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "generate", "--backend", "llamacpp", "--model", str(q4_1)]
        + ["--prompt", "What is the capital of France?"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode != 0 and done.returncode > 0  # an exit, not a death by signal
    errors = [line for line in done.stderr.splitlines() if "crashed" in line]
    assert len(errors) == 1 and "SIGSEGV" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
