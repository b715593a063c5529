"""What can crash llama.cpp's native code on this machine, and how specchat keeps the chat up when it does.

Weight repacking. llama.cpp moves quantized weights into "extra buffer types" at load: on x86 with AMX
(`amx_tile`/`amx_int8` in /proc/cpuinfo, compiled in by a native build on such a CPU) its AMX buffer takes
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights, and `ggml_backend_amx_mul_mat` segfaults on some of
those machines (upstream llama.cpp#20824, closed unfixed). The same switch (`use_extra_bufts`, llama-server's
`--no-repack`) also turns off the plain CPU repack (interleaved Q4_0/Q4_K/IQ4_NL/... for AVX2 and NEON). Stock
llama.cpp computes repacked weights' one token (gemv) and the rows of a batch (gemm) in other orders, so the
kernel probe would find them apart and specchat's exact plain steps run padded to two rows (on Gemma 3 270M
Q4_K_M, AVX2: plain 1.77x faster unpacked; scripts/bench_repack.py). specchat's patched build computes repacked
Q4_K rows exactly in every pass of up to 64 rows (x86; it says so through `specchat_repack_exact()` and
`specchat_exact_rows()`, library.exact_kernels), and repacked Q4_K is llama.cpp's fastest kernel there. So
`choose_repack` turns repacking on for specchat's own (exact) backend where the loaded build exports both and its
exact width covers the widest verify pass, and off elsewhere (a stock or older build, ARM); per GGUF it stays off
where the file holds weights llama.cpp would repack with kernels the patch leaves stock (Q4_0, IQ4_NL, MXFP4,
Q2_K: `RepackChoice.for_types`). llama.cpp's own peers (llama-server, `Llama()` in the bench: no exactness to
keep) get llama.cpp's default. Off on AMX CPUs for both; `SPECCHAT_LLAMA_REPACK=on|off` overrides both.

A trial in a child process. Where a crash cannot be ruled out (the GGUF has weights of a type that an extra
buffer type would take), the first load of a (model file, llama.cpp build, CPU, repack) is preceded by a short
trial: a child process loads the model as the backend will and decodes a prompt batch, single tokens and
verify-sized batches (up to the widest the round loop sends). A child killed by a signal means the parent would
have died the same way: the backend retries the trial without repacking and, if that passes, loads so (with a
note); if it still dies, load raises one BackendError line naming the signal and what to do, and the chat stays
up. The verdict is remembered in
`<cache>/llamacpp-trials.json`, so a known (file, build, CPU) loads with no child at all.

`python -m engine.backends.llamacpp.native --trial FILE [--no-repack]` is that child. For tests,
`SPECCHAT_PLANT_NATIVE_CRASH=load|decode` makes it kill itself with SIGSEGV at that point (a real signal, seen by
the parent exactly as a crash inside llama.cpp), and `SPECCHAT_PLANT_NATIVE_CRASH_REPACK=1` limits that to
trials with repacking on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import engine
from engine.backends.llamacpp.library import ExactKernels, read_cpu_flags
from engine.decoding.drafters.ngram import LONG_DRAFT_MAX
from engine.errors import BackendError

AMX_FLAGS = ("amx_bf16", "amx_int8", "amx_tile")
CPUINFO = "/proc/cpuinfo"  # read at each choice (tests point it at a cpuinfo of another CPU)
REPACK_ENV = "SPECCHAT_LLAMA_REPACK"
PLANT_ENV = "SPECCHAT_PLANT_NATIVE_CRASH"
PLANT_REPACK_ONLY_ENV = "SPECCHAT_PLANT_NATIVE_CRASH_REPACK"
TRIALS_FILE = "llamacpp-trials.json"
# A trial that runs longer than this is not a crash; the backend goes on (the verdict is not remembered).
TRIAL_TIMEOUT_S = 180.0
# GGUF tensor types that no CPU extra buffer type takes (so nothing is repacked and the AMX path is never used).
UNREPACKED_TYPES = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})
TROUBLESHOOTING = "README: Troubleshooting, 'llama.cpp crashed'"
# Weight types that x86 llama.cpp repacks (AVX2; Q2_K with AVX-512) with the stock gemv/gemm, which the patch does
# not make exact (it covers repacked Q4_K): a GGUF holding any of them loads unpacked in the exact backend.
STOCK_REPACKED_TYPES = frozenset({"Q4_0", "IQ4_NL", "MXFP4", "Q2_K"})
# choose_repack's default: read the build's exact-kernel exports from the loaded libggml-cpu.
READ_KERNELS = object()


def cpu_flags(cpuinfo: str | Path | None = None) -> frozenset[str]:
    """The first CPU's feature flags (x86 `flags`, ARM `Features`) from `cpuinfo` (default `CPUINFO`); empty
    where there is none."""
    return read_cpu_flags(CPUINFO if cpuinfo is None else cpuinfo)


@dataclass(frozen=True)
class RepackChoice:
    """Whether llama.cpp may repack weights into its extra buffer types, and why (one line). `exact`: on because
    the build's repacked kernels compute every row of a verify pass as a one-token step (narrowed per file by
    `for_types`)."""

    enabled: bool
    reason: str
    exact: bool = False

    @property
    def for_amx(self) -> bool:
        """Turned off because of the AMX crash (worth a note to the user)."""
        return not self.enabled and "AMX" in self.reason

    def server_args(self) -> list[str]:
        """llama-server's flag for the same choice."""
        return [] if self.enabled else ["--no-repack"]

    def for_types(self, types: Iterable[str]) -> RepackChoice:
        """The choice for a GGUF holding weights of `types` (GGMLQuantizationType names): an exact choice turns
        repacking off where x86 llama.cpp would repack some of them with kernels the patch leaves stock (their
        one-token and batch rows round otherwise: the probe would pad plain steps or cap drafts)."""
        stock = sorted(set(types) & STOCK_REPACKED_TYPES)
        if not (self.enabled and self.exact and stock):
            return self
        return RepackChoice(
            False,
            f"weight repacking off: llama.cpp repacks {', '.join(stock)} weights with kernels that compute one "
            "token and a batch row in other orders",
        )


