"""What exllamav3 needs of a model folder (the one folder check's `FolderNeeds`), and whether the folder has an MTP
head exllamav3 1.6.5 can draft with, read from its files alone (no exllamav3 import). Its weights' format is
engine.models.folder_format.
"""

from __future__ import annotations

import struct
from pathlib import Path

from engine.models.folders import FolderNeeds, read_config
from engine.models.info import read_safetensors_header

# config.json keys that give an MTP head's depth: Qwen3.5/3.6 (`mtp_num_hidden_layers`, under text_config in the
# released folders: exllamav3 1.6.5 architecture/qwen3_5.py:126, read through `pfx`) and the families that say
# `num_nextn_predict_layers` (architecture/mimo_v2.py:98, nemotronh.py:133, glm4_moe_lite.py:88, ...).
MTP_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")
# Where an MTP layer's weights live, by architecture: Qwen3.5's head is the `mtp.*` tensors (fc, the pre-fc norms,
# mtp.layers.N, mtp.norm: architecture/qwen3_5_mtp.py:35-38, 54, 88, 160). A folder converted without them
# declares the layer in config.json and cannot load it.
MTP_TENSOR_PREFIX = {
    "Qwen3_5ForConditionalGeneration": "mtp.",
    "Qwen3_5MoeForConditionalGeneration": "mtp.",
    "Qwen3_5ForCausalLM": "mtp.",
    "Qwen3_5MoeForCausalLM": "mtp.",
}
# exllamav3 1.6.5 builds Qwen3.5's MTP head only from the multimodal class Qwen3.5 is released as: the
# ForConditionalGeneration configs pass `Qwen3_5MTPModel` / `Qwen3_5MoeMTPModel` as their "mtp" component
# (architecture/qwen3_5.py:132-147, 260-276), the text-only ForCausalLM configs pass none (qwen3_5.py:150-164,
# 278-292), so `Model.from_config(config, component="mtp")` asserts there (model/model.py:186-187).
MTP_FOLDER_OF = {
    "Qwen3_5ForCausalLM": "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM": "Qwen3_5MoeForConditionalGeneration",
}
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
USE_ANOTHER = "use --draft ngram or a draft model"


def architecture(folder: Path) -> str:
    """config.json's one architecture ("" where it names none)."""
    names = read_config(Path(folder)).get("architectures")
    return str(names[0]) if isinstance(names, list) and names else ""


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
    return mtp_depth(folder) > 0 and mtp_tensors_missing(folder) is None


def tensor_names(folder: Path) -> set[str] | None:
    """Every tensor name in the folder's safetensors headers; None where a header cannot be read."""
    names: set[str] = set()
    for shard in sorted(Path(folder).glob("*.safetensors")):
        try:
            header = read_safetensors_header(shard)
        except (OSError, ValueError, struct.error):
            return None
        names.update(name for name in header if name != "__metadata__")
    return names


def mtp_tensors_missing(folder: Path) -> str | None:
    """Why a folder whose config declares MTP layers holds none in its weights; None where it holds them, or where
    the architecture's tensor names are not known here (exllamav3 then says what it misses when it loads)."""
    prefix = MTP_TENSOR_PREFIX.get(architecture(folder))
    names = tensor_names(folder) if prefix else None
    if prefix is None or names is None or any(name.startswith(prefix) for name in names):
        return None
    return f"its weights hold no {prefix}* tensors (converted without the MTP layer?)"


def mtp_refusal(folder: Path) -> str | None:
    """One line saying why `--draft mtp` cannot run on this folder, read from its files; None where it can try."""
    depth = mtp_depth(folder)
    if depth == 0:
        return (
            f"model folder {folder} declares no MTP head (no {' or '.join(MTP_KEYS)} in config.json): "
            f"{USE_ANOTHER}"
        )
    missing = mtp_tensors_missing(folder)
    if missing:
        layers = "layer" if depth == 1 else "layers"
        return f"model folder {folder} declares {depth} MTP {layers} but {missing}: {USE_ANOTHER}"
    return None


def no_mtp_component(version: str, arch: str, folder: Path) -> str:
    """One line for a folder whose architecture exllamav3 builds no MTP head for (no "mtp" component)."""
    host = MTP_FOLDER_OF.get(arch)
    where = (
        f"; it drafts with Qwen3.5's MTP layer only from a {host} folder, as Qwen3.5 is released"
        if host
        else ""
    )
    return f"exllamav3 {version} has no MTP head for {arch} ({Path(folder).name}){where}: {USE_ANOTHER}"
