"""Whether a path holds a model a backend can load: a Hugging Face folder, a .gguf file or a folder holding one; and
the draft setting checked the same way. Cheap (file headers only), so the settings dialog checks as you type."""

from __future__ import annotations

import json
from pathlib import Path

from engine.models.cache import ModelError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


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