def choose_repack(
    flags: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    exact: bool = True,
    kernels: ExactKernels | None | object = READ_KERNELS,
    widest: int | None = None,
) -> RepackChoice:
    """Repacking off where the CPU has AMX (llama.cpp's AMX buffer crashes there). Elsewhere on for llama.cpp's
    own peers, and for specchat's exact backend (`exact`) where the build's `kernels` (read from the loaded
    libggml-cpu by default: library.exact_kernels) compute repacked weights' rows exactly in passes as wide as
    `widest` (default: the widest verify pass the round loop sends); off otherwise (a stock or older build, ARM),
    where repacked kernels would pad its plain steps."""
    environ = os.environ if environ is None else environ
    forced = environ.get(REPACK_ENV, "").strip().lower()
    if forced in ("on", "1", "true", "yes"):
        return RepackChoice(True, f"weight repacking on ({REPACK_ENV}={forced})")
    if forced in ("off", "0", "false", "no"):
        return RepackChoice(False, f"weight repacking off ({REPACK_ENV}={forced})")
    flags = cpu_flags() if flags is None else frozenset(flags)
    amx = sorted(set(flags) & set(AMX_FLAGS))
    if amx:
        return RepackChoice(
            False,
            f"weight repacking off: this CPU has AMX ({', '.join(amx)}), where llama.cpp's AMX repack of "
            "quantized weights crashes (llama.cpp#20824)",
        )
    if not exact:
        return RepackChoice(True, "weight repacking on (no AMX on this CPU)")
    if kernels is READ_KERNELS:
        from engine.backends.llamacpp.library import exact_kernels

        kernels = exact_kernels()
    if widest is None:  # the probe's widest width (probe.PROBE_MAX_WIDTH; the probe imports this module)
        widest = LONG_DRAFT_MAX + 1
    if kernels is None or not kernels.repack:
        return RepackChoice(
            False,
            "weight repacking off: this llama.cpp build's repacked kernels compute one token and a batch row in "
            "other orders, so exact plain steps would run padded",
        )
    if kernels.rows < widest:
        return RepackChoice(
            False,
            f"weight repacking off: this llama.cpp build computes passes exactly up to {kernels.rows} rows, "
            f"the round loop sends {widest}",
        )
    return RepackChoice(
        True,
        f"weight repacking on: this build's repacked kernels compute every row of a pass of up to {kernels.rows} "
        "tokens as one token",
        exact=True,
    )


