"""Qwen3.5-family model folders as exllamav3 1.6.5 reads them (tests only): a config.json the REAL `Config` classes
accept (architecture/qwen3_5.py, qwen3_next.py: every key they read without a default), a safetensors file whose
header names the tensors a test asks for (an MTP layer's `mtp.*` or none), and for the multimodal class Qwen3.5 is
released as, the vision config and preprocessor_config.json its config reads (qwen3_vl.py:84-138).

The same folders feed the stand-in tests (tests/engine/backends/exllamav3/test_hybrid_mtp.py) and the checks
against the real package (test_real_hybrids.py), so what the stand-in is asked to follow is what the real one does.
"""

from __future__ import annotations

import json
from pathlib import Path

MULTIMODAL = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
MOE = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM")
TRUNK_TENSOR = "model.embed_tokens.weight"
MTP_TENSORS = ("mtp.fc.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight")

TEXT = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-6,
    "num_hidden_layers": 4,  # 3 Gated DeltaNet layers, then attention (full_attention_interval 4)
    "hidden_act": "silu",
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "bos_token_id": 1,
}
EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
}
VISION = {
    "deepstack_visual_indexes": [],
    "depth": 1,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "num_position_embeddings": 64,
    "out_hidden_size": 256,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "model_type": "qwen3_5",
}
PREPROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def config_for(arch: str, mtp_layers: int, eos_token_id: int, quant_method: str | None) -> dict:
    """config.json of a tiny `arch` model declaring `mtp_layers` MTP layers, where its released configs do."""
    text = {**TEXT, "eos_token_id": eos_token_id, **(EXPERTS if arch in MOE else {})}
    if arch in MULTIMODAL:  # text settings under text_config, as released (qwen3_5.py: `pfx`)
        config: dict = {
            "architectures": [arch],
            "text_config": {**text, "mtp_num_hidden_layers": mtp_layers},
            "vision_config": VISION,
            "eos_token_id": eos_token_id,
            "bos_token_id": 1,
        }
    else:
        config = {"architectures": [arch], **text, "mtp_num_hidden_layers": mtp_layers}
    if quant_method:
        config["quantization_config"] = {"quant_method": quant_method, "bits": 4.0}
    return config


def write_safetensors(path: Path, names: list[str]) -> None:
    """A valid safetensors file holding one tiny F16 tensor per name (what the header says is what counts)."""
    header: dict = {}
    for i, name in enumerate(names):
        header[name] = {"dtype": "F16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0\0" * len(names))


def write_folder(
    folder: Path,
    arch: str,
    *,
    mtp_layers: int = 1,
    mtp_weights: bool = True,
    eos_token_id: int = 2,
    quant_method: str | None = "exl3",
) -> Path:
    """A Qwen3.5-family folder (no tokenizer: the caller adds one where it needs it)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = config_for(arch, mtp_layers, eos_token_id, quant_method)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if arch in MULTIMODAL:
        (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    names = [TRUNK_TENSOR, *(MTP_TENSORS if mtp_weights else ())]
    write_safetensors(folder / "model.safetensors", names)
    return folder
