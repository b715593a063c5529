"""Build the offline GPU-check bundle (`make gpu-bundle`): what a locked-down CUDA machine lacks, in one folder.

    python scripts/gpu_bundle.py [OUT]                       # default OUT: gpu-bundle
    python scripts/gpu_bundle.py [OUT] --prebuilt-ext DIR    # add exllamav2_ext / exllamav3_ext .so files from DIR
    python scripts/gpu_bundle.py [OUT] --build-ext           # build both extensions here for sm_90, then add them

The machine it is for has no network, Python 3.12 on Linux x86_64, and already a CUDA torch, transformers,
tokenizers, safetensors and ninja (the BOX_ROOTS, with everything they depend on). The bundle carries:

  wheels/            CPython 3.12 manylinux x86_64 (or pure-Python) wheels of exllamav2 0.3.2 and of every other
                     package specchat needs that those roots do not bring, plus specchat's own wheel
  requirements.txt   exact pins of those wheels (installed with --no-deps into a private target)
  box.txt            the packages assumed to be there already, with the versions the resolution saw
  model/             the embedded SmolLM2-135M-Instruct's config, tokenizer and chat template (no weights: the
                     check builds a random-weight model of the same shape)
  gpu_check.py, gpu_check.sh   the check itself
  ext/               optional: exllamav2_ext and exllamav3_ext compiled ahead for the device (sm_90), which the
                     check puts first on PYTHONPATH; both libraries import a prebuilt module instead of compiling
                     (exllamav3's ~194 CUDA sources take longer than the device budget on a cold machine)

`--build-ext` compiles them on this machine, with no GPU: torch's JIT loader (the same build each library runs on
first import) with TORCH_CUDA_ARCH_LIST=9.0, nvcc from CUDA_HOME and a CUDA build of torch (`--torch-site DIR`
puts one first on the build's PYTHONPATH). It uses every core for a long time (hours on 2 cores).

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
# exllamav3 (engine/backends/exllamav3/library.PINNED_VERSION) goes into exl3/ as its wheel, installed with --no-deps:
# its llguidance>=1.7 requirement only serves LLGuidanceFilter (imported in a try: generator/filter/llguidance.py)
# and may be missing from an index. Its other imports are resolved with the rest.
EXL3_WHEEL = "exllamav3==1.6.5"
EXL3_IMPORTS = ("marisa-trie", "pyyaml", "pillow", "rich", "numpy", "typing-extensions")
EXTENSIONS = {"exllamav2": "exllamav2_ext", "exllamav3": "exllamav3_ext"}
DEVICE_ARCH = "9.0"  # the device's H200 (sm_90)
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


def pip(*args: str, check: bool = True) -> bool:
    """Run pip; exit with its last lines where it fails (`check`), else say whether it succeeded."""
    command = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 and check:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise SystemExit("gpu-bundle: pip " + " ".join(args[:2]) + " failed:\n  " + "\n  ".join(tail))
    return done.returncode == 0


# The torch the last resolution settled on, per target, in specchat's cache folder. torch is on the GPU machine (a
# BOX_ROOT, never bundled), but resolving it walks back through its releases wherever an index lacks the CUDA
# wheels a newer release pins (here: 2.14.1 down to 2.7.1, ~50 s of a 60 s build); the next build pins the version
# found last, and resolves unpinned again if that no longer resolves. The bundle is the same either way.
HINT_FILE = "gpu-bundle-resolution.json"


def _hint_path() -> Path:
    sys.path.insert(0, str(ROOT))
    from engine.paths import cache_dir

    return cache_dir() / HINT_FILE


def _hint_key() -> str:
    return f"cp{PYTHON_VERSION}|{','.join(PLATFORMS)}"


def read_hint() -> dict[str, str]:
    """{package: version} the last resolution for this target settled on ({} where none is known)."""
    from engine.backends.llamacpp.native import load_verdicts

    hint = load_verdicts(_hint_path()).get(_hint_key(), {})
    return {str(k): str(v) for k, v in hint.items()} if isinstance(hint, dict) else {}


def write_hint(packages: dict[str, dict]) -> None:
    """The torch of this resolution, for the next build (the cache's keyed JSON files: native.remember_verdict)."""
    from engine.backends.llamacpp.native import remember_verdict

    torch = {"torch": packages["torch"]["metadata"]["version"]} if "torch" in packages else {}
    remember_verdict(_hint_path(), _hint_key(), torch)


def resolve(project: Path) -> dict[str, dict]:
    """pip's dry-run resolution for the target: {canonical name: report item}. The last build's torch first
    (read_hint), unpinned where that fails; the torch found is kept for the next build."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        args = [
            "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report_path),
            "--target", str(Path(tmp) / "target"), *target_args(), str(project), *EXTRA, *EXL3_IMPORTS,
        ]  # fmt: skip
        hint = read_hint()
        pinned = Path(tmp) / "hint.txt"
        pinned.write_text("".join(f"{name}=={version}\n" for name, version in hint.items()), encoding="utf-8")
        if not (hint and pip(*args, "--constraint", str(pinned), check=False)):
            pip(*args)
        report = json.loads(report_path.read_text(encoding="utf-8"))
    packages = {canonical(item["metadata"]["name"]): item for item in report["install"]}
    write_hint(packages)
    return packages


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


def prebuilt_files(folder: Path) -> list[Path]:
    """The extension modules in `folder` (exllamav2_ext*.so, exllamav3_ext*.so), searched recursively."""
    found = []
    for ext in EXTENSIONS.values():
        found += sorted(p for p in folder.rglob(f"{ext}*.so") if p.is_file())
    return found


def build_extensions(target: Path, torch_site: Path | None) -> Path:
    """Compile both extensions for DEVICE_ARCH into `target` (one folder per extension); the folder.

    Each library's own first-import build runs in a subprocess with TORCH_EXTENSIONS_DIR=target; an import that
    fails after the .so exists (no GPU here) is fine, a build that leaves no .so is an error naming its log.
    """
    import os

    target.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(target), "TORCH_CUDA_ARCH_LIST": DEVICE_ARCH}
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    if torch_site is not None:
        env["PYTHONPATH"] = f"{torch_site}{os.pathsep}{env.get('PYTHONPATH', '')}"
    for package, ext in EXTENSIONS.items():
        print(f"gpu-bundle: building {ext} for sm_{DEVICE_ARCH.replace('.', '')} (MAX_JOBS={env['MAX_JOBS']})",
              flush=True)  # fmt: skip
        log = target / f"{ext}.build.log"
        with log.open("w", encoding="utf-8") as f:
            subprocess.run(
                [sys.executable, "-c", f"import {package}"], env=env, stdout=f, stderr=f, check=False
            )
        if not list((target / ext).glob(f"{ext}*.so")):
            raise SystemExit(f"gpu-bundle: {ext} did not build (log: {log})")
    return target


def parse(argv: list[str]) -> tuple[Path, Path | None, bool, Path | None]:
    import argparse

    parser = argparse.ArgumentParser(prog="gpu_bundle.py")
    parser.add_argument("out", nargs="?", default="gpu-bundle")
    parser.add_argument(
        "--prebuilt-ext", type=Path, help="a folder holding exllamav2_ext / exllamav3_ext .so files"
    )
    parser.add_argument(
        "--build-ext", action="store_true", help="compile both extensions here for sm_90 first"
    )
    parser.add_argument("--torch-site", type=Path, help="a site-packages folder with a CUDA build of torch")
    args = parser.parse_args(argv)
    return Path(args.out).resolve(), args.prebuilt_ext, args.build_ext, args.torch_site


def add_extensions(out: Path, source: Path) -> list[Path]:
    files = prebuilt_files(source)
    if not files:
        raise SystemExit(f"gpu-bundle: no exllamav2_ext / exllamav3_ext .so files in {source}")
    ext_dir = out / "ext"
    ext_dir.mkdir(exist_ok=True)
    for path in files:
        shutil.copy(path, ext_dir / path.name)
    return files


def main(argv: list[str]) -> int:
    out, prebuilt, build_ext, torch_site = parse(argv)
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    print(f"gpu-bundle: building specchat's wheel into {wheels}", flush=True)
    project = build_wheel(wheels, out)

    print(f"gpu-bundle: resolving for CPython {PYTHON_VERSION} manylinux x86_64", flush=True)
    packages = resolve(project)
    on_box = box_closure(packages)
    bundled = sorted(name for name in packages if name not in on_box and name != "specchat")
    pins = [
        f"{packages[name]['metadata']['name']}=={packages[name]['metadata']['version']}" for name in bundled
    ]

    print(f"gpu-bundle: downloading {len(pins)} wheels", flush=True)
    pip("download", "--quiet", "--no-deps", "--dest", str(wheels), *target_args(), *pins)
    (out / "exl3").mkdir()
    pip("download", "--quiet", "--no-deps", "--dest", str(out / "exl3"), *target_args(), EXL3_WHEEL)
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
    if build_ext:
        prebuilt = build_extensions(Path(tempfile.mkdtemp(prefix="specchat-ext-")), torch_site)
    if prebuilt is not None:
        files = add_extensions(out, prebuilt)
        print(f"gpu-bundle: prebuilt extensions: {', '.join(p.name for p in files)}", flush=True)

    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"gpu-bundle: {out} holds {len(pins) + 1} wheels, {size / 2**20:.1f} MiB", flush=True)
    if size > LIMIT_BYTES:
        largest = max((p for p in out.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        print(
            f"gpu-bundle: error: {size / 2**20:.1f} MiB is over the 64 MiB limit (largest: {largest.name}, "
            f"{largest.stat().st_size / 2**20:.1f} MiB); carry the extensions in a second bundle and run the check "
            "twice on one warm machine",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
