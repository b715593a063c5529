"""Write a tiny random Hugging Face model as a GGUF file that llama.cpp loads (float32 tensors), for the tests.

No converter from the llama.cpp sources is needed: gguf-py's tensor-name map gives each tensor its GGUF name, the
model's config gives the hyper-parameters, and the folder's tokenizer.json gives the vocabulary (byte-level BPE,
llama.cpp's "gpt2" tokenizer model). Only what the tests build is handled: Llama/Mistral-style and Gemma 2.
"""

from __future__ import annotations

import json
from pathlib import Path

ARCH = {"llama": "llama", "mistral": "llama", "gemma2": "gemma2"}


def write_tiny_gguf(folder: Path, dest: Path) -> Path:
    import gguf
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    kind = ARCH[config.model_type]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    writer = gguf.GGUFWriter(dest, arch=kind)
    writer.add_name(folder.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or 10000.0))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if kind == "llama":
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_vocab_size(config.vocab_size)
    if kind == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_sliding_window(config.sliding_window)
    _add_tokenizer(writer, folder, config.vocab_size)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, kind.upper()), config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.detach().to(torch.float32).numpy()
        if kind == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            # llama.cpp's Llama rope rotates interleaved pairs, transformers' rotates halves (as the converter does)
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            values = _interleave_rope_halves(values, heads)
        if kind == "gemma2" and name.endswith("norm.weight"):
            values = values + 1.0  # Gemma's RMSNorm scales by (1 + weight); llama.cpp's by weight
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _interleave_rope_halves(weights, heads: int):
    rows = weights.shape[0] // heads // 2
    return weights.reshape(heads, 2, rows, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _add_tokenizer(writer, folder: Path, size: int) -> None:
    import gguf

    data = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(data["model"]["vocab"])
    special = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    vocab.update(special)
    # The model's embedding may have more rows than the tokenizer has tokens: the rest are unused ids.
    tokens = [f"[unused{i}]" for i in range(max(size, max(vocab.values()) + 1))]
    for text, index in vocab.items():
        tokens[index] = text
    types = [
        gguf.TokenType.CONTROL
        if text in special
        else gguf.TokenType.NORMAL
        if text in vocab
        else gguf.TokenType.UNUSED
        for text in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {name: vocab.get(config.get(name) or "") for name in ("bos_token", "eos_token", "pad_token")}
    if ids["bos_token"] is not None:
        writer.add_bos_token_id(ids["bos_token"])
    if ids["eos_token"] is not None:
        writer.add_eos_token_id(ids["eos_token"])
    if ids["pad_token"] is not None:
        writer.add_pad_token_id(ids["pad_token"])
    writer.add_add_bos_token(False)
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)
