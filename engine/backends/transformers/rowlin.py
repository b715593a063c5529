"""The row-invariant linear kernel (rowlin.c): compiled once per machine on first use, loaded with ctypes.

Why a kernel of our own: PyTorch's CPU linears are either fast for one row (MKL's gemv) or row-invariant
(oneDNN with prepacked weights, slower for one row), never both, and MKL's small-M gemm re-packs the
weight on every call (a pass of 4+ rows costs far more than one row; figures: docs/performance.md). rowlin.c
sums every output over k in order, one fused multiply-add per step, whatever the number of rows: speculative
decoding is bit-exact, a one-token step is as fast as MKL's gemv, and a verify pass of 1 + K tokens streams the
weights once.

It is built with the machine's C compiler (`$CC`, else `cc`/`gcc`/`clang`) for the machine's own vector
instructions into specchat's cache folder (under a second, once); the shared library's name carries a hash of
the source, the flags, the compiler and the CPU (`machine_signature`: the feature flags of /proc/cpuinfo on x86
and ARM, the platform's own names where there is no /proc), so a new version or another CPU builds anew.

Loading a shared library runs its constructors, so a cached file is loaded only when only this user could have
written it: the file and its folder owned by this user, neither group- nor world-writable, the file not a link.
Otherwise, and when a cached library fails to load or fails its self-check (linears and both attention kernels),
it is built once more in a fresh private folder. Where there is no compiler or the fresh build fails its
self-check too, `load()` returns the reason and the backend keeps the oneDNN kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

SOURCE = Path(__file__).with_name("rowlin.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
# Passes of more rows than this (prefill) take PyTorch's own gemm: fast for many rows, and their exact bits
# do not matter (plain and speculative decoding prefill the same prompt the same way).
MAX_ROWS = 32
COMPILE_TIMEOUT_S = 120

_lock = threading.Lock()
_loaded: tuple[Kernel | None, str | None] | None = None


@dataclass(frozen=True)
class Kernel:
    lib: ctypes.CDLL
    lanes: int
    path: Path

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[N, K] -> [N_padded / lanes, K, lanes], contiguous float32 (padded outputs are zero)."""
        n, k = weight.shape
        padded = -(-n // self.lanes) * self.lanes
        w = weight.detach().float()
        if padded != n:
            w = torch.cat([w, w.new_zeros(padded - n, k)])
        return w.reshape(padded // self.lanes, self.lanes, k).transpose(1, 2).contiguous()

    def pack_bias(self, bias: torch.Tensor | None) -> torch.Tensor | None:
        """The bias padded like the packed weight's outputs (None stays None)."""
        if bias is None:
            return None
        n = bias.shape[0]
        padded = -(-n // self.lanes) * self.lanes
        bias = bias.detach().float()
        return (bias if padded == n else torch.cat([bias, bias.new_zeros(padded - n)])).contiguous()

    def linear(
        self, rows: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """rows [M, K] (float32) times the packed weight plus the packed bias (`pack_bias`): [M, out_features]."""
        rows = rows.contiguous()
        m, k = rows.shape
        padded = packed.shape[0] * self.lanes
        out = torch.empty((m, padded), dtype=torch.float32)
        self.lib.rowlin(
            rows.data_ptr(),
            m,
            k,
            packed.data_ptr(),
            padded,
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out if padded == out_features else out[:, :out_features]


def cached_attention(kernel: Kernel, query: torch.Tensor, layer, scale: float) -> torch.Tensor:
    """Attention of `query` [1, Hq, rows, D] (float32: the last `rows` of the layer's `length` tokens) over a
    fused cache layer (engine/backends/transformers/cache.py): keys [1, Hkv, capacity / hf_cache.KEY_BLOCK, D, KEY_BLOCK], values
    [1, Hkv, capacity, D], int8 with scales [1, Hkv, capacity, 1] or float32 without. Each query row sees
    exactly its own prefix. Returns [1, rows, Hq, D] (transformers' layout after attention)."""
    _, hq, rows, dim = query.shape
    values = layer._value_buffer
    hkv, capacity = values.shape[1], values.shape[2]
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty((1, rows, hq, dim), dtype=torch.float32)
    int8 = values.dtype == torch.int8
    function = kernel.lib.q8attn if int8 else kernel.lib.f32attn
    failed = function(
        query.data_ptr(),
        query.stride(2),
        query.stride(1),
        layer._key_buffer.data_ptr(),
        layer._key_scales.data_ptr() if int8 else None,
        values.data_ptr(),
        layer._value_scales.data_ptr() if int8 else None,
        capacity,
        rows,
        hq,
        hkv,
        dim,
        layer.length - rows,
        scale,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("cache attention: out of memory for the scores")
    return out


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


# The /proc/cpuinfo fields that say what -march=native builds for: x86's `flags`, ARM's `Features` and its
# core's identity (the same feature list on two different cores can still tune differently).
CPU_FIELDS = (
    "flags",
    "Features",
    "CPU implementer",
    "CPU architecture",
    "CPU variant",
    "CPU part",
    "model name",
)


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None


def machine_signature(cpuinfo: str | None) -> str:
    """What identifies this CPU for a native build: the CPU_FIELDS of /proc/cpuinfo (the first processor's),
    or, where there is none (macOS, some containers) or it names none of them, the platform's names
    (system, release, machine, processor, node: a machine id, so a shared home never hands one machine's build to
    another)."""
    found: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name in CPU_FIELDS and name not in found:
            found[name] = " ".join(sorted(value.split())) if name in ("flags", "Features") else value.strip()
    if found:
        return "cpuinfo\0" + "\0".join(f"{name}={found[name]}" for name in CPU_FIELDS if name in found)
    uname = platform.uname()
    return "uname\0" + "\0".join([uname.system, uname.release, uname.machine, uname.processor, uname.node])


def _library_path(compiler: str, folder: Path) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), " ".join(FLAGS), version, platform.machine(), machine_signature(_cpuinfo())]
        ).encode()
    ).hexdigest()[:16]
    return folder / f"rowlin-{digest}.so"


def unsafe_reason(path: Path) -> str | None:
    """None if only this user could have written `path` (a file or folder); else why not, in a few words."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return "it belongs to another user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "it is group- or world-writable"
    return None


def _tighten(folder: Path) -> None:
    """Drop group/world write from a folder of ours (an old umask's 0775): after that, only this user can
    put files in it, and each file's own owner and mode say whether it is ours."""
    with contextlib.suppress(OSError):
        info = os.lstat(folder)
        loose = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if loose and stat.S_ISDIR(info.st_mode) and (not hasattr(os, "getuid") or info.st_uid == os.getuid()):
            os.chmod(folder, stat.S_IMODE(info.st_mode) & ~loose)


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            raise RuntimeError(lines[0] if lines else f"{compiler} exited with {result.returncode}")
        os.chmod(built, 0o755)  # whatever the umask: never group-writable, or the next load refuses it
        os.replace(built, target)  # atomic: a second process never loads a half-written file


def _open(path: Path) -> Kernel:
    lib = ctypes.CDLL(str(path))
    lib.rowlin.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    lib.rowlin.restype = None
    lib.rowlin_lanes.restype = ctypes.c_int
    lib.q8attn.argtypes = lib.f32attn.argtypes = [
        ctypes.c_void_p,  # q
        ctypes.c_long,  # q row stride
        ctypes.c_long,  # q head stride
        ctypes.c_void_p,  # keys (blocked int8)
        ctypes.c_void_p,  # key scales
        ctypes.c_void_p,  # values (int8)
        ctypes.c_void_p,  # value scales
        ctypes.c_long,  # capacity
        ctypes.c_int,  # rows
        ctypes.c_int,  # query heads
        ctypes.c_int,  # key/value heads
        ctypes.c_int,  # head dim
        ctypes.c_int,  # past
        ctypes.c_float,  # scale
        ctypes.c_void_p,  # out
        ctypes.c_int,  # threads
    ]
    lib.q8attn.restype = lib.f32attn.restype = ctypes.c_int
    return Kernel(lib, int(lib.rowlin_lanes()), path)


def self_check(kernel: Kernel) -> str | None:
    """None if the kernel is row-invariant and agrees with PyTorch (its linears and both cache attentions);
    else what is wrong."""
    generator = torch.Generator().manual_seed(0)
    for n, k in ((96, 1536), (40, 576)):  # a padded width too
        weight = torch.randn(n, k, generator=generator) * 0.05
        bias = torch.randn(n, generator=generator)
        x = torch.randn(13, k, generator=generator)
        packed, packed_bias = kernel.pack(weight), kernel.pack_bias(bias)
        together = kernel.linear(x, packed, n, packed_bias)
        alone = torch.cat([kernel.linear(x[i : i + 1], packed, n, packed_bias) for i in range(x.shape[0])])
        if not torch.equal(together, alone):
            return "its rows depend on the number of rows in a call"
        if not torch.allclose(together, torch.nn.functional.linear(x, weight, bias), atol=1e-4, rtol=1e-4):
            return "it disagrees with PyTorch's linear"
    for int8 in (True, False):
        problem = _check_attention(kernel, int8, generator)
        if problem:
            return f"{'q8' if int8 else 'f32'} attention: {problem}"
    return None


def _check_attention(kernel: Kernel, int8: bool, generator: torch.Generator) -> str | None:
    """Cache attention over a small fused layer (hf_cache's layout, 3 key blocks, grouped heads) against
    softmax(q·k)·v in PyTorch, and every query row alone against the same row in a 5-row call."""
    from engine.backends.transformers.cache import KEY_BLOCK  # the one layout constant (rowlin.c: KBLOCK)

    kv_heads, query_heads, dim, capacity, length, rows = 2, 6, 64, 3 * KEY_BLOCK, 37, 5
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    if int8:
        key_scales = torch.rand(1, kv_heads, capacity, 1, generator=generator) * 0.02 + 0.005
        value_scales = torch.rand(1, kv_heads, capacity, 1, generator=generator) * 0.02 + 0.005
        stored_keys = (keys * 40).round().clamp(-127, 127).to(torch.int8)
        stored_values = (values * 40).round().clamp(-127, 127).to(torch.int8)
        keys, values = stored_keys.float() * key_scales, stored_values.float() * value_scales
    else:
        key_scales = value_scales = None
        stored_keys, stored_values = keys, values
    blocked = stored_keys.reshape(1, kv_heads, capacity // KEY_BLOCK, KEY_BLOCK, dim).transpose(-1, -2)
    layer = SimpleNamespace(
        _key_buffer=blocked.contiguous(),
        _value_buffer=stored_values.contiguous(),
        _key_scales=key_scales,
        _value_scales=value_scales,
        length=length,
    )
    query = torch.randn(1, query_heads, rows, dim, generator=generator)
    scale = dim**-0.5
    try:
        together = cached_attention(kernel, query, layer, scale)
        alone = []
        for j in range(rows):
            layer.length = length - rows + j + 1
            alone.append(cached_attention(kernel, query[:, :, j : j + 1], layer, scale))
    except MemoryError:
        return "it ran out of memory on a tiny layer"
    if not torch.equal(together, torch.cat(alone, dim=1)):
        return "its rows depend on the number of rows in a call"
    group = query_heads // kv_heads
    expected = torch.empty_like(together)
    for j in range(rows):
        visible = length - rows + j + 1
        for h in range(query_heads):
            k, v = keys[0, h // group, :visible], values[0, h // group, :visible]
            weights = torch.softmax((k @ query[0, h, j]) * scale, dim=0)
            expected[0, j, h] = weights @ v
    if not torch.allclose(together, expected, atol=1e-5, rtol=1e-4):
        return "it disagrees with PyTorch's softmax(q·k)·v"
    return None


def load(folder: Path | None = None) -> tuple[Kernel | None, str | None]:
    """The compiled kernel (built on first use), or None and a one-line reason. Cached per process."""
    global _loaded
    if _loaded is not None:  # attention asks once per layer per pass: no lock once it is known
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load(folder)
        return _loaded


def _load(folder: Path | None) -> tuple[Kernel | None, str | None]:
    if os.environ.get("SPECCHAT_ROWLIN", "1") == "0":
        return None, "the row-invariant C kernel is off (SPECCHAT_ROWLIN=0)"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc) for the fast row-invariant kernel: oneDNN kernels instead"
    if folder is None:
        from engine.paths import cache_dir

        folder = cache_dir() / "kernels"
    try:
        path = _library_path(compiler, folder)
        if not path.exists():
            _build(compiler, path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"could not build the row-invariant C kernel ({exc}): oneDNN kernels instead"
    # Only a file nobody else could have written is loaded (its constructors run at load, before any check).
    _tighten(path.parent)
    if unsafe_reason(path.parent) is None and unsafe_reason(path) is None:
        try:
            kernel = _open(path)
        except OSError:
            kernel = None  # a truncated or foreign file: built anew below
        if kernel is not None and self_check(kernel) is None:
            return kernel, None
    return _rebuild_privately(compiler, path, folder_is_safe=unsafe_reason(path.parent) is None)


def _rebuild_privately(compiler: str, path: Path, folder_is_safe: bool) -> tuple[Kernel | None, str | None]:
    """Build once more in a fresh private folder (mode 0700, made by mkdtemp) and load from there: a new path,
    so the dynamic loader cannot hand back a library it already opened under the cached name. A build that
    passes its check replaces the cached file when the cache folder is safe; the private folder is removed
    (the loaded library stays mapped)."""
    private = Path(tempfile.mkdtemp(prefix="specchat-rowlin-"))
    try:
        fresh = private / path.name
        _build(compiler, fresh)
        kernel = _open(fresh)
        problem = self_check(kernel)
        if problem:
            return None, f"the row-invariant C kernel failed its check ({problem}): oneDNN kernels instead"
        if folder_is_safe:
            with contextlib.suppress(OSError):
                staged = path.with_name(f".{path.name}.{os.getpid()}")
                shutil.copyfile(fresh, staged)
                os.chmod(staged, 0o755)
                os.replace(staged, path)
        return kernel, None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"could not build the row-invariant C kernel ({exc}): oneDNN kernels instead"
    finally:
        shutil.rmtree(private, ignore_errors=True)


def reset_for_tests() -> None:
    global _loaded
    with _lock:
        _loaded = None
