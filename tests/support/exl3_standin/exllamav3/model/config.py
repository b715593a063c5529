"""Stand-in for exllamav3/model/config.py (1.6.5).

`Config.from_directory(directory, **kwargs)` (lines 259-291) reads config.json, asserts one known architecture and
builds that architecture's config class. What the backend reads: `max_position_embeddings` (line 189, also under
text_config), `vocab_size`, `eos_token_id` / `bos_token_id` (lines 163-172), and `model_classes`, the components the
architecture can build; "mtp" stays in it only where config.json declares an MTP head (architecture/qwen3_5.py
lines 125-129: `mtp_num_hidden_layers`; deepseek_v3.py and others: `num_nextn_predict_layers`).
"""

from __future__ import annotations

import json
import os

from exllamav3.standin import read_script

ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM"}


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

        self.model_classes = {"text": Model, "mtp": Model}
        depth = max(
            int(section.get(key) or 0)
            for section in (config_dict, text)
            for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers")
        )
        if depth == 0:
            self.model_classes.pop("mtp", None)
        self.mtp_depth = depth
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
