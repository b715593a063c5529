"""Install the PyTorch build this machine wants into the running Python (the Makefile's install step).

    python scripts/install_torch.py            # pick by itself, say which and why
    TORCH_SPEC=torch==2.9.1 python scripts/install_torch.py   # an explicit spec always wins
    python scripts/install_torch.py --dry-run  # say what would be installed, install nothing

The choice:
  - TORCH_SPEC is set: exactly that spec.
  - an NVIDIA GPU answers `nvidia-smi -L`: plain `torch` (on Linux x86_64 PyPI's torch is the CUDA build).
  - no NVIDIA GPU: a CPU build (a version with the `+cpu` label), first from the package sources pip is already
    configured with (a local wheel folder, a mirror), then from the PyTorch CPU wheel index. Each look-up has a
    short timeout and no retries, so an unreachable index costs seconds, not minutes.
  - no CPU build can be had (nothing found, or its install failed): plain `torch`, said out loud, because that is
    a multi-GB CUDA build on Linux x86_64.

Only the standard library: it runs before anything else is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
LOOKUP_ARGS = ("--timeout", "10", "--retries", "0")


def say(message: str) -> None:
    print(f"torch: {message}", flush=True)


def nvidia_gpu() -> tuple[bool, str]:
    """Whether an NVIDIA GPU is present, by `nvidia-smi -L`, with the reason."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "no nvidia-smi on PATH"
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"nvidia-smi failed ({type(exc).__name__})"
    gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    if done.returncode != 0 or not gpus:
        return False, f"nvidia-smi lists no GPU (exit {done.returncode})"
    return True, gpus[0].split(" (UUID")[0]


def cpu_versions(available: str) -> list[str]:
    """The `+cpu` versions in pip's "Available versions: ..." line, newest first (pip lists them so)."""
    match = re.search(r"^Available versions:\s*(.+)$", available, flags=re.MULTILINE)
    if not match:
        return []
    return [v.strip() for v in match.group(1).split(",") if v.strip().endswith("+cpu")]


def pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", *args]
    if quiet:
        return subprocess.run(command, capture_output=True, text=True, check=False)
    return subprocess.run(command, text=True, check=False)


def find_cpu_build() -> tuple[str, list[str], str] | None:
    """(spec, extra pip arguments, where) of the newest CPU build reachable here, or None."""
    for where, extra in (
        ("from this machine's configured package sources", []),
        (f"from the PyTorch CPU index ({CPU_INDEX})", ["--extra-index-url", CPU_INDEX]),
    ):
        listed = pip("index", "versions", "torch", *LOOKUP_ARGS, *extra)
        versions = cpu_versions(listed.stdout)
        if versions:
            return f"torch=={versions[0]}", extra, where
    return None


DRY_RUN = False


def install(spec: str, extra: list[str]) -> bool:
    if DRY_RUN:
        say(f"(dry run) would run: pip install {' '.join([spec, *extra])}")
        return True
    return pip("install", "--quiet", spec, *extra, quiet=False).returncode == 0


def main(argv: list[str]) -> int:
    global DRY_RUN
    DRY_RUN = "--dry-run" in argv
    spec = os.environ.get("TORCH_SPEC", "").strip()
    if spec:
        say(f"{spec} (TORCH_SPEC)")
        return 0 if install(spec, []) else 1
    gpu, why = nvidia_gpu()
    if gpu:
        say(f"torch, the CUDA build (NVIDIA GPU found: {why}); TORCH_SPEC=... overrides")
        return 0 if install("torch", []) else 1
    found = find_cpu_build()
    if found is not None:
        spec, extra, where = found
        say(f"{spec}, a CPU build {where} (no NVIDIA GPU: {why}); TORCH_SPEC=... overrides")
        if install(spec, extra):
            return 0
        say(f"installing {spec} failed; falling back to plain torch")
    else:
        say(f"no NVIDIA GPU ({why}) but no CPU build of torch is reachable here")
    say("plain torch (on Linux x86_64 this is the multi-GB CUDA build); TORCH_SPEC=... overrides")
    return 0 if install("torch", []) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
