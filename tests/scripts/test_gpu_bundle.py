"""`make gpu-bundle` and `scripts/gpu_check.sh --offline BUNDLE` (the offline GPU check), as far as a CPU runs them.

The bundle is built for real (pip resolves and downloads wheels for CPython 3.12 manylinux x86_64), then resolved
offline with the command from the issue, and every hard dependency of every bundled wheel is checked to be either
in the bundle or in what the bundle assumes the GPU machine has. The check script's own run needs CUDA: here only
its refusals are run (no GPU, torch without CUDA, not a bundle), each one JSON line and exit status 2.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import paths

ROOT = paths.ROOT
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_bundle  # noqa: E402


def pip_env() -> dict[str, str]:
    """This machine's pip config (local indexes, a torch cap) must not help the offline resolution."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "gpu-bundle"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_bundle.py"), str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow
def test_bundle_fits_and_resolves_offline_for_python_3_12(bundle, tmp_path):
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size <= 64 * 1024 * 1024
    pins = [line for line in (bundle / "requirements.txt").read_text().splitlines() if line]
    names = {gpu_bundle.canonical(p.split("==")[0]) for p in pins}
    assert {
        "exllamav2",
        "textual",
        "pydantic-settings",
        "orjson",
        "platformdirs",
        "gguf",
        "specchat",
    } <= names
    assert "exllamav2==0.3.2" in pins
    assert not names & {
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "ninja",
    }  # on the machine already

    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(bundle / "wheels"),
            "--python-version", "3.12", "--only-binary=:all:", "--target", str(tmp_path / "target"),
            "--no-deps", "--report", str(report), "-r", str(bundle / "requirements.txt"),
        ],
        capture_output=True, text=True, timeout=300, env=pip_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    resolved = {
        gpu_bundle.canonical(item["metadata"]["name"]): item
        for item in json.loads(report.read_text())["install"]
    }
    assert set(resolved) == names  # every requirement found, in the bundle alone
    for item in resolved.values():
        assert item["download_info"]["url"].startswith("file://")

    # Nothing is missing on the GPU machine: each hard dependency is bundled or assumed to be there.
    box = {
        gpu_bundle.canonical(line.split("==")[0])
        for line in (bundle / "box.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    for name, item in resolved.items():
        for dep in gpu_bundle.hard_dependencies(item["metadata"].get("requires_dist") or []):
            assert dep in names or dep in box, (
                f"{name} needs {dep}, which is neither bundled nor on the machine"
            )


@pytest.mark.slow
def test_bundle_s_specchat_wheel_holds_every_package_and_its_data(bundle):
    import zipfile

    wheel = next((bundle / "wheels").glob("specchat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    packages = {
        str(init.parent.relative_to(ROOT))
        for top in ("engine", "tui", "presets")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert {"engine/decoding", "engine/benchmarks", "engine/session", "engine/storage", "tui/cli"} <= packages
    for package in sorted(packages):
        assert f"{package}/__init__.py" in names, f"{package} is not in the wheel"
    for data in ("engine/benchmarks/prompts.jsonl", "engine/benchmarks/prompts_heldout.jsonl", "tui/app.tcss",
                 "presets/code.toml", "engine/backends/transformers/rowlin.c"):  # fmt: skip
        assert data in names


@pytest.mark.slow
def test_the_wheel_is_built_from_a_fresh_copy_not_from_a_stale_build_folder(tmp_path, monkeypatch):
    import shutil
    import zipfile

    project = tmp_path / "project"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "tests")
    shutil.copytree(ROOT, project, ignore=skip)
    stale = (
        project / "build" / "lib" / "engine" / "bench.py"
    )  # what an earlier build left of a module since moved
    stale.parent.mkdir(parents=True)
    stale.write_text("x = 1\n")
    monkeypatch.setattr(gpu_bundle, "ROOT", project)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    names = zipfile.ZipFile(gpu_bundle.build_wheel(wheels, tmp_path / "gpu-bundle")).namelist()
    assert "engine/benchmarks/bench.py" in names
    assert "engine/bench.py" not in names


@pytest.mark.slow
def test_bundle_carries_the_model_s_shape_and_tokenizer_not_its_weights(bundle):
    config = json.loads((bundle / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (576, 30, 49152)
    assert (bundle / "model" / "tokenizer.json").is_file() and (
        bundle / "model" / "tokenizer_config.json"
    ).is_file()
    assert not list(bundle.rglob("*.safetensors"))
    assert (bundle / "gpu_check.sh").read_text() == SCRIPT.read_text()


@pytest.mark.parametrize("pinned_resolves", [True, False], ids=["pin-resolves", "pin-stale"])
def test_the_resolution_pins_the_torch_found_last_and_resolves_unpinned_where_that_fails(
    tmp_path, monkeypatch, pinned_resolves: bool
):
    """torch is on the GPU machine, never bundled, yet resolving it walked back through its releases for ~50 s of
    the build (an index without the CUDA wheels newer ones pin): the next build pins the torch found last."""
    monkeypatch.setattr(gpu_bundle, "_hint_path", lambda: tmp_path / "hint.json")
    calls: list[str | None] = []

    def pip(*args: str, check: bool = True) -> bool:
        constraint = args[args.index("--constraint") + 1] if "--constraint" in args else None
        calls.append(constraint and Path(constraint).read_text())
        if constraint and not pinned_resolves:
            return False  # ResolutionImpossible: the pinned release is gone from the index
        report = {
            "install": [
                {"metadata": {"name": "torch", "version": "2.7.1"}},
                {"metadata": {"name": "rich", "version": "14"}},
            ]
        }
        Path(args[args.index("--report") + 1]).write_text(json.dumps(report))
        return True

    monkeypatch.setattr(gpu_bundle, "pip", pip)
    assert gpu_bundle.read_hint() == {}
    assert set(gpu_bundle.resolve(tmp_path / "specchat.whl")) == {"torch", "rich"}
    assert calls == [None]  # nothing known: one unpinned resolution
    assert gpu_bundle.read_hint() == {"torch": "2.7.1"}
    calls.clear()
    assert set(gpu_bundle.resolve(tmp_path / "specchat.whl")) == {"torch", "rich"}
    assert calls == (["torch==2.7.1\n"] if pinned_resolves else ["torch==2.7.1\n", None])


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def fake_bundle(folder: Path) -> Path:
    (folder / "wheels").mkdir(parents=True)
    (folder / "model").mkdir()
    for name in ("requirements.txt", "model/config.json", "model/tokenizer.json", "gpu_check.py"):
        (folder / name).write_text("", encoding="utf-8")
    return folder


def offline(bundle: Path, path: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), "--offline", str(bundle), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def one_json_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    answer = json.loads(lines[0])
    assert answer["ok"] is False
    return answer["error"]


def without_nvidia_smi() -> str:
    return ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())


def test_offline_check_on_a_machine_without_cuda_exits_2_with_one_line(tmp_path):
    bundle = fake_bundle(tmp_path / "bundle")
    assert one_json_line(offline(bundle, without_nvidia_smi())) == (
        "no CUDA here: nvidia-smi not found; this check needs an NVIDIA GPU"
    )
    # A GPU listed, but torch sees none (a CPU build of torch, or a broken driver): still 2, one line.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n", encoding="utf-8")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    error = one_json_line(offline(bundle, f"{bin_dir}:{without_nvidia_smi()}"))
    assert re.fullmatch(r"no CUDA here: torch on .+ sees no CUDA GPU", error)


def test_offline_check_refuses_what_is_not_a_bundle(tmp_path):
    assert one_json_line(offline(tmp_path / "missing", without_nvidia_smi())).startswith("bundle not found: ")
    (tmp_path / "empty").mkdir()
    error = one_json_line(offline(tmp_path / "empty", without_nvidia_smi()))
    assert error.startswith("not a GPU-check bundle: ") and "has no requirements.txt" in error
    usage = subprocess.run(["bash", str(SCRIPT), "--offline"], capture_output=True, text=True)
    assert usage.returncode == 2 and json.loads(usage.stdout)["error"].startswith("usage: ")
