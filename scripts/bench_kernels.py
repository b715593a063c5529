"""llama.cpp's matrix kernels on one GGUF, without specchat's engine: are they exact, and how fast is a pass of k rows.

    python scripts/bench_kernels.py exact MODEL.gguf [--lib DIR] [--repack on|off] [--threads 1,2]
        [--positions 8,512] [--max-width 64]
    python scripts/bench_kernels.py speed MODEL.gguf --build NAME=DIR[:on|off] ... [--threads 2]
        [--widths 1-16] [--rounds 5] [--position 100]

`exact`: decodes 64 tokens one at a time after POSITION cached tokens, then the same tokens as one pass of each
width 1..max-width, and compares every row's logits with the one-token step's at that position (np.array_equal):
a speculative verify pass must compute what plain decoding computes. `speed`: the time of a pass of k rows
(logits for every row, as a verify pass) and r(k) = that / a one-token step, best of --rounds, with one worker
process per build (DIR holds its libllama.so and ggml libraries: LLAMA_CPP_LIB_PATH), the builds taking turns in
every round (A B C, C B A, ...) so that a busy machine slows each alike; the load average is printed beside.
Each worker process loads one library set only. Exits 1 when a row differs (`exact`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TEXT = (
    "def fibonacci(n: int) -> int:\n    '''Return the n-th Fibonacci number.'''\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n\n"
    "The quick brown fox jumps over the lazy dog; speculative decoding verifies drafted tokens in one pass.\n"
)


# ------------------------------------------------------------------------------------------------ the worker

_QUIET = None


class Worker:
    """One model in one process (the llama.cpp library chosen by LLAMA_CPP_LIB_PATH before the import)."""

    def __init__(self, model: str, repack: bool, threads: int, n_ctx: int) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.ll = llama_cpp
        global _QUIET
        _QUIET = llama_cpp.llama_log_callback(lambda level, text, user: None)  # alive till exit: C holds it
        llama_cpp.llama_log_set(_QUIET, None)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = repack
        params.n_gpu_layers = 0
        self.model = _internals.LlamaModel(path_model=model, params=params, verbose=False)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.ctx = _internals.LlamaContext(model=self.model, params=cp, verbose=False)
        self.batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = int(self.model.n_vocab())
        ids = self.model.tokenize(TEXT.encode(), add_bos=False, special=False)
        self.tokens = (ids * (n_ctx // max(1, len(ids)) + 2))[:n_ctx]
        self.prefilled = -1

    def decode(self, start: int, count: int, logits: bool) -> list:
        b = self.batch.batch
        for i in range(count):
            b.token[i], b.pos[i], b.n_seq_id[i] = self.tokens[start + i], start + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = logits or i == count - 1
        b.n_tokens = count
        if self.ll.llama_decode(self.ctx.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        self.ll.llama_synchronize(self.ctx.ctx)
        if not logits:
            return []
        import numpy as np

        return [
            np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx.ctx, i), shape=(self.n_vocab,)).copy()
            for i in range(count)
        ]

    def cut(self, position: int) -> None:
        self.ll.llama_memory_seq_rm(self.ll.llama_get_memory(self.ctx.ctx), 0, position, -1)

    def prefill(self, position: int) -> None:
        self.cut(0)
        for start in range(0, position, 512):
            self.decode(start, min(512, position - start), logits=False)

    def exact(self, position: int, max_width: int) -> dict:
        import numpy as np

        self.prefill(position)
        self.prefilled = position
        ref = []
        for i in range(max_width):
            ref += self.decode(position + i, 1, logits=True)
        self.cut(position)
        digest = hashlib.sha256(b"".join(row.tobytes() for row in ref)).hexdigest()[:16]
        widths = {}
        for width in range(1, max_width + 1):
            rows = self.decode(position, width, logits=True)
            self.cut(position)
            bad = [i for i, row in enumerate(rows) if not np.array_equal(row, ref[i])]
            diff = max((float(np.max(np.abs(rows[i] - ref[i]))) for i in bad), default=0.0)
            widths[width] = {"bad_rows": bad, "max_abs_diff": diff}
        return {"widths": widths, "one_token_sha": digest}

    def time(self, position: int, widths: list[int], reps: int) -> dict:
        if self.prefilled != position:  # the cache keeps the prompt between rounds
            self.prefill(position)
            self.prefilled = position
        best = dict.fromkeys(widths, float("inf"))
        for _ in range(reps):
            for width in widths:
                start = time.perf_counter()
                self.decode(position, width, logits=True)
                best[width] = min(best[width], time.perf_counter() - start)
                self.cut(position)
        return best


def worker_main(args: argparse.Namespace) -> int:
    worker = Worker(args.model, args.repack == "on", args.threads, args.n_ctx)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exact":
            out = worker.exact(cmd["position"], cmd["max_width"])
        else:
            out = worker.time(cmd["position"], cmd["widths"], cmd["reps"])
        print(json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ the parent


class Child:
    def __init__(self, model: Path, lib: str | None, repack: str, threads: int, n_ctx: int) -> None:
        env = dict(os.environ)
        if lib:
            env["LLAMA_CPP_LIB_PATH"] = lib
        cmd = [sys.executable, __file__, "--worker", str(model), "--repack", repack]
        cmd += ["--threads", str(threads), "--n-ctx", str(n_ctx)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("bench_kernels: a worker died (see its error above)")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def widths_arg(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def run_exact(args: argparse.Namespace) -> int:
    ok = True
    positions = [int(p) for p in args.positions.split(",")]
    n_ctx = max(positions) + args.max_width + 64
    digests: dict[int, set[str]] = {p: set() for p in positions}
    for threads in [int(t) for t in args.threads.split(",")]:
        child = Child(args.model, args.lib, args.repack, threads, n_ctx)
        for position in positions:
            start = time.time()
            result = child.ask(op="exact", position=position, max_width=args.max_width)
            digests[position].add(result["one_token_sha"])
            bad = {int(w): r for w, r in result["widths"].items() if r["bad_rows"]}
            ok &= not bad
            verdict = (
                "all rows equal"
                if not bad
                else f"{len(bad)} widths differ: "
                + ", ".join(
                    f"w{w} rows {r['bad_rows'][:4]} (max |d| {r['max_abs_diff']:.3g})"
                    for w, r in list(bad.items())[:6]
                )
            )
            print(
                f"{args.model.name} repack {args.repack} threads {threads} position {position} "
                f"widths 1..{args.max_width}: {verdict} ({time.time() - start:.0f} s, load {load()})",
                flush=True,
            )
        child.close()
    if "," in args.threads:
        same = all(len(d) == 1 for d in digests.values())
        print(
            f"one-token logits alike at {args.threads} threads: {'yes' if same else 'no'} (positions {args.positions})"
        )
    return 0 if ok else 1


def run_speed(args: argparse.Namespace) -> int:
    builds = []
    for spec in args.build:
        name, _, rest = spec.partition("=")
        lib, _, repack = rest.partition(":")
        builds.append((name, lib, repack or "on"))
    widths = widths_arg(args.widths)
    n_ctx = args.position + max(widths) + 64
    children = {name: Child(args.model, lib, repack, args.threads, n_ctx) for name, lib, repack in builds}
    best = {name: dict.fromkeys(widths, float("inf")) for name, _, _ in builds}
    loads = []
    for rnd in range(args.rounds):
        order = [b[0] for b in builds]
        for name in order if rnd % 2 == 0 else order[::-1]:
            out = children[name].ask(op="time", position=args.position, widths=widths, reps=args.reps)
            for w, t in out.items():
                best[name][int(w)] = min(best[name][int(w)], t)
        loads.append(os.getloadavg()[0])
    for child in children.values():
        child.close()
    first = builds[0][0]
    print(
        f"{args.model.name}, {args.threads} threads, {args.position} cached tokens, best of {args.rounds} rounds x "
        f"{args.reps}; load average {min(loads):.2f}-{max(loads):.2f}"
    )
    print("build         | one token ms | vs " + first + " | " + " ".join(f"r({w})" for w in widths))
    for name, _, _ in builds:
        one = best[name][1] if 1 in best[name] else best[name][widths[0]]
        row = " ".join(f"{best[name][w] / one:5.2f}" for w in widths)
        ratio = best[first][1] / one if 1 in best[first] else float("nan")
        print(f"{name:13s} | {one * 1e3:12.2f} | {ratio:5.2f}x | {row}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        wp = argparse.ArgumentParser()
        wp.add_argument("model")
        wp.add_argument("--repack", default="on")
        wp.add_argument("--threads", type=int, default=2)
        wp.add_argument("--n-ctx", type=int, default=1024)
        return worker_main(wp.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("exact")
    ex.add_argument("model", type=Path)
    ex.add_argument("--lib", default=None, help="folder of libllama.so (default: the installed bindings)")
    ex.add_argument("--repack", choices=("on", "off"), default="on")
    ex.add_argument("--threads", default="1,2")
    ex.add_argument("--positions", default="8,512")
    ex.add_argument("--max-width", type=int, default=64)
    sp = sub.add_parser("speed")
    sp.add_argument("model", type=Path)
    sp.add_argument(
        "--build", action="append", required=True, help="NAME=LIBDIR[:on|off] (repack), repeatable"
    )
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--widths", default="1-16")
    sp.add_argument("--rounds", type=int, default=20)
    sp.add_argument("--reps", type=int, default=1)
    sp.add_argument("--position", type=int, default=100)
    args = parser.parse_args(argv)
    if not args.model.is_file():
        print(f"bench_kernels: no model file {args.model}", file=sys.stderr)
        return 1
    return run_exact(args) if args.cmd == "exact" else run_speed(args)


if __name__ == "__main__":
    sys.exit(main())
