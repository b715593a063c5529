"""What a model folder holds, read from its files alone (no exllamav3 import): format, MTP head, fitness to load.

`folder_format` is what `--backend auto` reads to pick the engine a folder needs: EXL3 (exllamav3's own format,
`quantization_config.quant_method == "exl3"` in config.json, written by exllamav3's `conversion/compile.py`) runs
only on exllamav3; EXL2 and GPTQ only on exllamav2 (exllamav3 1.6.5 loads neither); plain FP16/BF16 safetensors
load on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from engine.errors import BackendError

FolderFormat = Literal["exl3", "exl2", "gptq", "fp16"]
# config.json keys that give an MTP head's depth: Qwen3.5/3.6 (`mtp_num_hidden_layers`, also under text_config)
# and the DeepSeek-V3 family, GLM-4.5 and others (`num_nextn_predict_layers`), as exllamav3's
# architecture/qwen3_5.py and architecture/deepseek_v3.py read them.
MTP_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")
HINT = "use --backend auto, which picks the engine the folder's format needs"


def read_config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _quantization_config(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    qcfg = config.get("quantization_config")
    if isinstance(qcfg, dict):
        return qcfg
    try:  # exllamav3 also writes quantization_config.json beside config.json
        data = json.loads((folder / "quantization_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def folder_format(folder: Path) -> FolderFormat | None:
    """The weights' format of a Hugging Face-style folder; None where it is no such folder."""
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


def mtp_depth(folder: Path) -> int:
    """How many MTP layers config.json declares (0: none)."""
    config = read_config(Path(folder))
    sections = [config]
    if isinstance(config.get("text_config"), dict):
        sections.append(config["text_config"])
    depth = 0
    for section in sections:
        for key in MTP_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                depth = max(depth, value)
    return depth


def has_mtp_head(folder: Path) -> bool:
    return mtp_depth(folder) > 0


def check_model_folder(folder: Path, what: str) -> None:
    """BackendError (one line) unless `folder` looks like something exllamav3 loads."""
    if not folder.is_dir():
        raise BackendError(f"{what} folder not found: {folder}")
    if not (folder / "config.json").is_file():
        raise BackendError(f"{what} folder {folder} has no config.json: not a model folder")
    if not (folder / "tokenizer.json").is_file():
        raise BackendError(
            f"{what} folder {folder} has no tokenizer.json (exllamav3 needs the Hugging Face tokenizer)"
        )
    if not any(folder.glob("*.safetensors")):
        found = sorted({p.suffix for p in folder.iterdir() if p.suffix in (".gguf", ".bin", ".pt", ".pth")})
        extra = f" (found {', '.join(found)} files)" if found else ""
        raise BackendError(
            f"{what} folder {folder} has no .safetensors weights{extra}: exllamav3 loads EXL3 or FP16 "
            f"safetensors folders; {HINT}"
        )
    fmt = folder_format(folder)
    if fmt in ("exl2", "gptq"):
        raise BackendError(
            f"{what} folder {folder} is {fmt.upper()}: exllamav3 loads only EXL3 (or FP16) folders; "
            "use --backend exllamav2"
        )