@contextlib.contextmanager
def model_defaults(choice: RepackChoice) -> Iterator[None]:
    """Within the block, llama-cpp-python's high-level `Llama(...)` loads with `use_extra_bufts` as chosen (it
    offers no argument for it: it reads `llama_model_default_params()`, which this wraps)."""
    from llama_cpp import llama_cpp as raw

    original = raw.llama_model_default_params

    def defaults():
        params = original()
        params.use_extra_bufts = choice.enabled
        return params

    raw.llama_model_default_params = defaults
    try:
        yield
    finally:
        raw.llama_model_default_params = original


def repacked_types(path: Path) -> list[str]:
    """The GGUF's weight types that an extra buffer type could take (quantized ones), sorted; [] for F16/F32."""
    from gguf import GGMLQuantizationType

    names = set()
    for code in gguf_tensor_types(path):
        try:
            names.add(GGMLQuantizationType(code).name)
        except ValueError:
            names.add(f"type {code}")
    return sorted(names - UNREPACKED_TYPES)


# GGUF metadata value types whose size is fixed (gguf's GGUFValueType): uint8 .. float64, bool.
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_tensor_types(path: Path) -> set[int]:
    """The ggml type codes of a GGUF file's tensors, read from its header alone (gguf's GGUFReader parses every
    metadata array into numpy first: tens of seconds for a 150k-token vocabulary, at every load)."""
    return {code for _name, _count, code in gguf_tensors(path)}


def gguf_tensors(path: Path) -> list[tuple[str, int, int]]:
    """Every tensor of a GGUF file as (name, element count, ggml type code), read from its header alone."""
    import mmap
    import struct

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file")
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        offset = 24

        def skip_string(at: int) -> int:
            (length,) = struct.unpack_from("<Q", data, at)
            return at + 8 + length

        def skip_value(kind: int, at: int) -> int:
            if kind in _FIXED_SIZES:
                return at + _FIXED_SIZES[kind]
            if kind == _STRING:
                return skip_string(at)
            if kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in _FIXED_SIZES:
                    return at + count * _FIXED_SIZES[item]
                for _ in range(count):
                    at = skip_value(item, at)
                return at
            raise ValueError(f"{path.name}: unknown GGUF value type {kind}")

        for _ in range(n_kv):
            offset = skip_string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            offset = skip_value(kind, offset + 4)
        tensors: list[tuple[str, int, int]] = []
        for _ in range(n_tensors):
            (length,) = struct.unpack_from("<Q", data, offset)
            name = bytes(data[offset + 8 : offset + 8 + length]).decode("utf-8", "replace")
            offset += 8 + length
            (n_dims,) = struct.unpack_from("<I", data, offset)
            count = 1
            for dim in struct.unpack_from(f"<{n_dims}Q", data, offset + 4):
                count *= dim
            offset += 4 + 8 * n_dims
            (code,) = struct.unpack_from("<I", data, offset)
            tensors.append((name, count, code))
            offset += 4 + 8
        return tensors


# --------------------------------------------------------------------------------------------------- the trial


