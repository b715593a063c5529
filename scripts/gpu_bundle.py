"""Build the offline GPU-check bundle (`make gpu-bundle`): what a locked-down CUDA machine lacks, in one folder.

    python scripts/gpu_bundle.py [OUT]      # default OUT: gpu-bundle

The machine it is for has no network, Python 3.12 on Linux x86_64, and already a CUDA torch, transformers,
tokenizers, safetensors and ninja (the BOX_ROOTS, with everything they depend on). The bundle carries:

  wheels/            CPython 3.12 manylinux x86_64 (or pure-Python) wheels of exllamav2 0.3.2 and of every other
                     package specchat needs that those roots do not bring, plus specchat's own wheel
  requirements.txt   exact pins of those wheels (installed with --no-deps into a private target)
  box.txt            the packages assumed to be there already, with the versions the resolution saw
  model/             the embedded SmolLM2-135M-Instruct's config, tokenizer and chat template (no weights: the
                     check builds a random-weight model of the same shape)
  gpu_check.py, gpu_check.sh   the check itself

and must stay at most 64 MiB. Resolution and downloads use pip with PyPI as configured here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
BOX_ROOTS = ("torch", "transformers", "tokenizers", "safetensors", "ninja")
EXTRA = ("exllamav2==0.3.2",)
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
LIMIT_BYTES = 64 * 1024 * 1024


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    return canonical(re.split(r"[\s;<>=!~\[(]", spec.strip(), maxsplit=1)[0])


def target_args() -> list[str]:
    args = ["--python-version", PYTHON_VERSION, "--only-binary=:all:"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise SystemExit("gpu-bundle: pip " + " ".join(args[:2]) + " failed:\n  " + "\n  ".join(tail))


TARGET_MARKERS = {
    "python_version": PYTHON_VERSION,
    "python_full_version": f"{PYTHON_VERSION}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def hard_dependencies(requires_dist: list[str]) -> list[str]:
    """Names of the requirements that apply on the GPU machine without any extra."""
    from packaging.requirements import InvalidRequirement, Requirement

    names = []
    for spec in requires_dist:
        try:
            requirement = Requirement(spec)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate(TARGET_MARKERS):
            names.append(canonical(requirement.name))
    return names


def box_closure(packages: dict[str, dict]) -> set[str]:
    """Names the BOX_ROOTS bring with them: their hard dependencies, transitively, no extras."""
    seen: set[str] = set()
    todo = [r for r in BOX_ROOTS if r in packages]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for dep in hard_dependencies(packages[name]["metadata"].get("requires_dist") or []):
            if dep in packages and dep not in seen:
                todo.append(dep)
    return seen


def model_folder() -> Path:
    sys.path.insert(0, str(ROOT))
    from engine.models import ensure_embedded_model, print_progress

    return Path(ensure_embedded_model(print_progress))


def build_wheel(wheels: Path, out: Path) -> Path:
    """specchat's wheel, built from a fresh copy of the project. setuptools packs whatever an earlier build left in
    build/lib, so an in-tree build after a module moved (engine/bench.py -> engine/benchmarks/) would ship the old
    module beside the new one."""
    skip = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests", out.name
    )
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "specchat"
        shutil.copytree(ROOT, source, ignore=skip)
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(source))
    return next(wheels.glob("specchat-*.whl"))


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "gpu-bundle").resolve()
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    print(f"gpu-bundle: building specchat's wheel into {wheels}", flush=True)
    project = build_wheel(wheels, out)

    print(f"gpu-bundle: resolving for CPython {PYTHON_VERSION} manylinux x86_64", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        pip(
            "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report_path),
            "--target", str(Path(tmp) / "target"), *target_args(), str(project), *EXTRA,
        )  # fmt: skip
        report = json.loads(report_path.read_text(encoding="utf-8"))
    packages = {canonical(item["metadata"]["name"]): item for item in report["install"]}
    on_box = box_closure(packages)
    bundled = sorted(name for name in packages if name not in on_box and name != "specchat")
    pins = [
        f"{packages[name]['metadata']['name']}=={packages[name]['metadata']['version']}" for name in bundled
    ]

    print(f"gpu-bundle: downloading {len(pins)} wheels", flush=True)
    pip("download", "--quiet", "--no-deps", "--dest", str(wheels), *target_args(), *pins)
    (out / "requirements.txt").write_text(
        "\n".join([*pins, f"specchat=={packages['specchat']['metadata']['version']}"]) + "\n",
        encoding="utf-8",
    )
    box = [f"{packages[n]['metadata']['name']}=={packages[n]['metadata']['version']}" for n in sorted(on_box)]
    (out / "box.txt").write_text(
        "# Assumed installed on the GPU machine (versions as resolved here; the machine's own may differ)\n"
        + "\n".join(box)
        + "\n",
        encoding="utf-8",
    )

    model = out / "model"
    model.mkdir()
    source = model_folder()
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, model / name)
    for name in ("gpu_check.py", "gpu_check.sh"):
        shutil.copy(ROOT / "scripts" / name, out / name)

    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"gpu-bundle: {out} holds {len(pins) + 1} wheels, {size / 2**20:.1f} MiB", flush=True)
    if size > LIMIT_BYTES:
        print(f"gpu-bundle: error: {size / 2**20:.1f} MiB is over the 64 MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
