"""The installed llama-cpp-python, read without loading a model: whether its bindings import, which ggml CPU library
they map, whether it is specchat's patched build, and how many physical cores this process may use.

Light: llama_cpp is imported inside the functions, and nothing here imports torch (the registry's probe and the
trial child read it).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from engine.backends.base import ProgressCallback, usable_cpus
from engine.errors import first_line

# Exported by specchat's patched llama.cpp build (scripts/patch_llama_cpp.py).
PATCH_SYMBOL = "ggml_vec_dot_f16_f32"
# ... and by the build whose quantized kernels are exact (the patch's part 5): the widest pass computed row by row,
# and whether repacked Q4_K weights take the kernel whose rows all equal a one-token step.
EXACT_ROWS_SYMBOL = "specchat_exact_rows"
REPACK_EXACT_SYMBOL = "specchat_repack_exact"
UNUSABLE_HINT = "run make install or use --backend auto"


# The CPU the library runs on, for the instruction-set check (its own path: tests that fake another CPU for the
# repack choice, native.CPUINFO, still run the real library on this one).
CPUINFO = "/proc/cpuinfo"
# Written into the installed llama_cpp package by scripts/build_llama_cpp.sh: the instruction-set flags of the CPU
# the library was compiled for (a native build: -march=native).
BUILD_CPU_FILE = "specchat-build-cpu.txt"
# x86 and ARM instruction sets a native build may use: a CPU that lacks one the build machine had dies with SIGILL
# at the first kernel that uses it (no Python exception, no message).
ISA_FLAGS = frozenset(
    {
        *("sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni"),
        *("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni", "avx512vbmi"),
        *("avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"),
        *("asimd", "asimddp", "i8mm", "sve", "sve2", "bf16", "fphp", "asimdhp"),
    }
)


def read_cpu_flags(cpuinfo: str | Path) -> frozenset[str]:
    """The first CPU's feature flags (x86 `flags`, ARM `Features`) in a cpuinfo file; empty where there is none."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def build_cpu_flags() -> frozenset[str] | None:
    """The flags of the CPU the installed llama.cpp was compiled for, read without importing it; None where the
    install did not record them (a wheel from elsewhere, an older install)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / BUILD_CPU_FILE
        if path.is_file():
            return frozenset(path.read_text(encoding="utf-8", errors="replace").split())
    return None


def missing_instructions(
    built_for: frozenset[str] | None = None, flags: frozenset[str] | None = None
) -> list[str]:
    """The instruction sets the installed llama.cpp was compiled for that this CPU lacks (sorted; [] where nothing
    is recorded or the CPU's flags cannot be read)."""
    built_for = build_cpu_flags() if built_for is None else built_for
    flags = read_cpu_flags(CPUINFO) if flags is None else flags
    if not built_for or not flags:
        return []
    return sorted((built_for & ISA_FLAGS) - flags)


def probe_llamacpp(progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """(usable, reason): whether the llama.cpp bindings import here (and were compiled for this CPU: a venv moved
    to a CPU without the build's instructions would die on the first kernel, so it is refused before import)."""
    missing = missing_instructions()
    if missing:
        return False, (
            f"llama-cpp-python was compiled for a CPU with {', '.join(missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''}, which this CPU lacks (it would stop on an illegal "
            "instruction; make install builds it for this CPU)"
        )
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, or OSError from a shared library that does not load
        return False, f"llama-cpp-python is not installed or does not load ({first_line(exc)})"
    return True, f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} imports"


def ggml_cpu_library() -> Path | None:
    """The CPU backend library (libggml-cpu) of the installed llama-cpp-python; None where there is none. Its
    soname first: the file libllama maps (a wheel's `.so` is a separate copy, and opening it maps ggml twice)."""
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as raw
    except Exception:  # no bindings, or bindings that do not load
        return None
    base = Path(getattr(raw, "_base_path", Path(llama_cpp.__file__).parent / "lib"))
    return next(
        (
            base / name
            for name in ("libggml-cpu.so.0", "libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll")
            if (base / name).is_file()
        ),
        None,
    )


def loaded_ggml_cpu(library: Path | None = None) -> ctypes.CDLL | None:
    """The libggml-cpu that libllama mapped (by default `ggml_cpu_library()`, its soname); None where there is
    none. Opened with RTLD_NOLOAD first, so that no second copy of ggml is ever mapped (a wheel's `.so` and
    `.so.0` are separate files: engine/backends/llamacpp/pool.py); where nothing is mapped yet, the soname is
    loaded as libllama would load it."""
    library = ggml_cpu_library() if library is None else library
    if library is None:
        return None
    try:
        return ctypes.CDLL(str(library), mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except (OSError, AttributeError):  # not mapped (or no RTLD_NOLOAD here)
        pass
    try:
        return ctypes.CDLL(str(library))
    except OSError:  # a library that does not load
        return None


@dataclass(frozen=True, slots=True)
class ExactKernels:
    """What the patched build says of its quantized kernels: a pass of up to `rows` rows computes every row as a
    one-token step does, and `repack`: repacked Q4_K weights (llama.cpp's default) take such a kernel too."""

    rows: int
    repack: bool


def exact_kernels(library: ctypes.CDLL | None = None) -> ExactKernels | None:
    """The build's `specchat_exact_rows()` and `specchat_repack_exact()`, read from the loaded libggml-cpu
    (`library`: another one, for tests); None where they are not exported (a stock or older build)."""
    library = loaded_ggml_cpu() if library is None else library
    if library is None:
        return None
    try:
        rows = getattr(library, EXACT_ROWS_SYMBOL)
        repack = getattr(library, REPACK_EXACT_SYMBOL)
    except AttributeError:
        return None
    rows.restype = repack.restype = ctypes.c_int
    rows.argtypes = repack.argtypes = []
    return ExactKernels(rows=int(rows()), repack=int(repack()) == 1)


def raw_bindings():
    """llama_cpp.llama_cpp (the ctypes layer: `_lib`, `_base_path`); None where it does not import."""
    try:
        from llama_cpp import llama_cpp as raw
    except Exception:  # no bindings, or bindings that do not load
        return None
    return raw


def patched_build() -> bool:
    """Whether the loaded llama.cpp carries specchat's patch (scripts/patch_llama_cpp.py, applied by make install):
    float16 weights times float32 activations, one token computed exactly as a row of a batch."""
    library = loaded_ggml_cpu()
    return library is not None and hasattr(library, PATCH_SYMBOL)


def physical_cores() -> int:
    """Physical cores this process may use: llama.cpp's matrix kernels gain nothing from hyper-threads."""
    allowed = usable_cpus()
    cores: set[tuple[str, str]] = set()
    try:
        physical = core = ""
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    physical = value
                elif key == "core id":
                    core = value
                elif not key and core:
                    cores.add((physical, core))
                    physical = core = ""
        if core:
            cores.add((physical, core))
    except OSError:
        pass
    return max(1, min(allowed, len(cores) or allowed))


def build_note() -> str:
    """What `specchat doctor` adds to a usable probe: which build of llama.cpp this is."""
    if patched_build():
        return ", specchat's patched build (one kernel for one token and a batch)"
    return ", stock build (float16 models pad plain steps; make install builds the patched one)"