@dataclass(frozen=True)
class Trial:
    """One trial decode's verdict: `crashed` names the signal that killed the child (None: it passed)."""

    crashed: str | None
    seconds: float
    remembered: bool = False

    @property
    def ok(self) -> bool:
        return self.crashed is None


def _library_identity() -> str:
    """The llama.cpp build: the bindings' version and their shared libraries' names and contents (a digest, so a
    reinstall of the same wheel, e.g. a fresh clone's venv, keeps the verdicts; a rebuild does not)."""
    try:
        import llama_cpp
    except Exception as exc:  # no bindings: the backend's own import reports it
        return f"none ({type(exc).__name__})"
    folder = Path(llama_cpp.__file__).parent / "lib"
    parts = [getattr(llama_cpp, "__version__", "?")]
    with contextlib.suppress(OSError):
        for lib in sorted(folder.iterdir()):
            stat = lib.stat()
            parts.append(f"{lib.name}:{_file_digest(str(lib), stat.st_size, stat.st_mtime_ns)}")
    return "|".join(parts)


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes, once per process for each (path, size, time) (~25 MB of libraries: ~50 ms)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{size}:{digest.hexdigest()[:16]}"


def trial_key(path: Path, repack: bool, flags: Iterable[str] | None = None) -> str:
    """What a verdict depends on: the file (path, size, time), the build, the CPU's flags, the repack switch."""
    stat = path.stat()
    flags = cpu_flags() if flags is None else flags
    text = "\n".join(
        [
            str(path.resolve()),
            f"{stat.st_size}:{stat.st_mtime_ns}",
            _library_identity(),
            " ".join(sorted(flags)),
            f"repack={int(repack)}",
            # A planted crash (tests) is its own verdict, never taken for the real one.
            f"plant={os.environ.get(PLANT_ENV, '')}:{os.environ.get(PLANT_REPACK_ONLY_ENV, '')}",
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _trials_path() -> Path:
    from engine.paths import cache_dir

    return cache_dir() / TRIALS_FILE


def load_verdicts(store: Path) -> dict:
    """A JSON file of remembered verdicts by key ({} where it is missing or unreadable)."""
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember_verdict(store: Path, key: str, verdict: dict) -> None:
    """Add one verdict to the file (written whole, then moved into place; a file that cannot be written is
    left alone: the verdict is measured again next time)."""
    data = load_verdicts(store)
    data[key] = verdict
    write_verdicts(store, data)


def write_verdicts(store: Path, data: dict) -> None:
    """The file, written whole, then moved into place (left alone where it cannot be written)."""
    with contextlib.suppress(OSError):
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_name(f".{store.name}.{os.getpid()}")
        partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(partial, store)


def _remember(store: Path, key: str, trial: Trial, path: Path, repack: bool) -> None:
    remember_verdict(
        store,
        key,
        {"crashed": trial.crashed, "seconds": round(trial.seconds, 3), "file": path.name, "repack": repack},
    )


def signal_name(returncode: int) -> str | None:
    """The signal that ended a child (a negative return code), or None."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def trial_decode(
    path: Path, *, repack: bool, threads: int, store: Path | None = None, timeout: float = TRIAL_TIMEOUT_S
) -> Trial:
    """Load `path` and decode a little in a child process (remembered per file/build/CPU/repack)."""
    store = _trials_path() if store is None else store
    key = trial_key(path, repack)
    known = load_verdicts(store).get(key)
    if isinstance(known, dict) and "crashed" in known:
        return Trial(known["crashed"], float(known.get("seconds", 0.0)), remembered=True)
    command = [sys.executable, "-m", "engine.backends.llamacpp.native", "--trial", str(path)]
    command += ["--threads", str(max(1, threads))] + ([] if repack else ["--no-repack"])
    start = time.perf_counter()
    root = str(
        Path(engine.__file__).resolve().parent.parent
    )  # the child imports this package as the parent does
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Trial(None, time.perf_counter() - start)  # slow, not dead: not remembered
    seconds = time.perf_counter() - start
    trial = Trial(signal_name(done.returncode), seconds)
    if done.returncode > 0:
        # The child failed without a crash (a file llama.cpp refuses, a missing library): the backend's own load
        # says why in its words; nothing is remembered.
        return trial
    _remember(store, key, trial, path, repack)
    return trial


@dataclass
class LoadPlan:
    """How to load one GGUF safely: whether to repack, notes for the user, and the trials' cost at this load."""

    repack: bool
    notes: list[str]
    trial_seconds: float = 0.0


def plan_load(
    path: Path,
    choice: RepackChoice,
    *,
    threads: int,
    what: str = "model",
    store: Path | None = None,
) -> LoadPlan:
    """Trial-decode `path` in a child where a native crash cannot be ruled out; BackendError (one line) if every
    way to load it crashes."""
    types = repacked_types(path)
    if not types:
        return LoadPlan(choice.enabled, [])  # F16/F32 weights: no extra buffer type takes them
    choice = choice.for_types(types)
    first = trial_decode(path, repack=choice.enabled, threads=threads, store=store)
    spent = 0.0 if first.remembered else first.seconds
    if first.ok:
        return LoadPlan(choice.enabled, [], spent)
    if choice.enabled:
        second = trial_decode(path, repack=False, threads=threads, store=store)
        spent += 0.0 if second.remembered else second.seconds
        if second.ok:
            note = (
                f"llama.cpp crashed ({first.crashed}) decoding the {what} {path.name} with weight repacking on "
                "this CPU; repacking is off for it"
            )
            return LoadPlan(False, [note], spent)
    raise BackendError(
        f"llama.cpp crashed ({first.crashed}) in a trial decode of the {what} {path.name} on this CPU; "
        f"try an F16 GGUF of it, or --backend transformers with its Hugging Face folder ({TROUBLESHOOTING})"
    )


# --------------------------------------------------------------------------------------------------- the child


def _plant(point: str, repack: bool) -> None:
    if os.environ.get(PLANT_ENV) != point:
        return
    if os.environ.get(PLANT_REPACK_ONLY_ENV) and not repack:
        return
    os.kill(os.getpid(), signal.SIGSEGV)


def _child(path: str, repack: bool, threads: int) -> int:
    """Load as the backend does and decode: a 48-token prompt batch, two single tokens, a 6-row and a 49-row
    verify batch (the exact kernels' narrow and wide paths)."""
    import llama_cpp
    from llama_cpp import _internals

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = repack
    params.n_gpu_layers = 0
    model = _internals.LlamaModel(path_model=path, params=params, verbose=False)
    _plant("load", repack)
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = 256
    ctx_params.n_batch = ctx_params.n_ubatch = 64
    ctx_params.n_seq_max = 1
    ctx_params.n_threads = ctx_params.n_threads_batch = threads
    ctx_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = _internals.LlamaContext(model=model, params=ctx_params, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=64, embd=0, n_seq_max=1, verbose=False)
    n_vocab = max(2, int(model.n_vocab()))
    sizes = (48, 1, 1, 6, 49)
    tokens = [(7 + 13 * i) % (n_vocab - 1) + 1 for i in range(sum(sizes))]
    position = 0
    _plant("decode", repack)
    for size in sizes:
        chunk, tokens = tokens[:size], tokens[size:]
        b = batch.batch
        for i, token in enumerate(chunk):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, position + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = True
        b.n_tokens = len(chunk)
        if llama_cpp.llama_decode(ctx.ctx, b) != 0:
            return 3
        position += len(chunk)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial", required=True, help="the GGUF file")
    parser.add_argument("--no-repack", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        return _child(args.trial, not args.no_repack, args.threads)
    except Exception as exc:  # a load llama.cpp refuses: not a crash; the parent's load says why
        print(f"trial failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
