"""Stand-in for exllamav3/model/config.py (1.6.5).

`Config.from_directory(directory, **kwargs)` (lines 259-291) reads config.json, asserts one known architecture and
builds that architecture's config class, which asserts the name again and keeps it as `architecture` (lines
143-146). What the backend reads: `max_position_embeddings` (line 189, also under text_config), `vocab_size`,
`eos_token_id` / `bos_token_id` (lines 163-172), `architecture`, and `model_classes`, the components the
architecture can build. Which architectures have an "mtp" component, and from which key, follows the real
architecture files (ARCHITECTURES below): an MTP component is dropped where the config declares no MTP layer.
"""

from __future__ import annotations

import json
import os

from exllamav3.standin import read_script

# Architecture -> (recurrent layers, where its MTP depth is read, or None: no "mtp" component in 1.6.5).
ARCHITECTURES: dict[str, tuple[bool, str | None]] = {
    "LlamaForCausalLM": (False, None),
    "Qwen2ForCausalLM": (False, None),
    "Qwen3ForCausalLM": (False, None),
    # architecture/qwen3_5.py:150-164, 278-292: the text-only classes pass no mtp_model (caps: lines 484-490).
    "Qwen3_5ForCausalLM": (True, None),
    "Qwen3_5MoeForCausalLM": (True, None),
    # architecture/qwen3_next.py:22, 233-239: Gated DeltaNet, and no MTP component.
    "Qwen3NextForCausalLM": (True, None),
    # architecture/qwen3_5.py:132-147, 260-276: Qwen3_5MTPModel / Qwen3_5MoeMTPModel as "mtp", dropped at
    # mtp_num_hidden_layers 0, read under text_config (lines 126-129, 252-255).
    "Qwen3_5ForConditionalGeneration": (True, "text_config->mtp_num_hidden_layers"),
    "Qwen3_5MoeForConditionalGeneration": (True, "text_config->mtp_num_hidden_layers"),
    # architecture/mimo_v2.py:82, 91, 98-100: attention only, an MTP head of num_nextn_predict_layers depths.
    "MiMoV2ForCausalLM": (False, "num_nextn_predict_layers"),
}


def _read(config_dict: dict, key: str) -> int:
    section, _, name = key.rpartition("->")
    value = (config_dict.get(section) or {}) if section else config_dict
    return int(value.get(name) or 0)


class Config:
    def __init__(self, directory: str, config_dict: dict):
        self.directory = directory
        self.architecture = config_dict["architectures"][0]
        text = config_dict.get("text_config") or {}
        self.max_position_embeddings = config_dict.get(
            "max_position_embeddings", text.get("max_position_embeddings", 2048)
        )
        self.vocab_size = config_dict.get("vocab_size", text.get("vocab_size"))
        eos = config_dict.get("eos_token_id", text.get("eos_token_id"))
        self.eos_token_id_list = eos if isinstance(eos, list) else [eos]
        self.eos_token_id = self.eos_token_id_list[0]
        self.bos_token_id = config_dict.get("bos_token_id")
        self.pad_token_id = config_dict.get("pad_token_id")
        from exllamav3.model.model import Model

        self.recurrent, mtp_key = ARCHITECTURES[self.architecture]
        self.mtp_depth = _read(config_dict, mtp_key) if mtp_key else 0
        self.model_classes = {"text": Model}
        if self.mtp_depth:
            self.model_classes["mtp"] = Model
        self.standin = read_script(directory)

    @staticmethod
    def from_directory(directory: str, **kwargs) -> Config:
        config_filename = os.path.join(directory, "config.json")
        with open(config_filename, encoding="utf8") as f:
            config_dict = json.load(f)
        assert "architectures" in config_dict, f"No architecture defined in {config_filename}"
        archs = config_dict["architectures"]
        assert len(archs) == 1, f"Multiple architectures defined in {config_filename}"
        assert archs[0] in ARCHITECTURES, f"Unknown architecture {archs[0]} in {config_filename}"
        return Config(directory, config_dict)
