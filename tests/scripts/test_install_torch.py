"""scripts/install_torch.py: the Makefile's choice of PyTorch build, by a real run of the script (dry run)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import paths

SCRIPT = paths.SCRIPTS / "install_torch.py"
sys.path.insert(0, str(SCRIPT.parent))
import install_torch  # noqa: E402


def fake_nvidia_smi(folder: Path, output: str, status: int) -> Path:
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {status}\n", encoding="utf-8")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return folder


def choose(path: str, torch_spec: str = "") -> str:
    env = {**os.environ, "PATH": path, "TORCH_SPEC": torch_spec}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_available_versions_line_gives_cpu_builds_newest_first():
    listed = "torch (2.15.0)\nAvailable versions: 2.15.0, 2.14.1, 2.13.0+cpu, 2.13.0, 2.12.0+cpu\n"
    assert install_torch.cpu_versions(listed) == ["2.13.0+cpu", "2.12.0+cpu"]
    assert install_torch.cpu_versions("ERROR: No matching distribution found for torch") == []


def test_a_gpu_listed_by_nvidia_smi_picks_the_cuda_build(tmp_path):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "GPU 0: NVIDIA H200 (UUID: GPU-1234)", 0)
    out = choose(f"{bin_dir}:{os.environ['PATH']}")
    assert "torch, the CUDA build (NVIDIA GPU found: GPU 0: NVIDIA H200)" in out
    assert "would run: pip install torch\n" in out


@pytest.mark.parametrize("smi", [None, ("NVIDIA-SMI has failed: no devices were found", 9)])
def test_no_gpu_picks_a_cpu_build_or_says_why_not(tmp_path, smi):
    path = os.environ["PATH"]
    if smi is not None:
        path = f"{fake_nvidia_smi(tmp_path / 'bin', *smi)}:{path}"
    out = choose(path)
    assert "no NVIDIA GPU" in out
    # Either a `+cpu` build was found (this machine keeps one on disk) or the fallback is said out loud.
    assert (
        "+cpu, a CPU build" in out or "plain torch (on Linux x86_64 this is the multi-GB CUDA build)" in out
    )
    if smi is not None:
        assert "nvidia-smi lists no GPU (exit 9)" in out


def test_torch_spec_overrides_everything(tmp_path):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "GPU 0: NVIDIA H200 (UUID: GPU-1234)", 0)
    out = choose(f"{bin_dir}:{os.environ['PATH']}", torch_spec="torch==2.9.1")
    assert out.splitlines()[0] == "torch: torch==2.9.1 (TORCH_SPEC)"
    assert "would run: pip install torch==2.9.1\n" in out
