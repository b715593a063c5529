"""What exllamav3 needs of a model folder (the one folder check's `FolderNeeds`), and whether the folder has an MTP
head, read from its files alone (no exllamav3 import). Its weights' format is engine.models.folder_format.
"""

from __future__ import annotations

from pathlib import Path

from engine.models.folders import FolderNeeds, read_config

# config.json keys that give an MTP head's depth: Qwen3.5/3.6 (`mtp_num_hidden_layers`, also under text_config)
# and the DeepSeek-V3 family, GLM-4.5 and others (`num_nextn_predict_layers`), as exllamav3's
# architecture/qwen3_5.py and architecture/deepseek_v3.py read them.
MTP_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")
HINT = "use --backend auto, which picks the engine the folder's format needs"
NEEDS = FolderNeeds(
    engine="exllamav3",
    tokenizers=("tokenizer.json",),
    weights=("*.safetensors",),
    loads="only EXL3 or FP16 safetensors folders",
    hint=HINT,
    refuses=("exl2", "gptq"),
    refused_hint="use --backend exllamav2",
)


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
