"""Stand-in for exllamav2.config.ExLlamaV2Config: reads config.json the way the real prepare() does."""

from __future__ import annotations

import glob
import json
import os

from exllamav2.standin import read_script


class ExLlamaV2Config:
    def __init__(self, model_dir: str | None = None):
        self.max_batch_size = 1
        self.max_input_len = 2048
        self.max_attention_size = 2048**2
        self.max_output_len = None
        self.scale_pos_emb = 1.0
        self.scale_alpha_value = 1.0
        self.no_flash_attn = "EXLLAMA_NO_FLASH_ATTN" in os.environ
        self.no_xformers = "EXLLAMA_NO_XFORMERS" in os.environ
        self.no_sdpa = "EXLLAMA_NO_SDPA" in os.environ
        self.load_in_q4 = False
        self.no_graphs = "EXLLAMA_NO_GRAPHS" in os.environ
        if model_dir is not None:
            self.model_dir = model_dir
            self.prepare()
        else:
            self.model_dir = None
        self.max_dq_size = 512 * (1024**2)

    def prepare(self, no_tensors: bool = False):
        assert self.model_dir is not None, "No model_dir specified in ExLlamaV2Config"
        assert os.path.exists(self.model_dir), "Can't find " + self.model_dir
        self.model_config = os.path.join(self.model_dir, "config.json")
        assert os.path.exists(self.model_config), "Can't find " + self.model_config
        with open(self.model_config, encoding="utf8") as f:
            read_config = json.load(f)
        assert len(read_config["architectures"]) == 1, "Multiple architectures defined in config.json"
        self.architecture = read_config["architectures"][0]
        self.bos_token_id = read_config.get("bos_token_id")
        self.eos_token_id = read_config.get("eos_token_id")
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = self.eos_token_id[0]
        self.pad_token_id = read_config.get("pad_token_id")
        self.vocab_size = read_config["vocab_size"]
        self.num_hidden_layers = read_config["num_hidden_layers"]
        self.hidden_size = read_config["hidden_size"]
        self.num_attention_heads = read_config.get("num_attention_heads", 0)
        self.head_dim = read_config.get("head_dim", self.hidden_size // max(self.num_attention_heads, 1))
        self.num_key_value_heads = read_config.get("num_key_value_heads", self.num_attention_heads)
        self.rotary_embedding_base = float(
            read_config.get("rope_theta", 10000.0)
        )  # llama default, as the real one
        self.max_seq_len = 2048
        for key in (
            "max_sequence_length",
            "model_max_length",
            "max_position_embeddings",
            "max_seq_len",
            "n_positions",
        ):
            if key in read_config:
                self.max_seq_len = int(read_config[key])
                break
        self.original_max_seq_len = self.max_seq_len
        self.standin = read_script(self.model_dir)
        if no_tensors:
            return
        self.tensor_files = glob.glob(os.path.join(self.model_dir, "*.safetensors"))
        if len(self.tensor_files) == 0:
            raise ValueError(f" ## No .safetensors files found in {self.model_dir}")

    def arch_compat_overrides(self, quiet: bool = False, warn_only=False):
        pass
