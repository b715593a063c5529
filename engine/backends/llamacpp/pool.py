"""A persistent CPU thread pool for each llama.cpp context (ggml's own pool: specchat's build has no OpenMP).

llama-cpp-python attaches no pool to its contexts, and ggml then creates and joins its worker threads on every
decode: a one-token step at 2 threads ran 0.91-0.95x llama-server's (which keeps a pool) on a Zen 4 EPYC. A pool
made once per context (`ggml_threadpool_new`, `llama_attach_threadpool`) keeps the workers; they poll for the next
graph briefly (POLL) and then sleep, so between replies they leave the cores to others (a higher polling level kept
them spinning for a large part of a second after each decode, and a llama-server measured beside them ran 1.1-1.3x
slower).

One pool serves every context of a backend: the target's, a draft model's and the MTP head's take turns on it (the
round loop runs one pass at a time). With threads of their own (the head's made for each pass, a draft model's
in a pool of its own), the target's workers were still polling when their pass began, and the two sets shared 2
cores: an MTP head step that takes 2.5 ms ran 13-40 ms in one step of two (a Zen 4 EPYC, 2 cores, the Qwen3.5-0.8B-shaped Q4_K_M; 2.5 ms every time with the target's pool).
Not in the Python bindings: called through ctypes on the installed libraries. Where a symbol is missing
(another build), nothing is attached and llama.cpp works as before.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# ggml's polling level (0..100): 1 polls ~131k rounds of a CPU pause (milliseconds) before sleeping, enough to
# bridge the Python between two decodes of a reply.
POLL = 1
GGML_MAX_N_THREADS = 512  # ggml.h


class ThreadpoolParams(ctypes.Structure):
    """struct ggml_threadpool_params (ggml.h)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


def _loaded(folder: Path, name: str) -> ctypes.CDLL:
    """The copy of `name` (libggml-base, libggml-cpu) that libllama already loaded. A pip-installed wheel holds
    `name.so`, `name.so.0`, ... as separate files, not links; libllama loads its soname (`.so.0`), and opening the
    `.so` file by path would map a second copy of ggml into the process (the pool's workers in one, the graph in
    the other: a deadlock in ggml_barrier as soon as the two differ). RTLD_NOLOAD opens only what is mapped."""
    names = [f"{name}.so.0", f"{name}.so"]
    for candidate in names:
        try:
            return ctypes.CDLL(str(folder / candidate), mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
    for candidate in names:  # nothing loaded yet (another build): load the soname
        if (folder / candidate).exists():
            return ctypes.CDLL(str(folder / candidate))
    raise OSError(f"{name} not found in {folder}")


def _libraries(folder: Path) -> tuple[ctypes.CDLL, ctypes.CDLL] | None:
    """(libggml-base, libggml-cpu) with the pool functions typed; None where they are missing."""
    try:
        base = _loaded(folder, "libggml-base")
        cpu = _loaded(folder, "libggml-cpu")
        base.ggml_threadpool_params_default.restype = ThreadpoolParams
        base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
        cpu.ggml_threadpool_new.restype = ctypes.c_void_p
        cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
        cpu.ggml_threadpool_free.restype = None
        cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return base, cpu


class ThreadPool:
    """One ggml pool of `threads` workers attached to a llama.cpp context (single token and batch passes alike);
    `close()` after the context is freed. A context may run on fewer threads than its pool holds."""

    def __init__(self, handle: int, cpu: ctypes.CDLL, threads: int) -> None:
        self.handle = handle
        self.threads = threads
        self._cpu = cpu

    @classmethod
    def attach(cls, raw, ctx, threads: int, poll: int = POLL) -> ThreadPool | None:
        """`raw`: llama_cpp.llama_cpp (its `_lib` and `_base_path`); `ctx`: the llama_context pointer."""
        lib = getattr(raw, "_lib", None)
        folder = getattr(raw, "_base_path", None)
        if lib is None or folder is None or threads < 1:
            return None
        found = _libraries(Path(folder))
        attach = getattr(lib, "llama_attach_threadpool", None)
        if found is None or attach is None:
            return None
        base, cpu = found
        params = base.ggml_threadpool_params_default(threads)
        params.poll = poll
        handle = cpu.ggml_threadpool_new(ctypes.byref(params))
        if not handle:
            return None
        pool = cls(handle, cpu, threads)
        pool.attach_to(raw, ctx)
        return pool

    def attach_to(self, raw, ctx) -> None:
        """Make this pool the one `ctx` computes with (for single tokens and batches alike). A context that
        computed on another pool pauses that one at its next compute (ggml-cpu.cpp:265-268,
        ggml_backend_cpu_set_threadpool): free the old pool only after that compute, never before."""
        attach = raw._lib.llama_attach_threadpool
        attach.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        attach.restype = None
        attach(ctx, self.handle, self.handle)

    def close(self) -> None:
        if self.handle:
            self._cpu.ggml_threadpool_free(self.handle)
            self.handle = 0
