"""What a model holds, read from its files alone: parameters, shapes, dtypes, quantization, chat template (for
`specchat info`, the loading screen, the doctor and `specchat plan`), a GGUF file's shape included."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from engine.models.cache import ModelError
from engine.models.folders import validate_model_folder

# The config keys that count a mixture of experts' routed experts (Qwen-MoE / Qwen3.5-MoE / OLMoE; Mixtral /
# gpt-oss; DeepSeek-style).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# The exact parameter count where the file says it (a GGUF's tensors, `gguf_config`): it wins over the estimate.
EXACT_PARAMS_KEY = "num_parameters"


def _mlp_params(text: dict[str, Any], hidden: int, intermediate: int) -> int:
    """One layer's feed-forward weights: gate, up and down, or on a mixture of experts every routed expert's (of
    `moe_intermediate_size`, else `intermediate_size`), the shared expert's and the router."""
    experts = next((int(text[k]) for k in EXPERT_COUNT_KEYS if _positive_int(text.get(k))), 0)
    if not experts:
        return 3 * hidden * intermediate
    width = int(text.get("moe_intermediate_size") or intermediate)
    shared = (
        int(text.get("shared_expert_intermediate_size") or 0)
        or int(text.get("n_shared_experts") or 0) * width
    )
    return 3 * hidden * (experts * width + shared) + hidden * experts


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def estimate_param_count(config: dict[str, Any]) -> int | None:
    """Parameters of a decoder from its config alone (None when the config lacks the sizes): Llama-style layers,
    with every routed expert counted on a mixture of experts (they all sit in memory, whatever runs per token).
    The exact count where the config carries one (`EXACT_PARAMS_KEY`)."""
    if _positive_int(config.get(EXACT_PARAMS_KEY)):
        return int(config[EXACT_PARAMS_KEY])
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
        heads = int(text["num_attention_heads"])
        intermediate = int(text["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o + k, v
    mlp = _mlp_params(text, hidden, intermediate)
    norms = 2 * hidden
    embeddings = vocab * hidden
    lm_head = (
        0 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)) else vocab * hidden
    )
    return embeddings + layers * (attention + mlp + norms) + hidden + lm_head


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes) without reading the weights."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def model_info(path: str | Path) -> dict[str, Any]:
    """What a model folder holds, for `specchat info`, the loading screen and the doctor."""
    folder = validate_model_folder(path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    dtype_params: dict[str, int] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            header = read_safetensors_header(shard)
        except (OSError, ValueError, struct.error):
            continue
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape", []):
                count *= int(dim)
            dtype = str(entry.get("dtype", "?")).lower()
            dtype_params[dtype] = dtype_params.get(dtype, 0) + count

    counted = sum(dtype_params.values())
    estimated = estimate_param_count(config)
    quantization = config.get("quantization_config")
    architectures = config.get("architectures") or []
    return {
        "path": str(folder),
        "name": folder.name,
        "architecture": architectures[0] if architectures else config.get("model_type", "unknown"),
        "model_type": config.get("model_type"),
        # The safetensors count is exact but omits a tied lm_head, as the model itself does.
        "params": counted or estimated,
        "params_source": "safetensors" if counted else ("config" if estimated else None),
        "params_estimate": estimated,
        "vocab_size": text.get("vocab_size"),
        "max_position_embeddings": text.get("max_position_embeddings"),
        "hidden_size": text.get("hidden_size"),
        "num_layers": text.get("num_hidden_layers"),
        "num_attention_heads": text.get("num_attention_heads"),
        "num_key_value_heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
        "head_dim": _head_dim(text),
        "dtype_on_disk": max(dtype_params, key=dtype_params.__getitem__) if dtype_params else None,
        "dtypes_on_disk": dtype_params,
        "quantization": quantization.get("quant_method") if isinstance(quantization, dict) else None,
        "size_on_disk_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
        "has_chat_template": _has_chat_template(folder),
    }


def _head_dim(text: dict[str, Any]) -> int | None:
    if text.get("head_dim"):
        return int(text["head_dim"])
    if text.get("hidden_size") and text.get("num_attention_heads"):
        return int(text["hidden_size"]) // int(text["num_attention_heads"])
    return None


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    config_path = folder / "tokenizer_config.json"
    try:
        return bool(json.loads(config_path.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def gguf_config(path: str | Path) -> tuple[dict[str, Any], float]:
    """A GGUF file's shape as a Hugging Face style config dict (with its exact parameter count), and its bits per
    weight (file size / params).

    For `specchat plan` on a `.gguf` model: the same planner then sizes its weights and KV cache.
    """
    from gguf import GGUFReader

    path = Path(path).expanduser()
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        if len(field.data) == 1:
            part = field.parts[field.data[0]]
            return (
                part.tobytes().decode("utf-8") if field.types and field.types[0].name == "STRING" else part[0]
            )
        return len(field.data)  # an array: its length (e.g. the token list)

    arch = value("general.architecture") or "llama"
    config = {
        "model_type": arch,
        "hidden_size": value(f"{arch}.embedding_length"),
        "num_hidden_layers": value(f"{arch}.block_count"),
        "intermediate_size": value(f"{arch}.feed_forward_length"),
        "num_attention_heads": value(f"{arch}.attention.head_count"),
        "num_key_value_heads": value(f"{arch}.attention.head_count_kv"),
        "max_position_embeddings": value(f"{arch}.context_length"),
        "vocab_size": value("tokenizer.ggml.tokens"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "head_dim": value(f"{arch}.attention.key_length"),
    }
    config.update(_gguf_hybrid_layers(reader, arch, value))
    config = {
        k: (int(v) if hasattr(v, "__int__") and not isinstance(v, bool | str) else v)
        for k, v in config.items()
    }
    params = sum(int(t.n_elements) for t in reader.tensors)
    bits = path.stat().st_size * 8 / params if params else 16.0
    if params:
        # Counted, not estimated: a mixture of experts' or a hybrid's layers are not Llama-shaped.
        config[EXACT_PARAMS_KEY] = params
    return config, bits


def _gguf_hybrid_layers(reader: Any, arch: str, value: Any) -> dict[str, Any]:
    """A hybrid GGUF's layer kinds (and KV heads), for the KV cache's plan: {} for a model of attention layers."""
    # KV heads listed per layer (LFM2, Granite-H, Nemotron-H: 0 for a recurrent layer).
    per_layer = reader.fields.get(f"{arch}.attention.head_count_kv")
    if per_layer is not None and len(per_layer.data) > 1:
        heads_kv = [int(per_layer.parts[i][0]) for i in per_layer.data]
        kinds = ["full_attention" if n else "recurrent" for n in heads_kv]
        return {"num_key_value_heads": max(heads_kv), "layer_types": kinds}
    # Every Nth layer attention (Qwen3.5 / Qwen3-Next: llama.cpp's `full_attention_interval`, layer i recurrent
    # unless (i + 1) % N == 0); the MTP layers (`nextn_predict_layers`) sit past the others.
    interval, layers = value(f"{arch}.full_attention_interval"), value(f"{arch}.block_count")
    if interval and layers:
        own = int(layers) - int(value(f"{arch}.nextn_predict_layers") or 0)
        kinds = ["full_attention" if (i + 1) % int(interval) == 0 else "linear_attention" for i in range(own)]
        return {"layer_types": kinds}
    return {}
