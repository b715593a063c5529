"""Whether a path holds a model a backend can load: a Hugging Face folder, a .gguf file or a folder holding one; the
one folder check every engine calls with what it needs (`check_model_folder`, `FolderNeeds`); a folder's weights
format (`folder_format`); the draft setting checked the same way. Cheap (file headers only), so the settings dialog
checks as you type."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import UserError, first_line
from engine.models.cache import ModelError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


FolderFormat = Literal["exl3", "exl2", "gptq", "fp16"]


@dataclass(frozen=True, slots=True)
class FolderNeeds:
    """What an engine needs in a model folder, for the one folder check; the defaults: what any engine here reads."""

    engine: str = ""  # who needs it, named in the messages ("" where any engine would do)
    tokenizers: tuple[str, ...] = TOKENIZER_FILES  # one of these
    weights: tuple[str, ...] = WEIGHT_PATTERNS  # files matching one of these
    loads: str = (
        ""  # what the engine loads ("EXL2, GPTQ or FP16 safetensors folders"), said where weights lack
    )
    hint: str = ""  # what to do then
    refuses: tuple[FolderFormat, ...] = ()  # folder formats (folder_format) the engine cannot load
    refused_hint: str = ""  # what to do with one of those


ANY_ENGINE = FolderNeeds()


def check_model_folder(
    path: str | Path,
    what: str = "model",
    needs: FolderNeeds = ANY_ENGINE,
    error: type[UserError] = ModelError,
) -> Path:
    """The folder as an absolute path, unless it lacks what `needs` says an engine needs: then `error` (one line,
    starting with `what`, naming what is missing). Every engine and the settings check folders here."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise error(f"{what} folder not found: {folder}")
    if not folder.is_dir():
        raise error(
            f"{what} path is not a folder: {folder} (point to the model's folder, not a file inside it)"
        )
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise error(f"{what} folder {folder} has no config.json: not a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what} folder {folder}: config.json is not valid JSON ({first_line(exc)})") from exc
    if not isinstance(config, dict):
        raise error(f"{what} folder {folder}: config.json is not a JSON object")
    if not any((folder / name).is_file() for name in needs.tokenizers):
        needed = f": {needs.engine} needs the Hugging Face tokenizer" if needs.engine else ""
        raise error(f"{what} folder {folder} has no tokenizer ({' or '.join(needs.tokenizers)}){needed}")
    if not any(any(folder.glob(pattern)) for pattern in needs.weights):
        found = sorted({p.suffix for p in folder.iterdir() if p.suffix in (".gguf", ".bin", ".pt", ".pth")})
        extra = f" (found {', '.join(found)} files)" if found else ""
        loads = f": {needs.engine} loads {needs.loads}; {needs.hint}" if needs.loads else ""
        raise error(f"{what} folder {folder} has no weights ({' or '.join(needs.weights)}){extra}{loads}")
    fmt = folder_format(folder) if needs.refuses else None
    if fmt in needs.refuses:
        raise error(
            f"{what} folder {folder} is {fmt.upper()}: {needs.engine} loads {needs.loads}; {needs.refused_hint}"
        )
    return folder.resolve()


def validate_model_folder(path: str | Path) -> Path:
    """A Hugging Face folder any engine here loads, as an absolute path; ModelError naming what is missing."""
    return check_model_folder(path)


def read_config(folder: Path) -> dict[str, Any]:
    """A folder's config.json as a dict ({} where there is none or it is not JSON)."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _quantization_config(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    qcfg = config.get("quantization_config")
    if isinstance(qcfg, dict):
        return qcfg
    try:  # exllamav3 also writes quantization_config.json beside config.json
        data = json.loads((folder / "quantization_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def folder_format(folder: Path) -> FolderFormat | None:
    """The weights' format of a Hugging Face-style folder; None where it is no such folder.

    EXL3 (exllamav3's own format, `quantization_config.quant_method == "exl3"` in config.json, written by exllamav3's
    `conversion/compile.py`) runs only on exllamav3; EXL2 and GPTQ only on exllamav2 (exllamav3 1.6.5 loads
    neither); plain FP16/BF16 safetensors load everywhere. `--backend auto` reads it to pick the engine.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return None
    config = read_config(folder)
    method = str(_quantization_config(folder, config).get("quant_method", "")).lower()
    if method in ("exl3", "exl2", "gptq"):
        return method  # type: ignore[return-value]
    if (folder / "measurement.json").is_file() or any(folder.glob("*.exl2*")):
        return "exl2"  # older EXL2 conversions leave no quantization_config
    return "fp16"


GGUF_MAGIC = b"GGUF"


def check_model_path(path: str | Path, what: str = "model") -> Path:
    """A model a backend can load, as an absolute path: a Hugging Face folder, a .gguf file or a folder holding one.

    ModelError (one line, starting with `what`) for a path that does not exist or holds no model. Cheap: reads
    file headers only, so the settings dialog can check a path as it is typed. A model name (qwen2.5-coder-1.5b,
    engine/models/named.py) gives its cache file, fetched or not: loading fetches it.
    """
    from engine.paths import model_name_at, named_model_path

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
    return check_model_folder(target, what)


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
