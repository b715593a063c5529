"""Memory planning: exact byte counts for known shapes, and the advice when a plan does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.memory_plan import (
    CACHE_BYTES_PER_ELEMENT,
    MemoryPlanError,
    format_bytes,
    format_context,
    kv_cache_bytes,
    max_context_that_fits,
    plan_memory,
    weights_bytes,
)

GIB = 1024**3

SMOLLM2 = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "dtype": "float16",
}

# Llama-2-7B's shapes (6,738,415,616 parameters) quantized to 4.0 bits per weight with EXL2.
LLAMA2_7B_EXL2_4BPW = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "exl2", "bits": 4.0},
}


def test_cache_bytes_per_element_include_scale_overhead() -> None:
    # one fp16 scale per 32 quantized elements
    assert CACHE_BYTES_PER_ELEMENT == {"fp16": 2.0, "q8": 1.0625, "q6": 0.8125, "q4": 0.5625}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("fp16", 188_743_680), ("q8", 100_270_080), ("q6", 76_677_120), ("q4", 53_084_160)],
)
def test_kv_cache_bytes_smollm2_8k(mode: str, expected: int) -> None:
    # 2 (k, v) x 30 layers x 3 kv heads x 64 head dim = 11,520 elements per position
    assert kv_cache_bytes(SMOLLM2, mode, 8192) == 11_520 * 8192 * CACHE_BYTES_PER_ELEMENT[mode] == expected


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    # 2 x 32 x 32 x (4096 / 32 = 128) x 2 bytes = 0.5 MiB per position
    assert kv_cache_bytes(LLAMA2_7B_EXL2_4BPW, "fp16", 1) == 524_288


def test_weights_bytes_from_dtype_and_bits() -> None:
    assert weights_bytes(SMOLLM2) == 134_515_008 * 2
    assert weights_bytes({**SMOLLM2, "dtype": "float32"}) == 134_515_008 * 4
    assert weights_bytes(LLAMA2_7B_EXL2_4BPW) == 6_738_415_616 // 2
    assert weights_bytes(LLAMA2_7B_EXL2_4BPW, bits_per_weight=6.0) == 6_738_415_616 * 6 // 8


def test_plan_without_budget_has_totals_and_no_advice() -> None:
    plan = plan_memory(SMOLLM2, "fp16", 8192)
    assert plan.weights_bytes == 269_030_016
    assert plan.kv_cache_bytes == 188_743_680
    assert plan.total_bytes == 457_773_696
    assert (plan.fits, plan.headroom_bytes, plan.advice) == (None, None, "")


def test_plan_with_draft_sizes_draft_cache_to_same_context() -> None:
    plan = plan_memory(LLAMA2_7B_EXL2_4BPW, "q8", 4096, draft_config=SMOLLM2, draft_cache_mode="q4")
    assert plan.draft_weights_bytes == 269_030_016
    assert plan.draft_kv_cache_bytes == 6480 * 4096
    assert plan.draft_cache_mode == "q4"
    assert plan.total_bytes == 3_369_207_808 + 278_528 * 4096 + 269_030_016 + 6480 * 4096
    assert plan_memory(LLAMA2_7B_EXL2_4BPW, "q8", 4096, draft_config=SMOLLM2).draft_cache_mode == "q8"


def test_plan_that_fits_reports_headroom() -> None:
    plan = plan_memory(SMOLLM2, "fp16", 8192, budget_bytes=GIB)
    # 10% of the budget is kept back for activations
    assert plan.headroom_bytes == int(GIB * 0.9) - 457_773_696 == 508_593_945
    assert plan.fits is True
    assert plan.advice == "fits: 436.57 MiB of 921.60 MiB usable, 485.03 MiB to spare"


@pytest.mark.parametrize(
    ("budget", "advice"),
    [
        # weights 3,369,207,808; 16k cache: q8 4,563,402,752, q6 3,489,660,928, q4 2,415,919,104
        (8 * GIB, "use a q6 cache to fit 16k context"),
        (6 * GIB, "use a q4 cache to fit 16k context"),
        (4 * GIB, "lower max_context to 3328 with a q4 cache (16k does not fit)"),
        (
            3 * GIB,
            "the model's weights alone need 3.14 GiB of 2.70 GiB usable: use a smaller or more strongly quantized model",
        ),
    ],
)
def test_advice_when_16k_fp16_does_not_fit(budget: int, advice: str) -> None:
    plan = plan_memory(LLAMA2_7B_EXL2_4BPW, "fp16", 16384, budget_bytes=budget)
    assert plan.fits is False
    assert plan.headroom_bytes < 0
    assert plan.advice == advice


def test_advice_suggests_dropping_the_draft() -> None:
    # q4 at 16k: 5,785,126,912 without the draft, 6,160,325,248 with it; usable 5,940,000,000
    plan = plan_memory(LLAMA2_7B_EXL2_4BPW, "fp16", 16384, draft_config=SMOLLM2, budget_bytes=6_600_000_000)
    assert plan.fits is False
    assert plan.advice == "drop the draft model (use n-gram drafting) and use a q4 cache to fit 16k context"


def test_max_context_that_fits_is_the_largest_multiple_of_256() -> None:
    usable = int(4 * GIB * 0.9)
    context = max_context_that_fits(LLAMA2_7B_EXL2_4BPW, "q4", usable)
    assert context == 3328
    total = plan_memory(LLAMA2_7B_EXL2_4BPW, "q4", context).total_bytes
    assert total <= usable < plan_memory(LLAMA2_7B_EXL2_4BPW, "q4", context + 256).total_bytes
    assert max_context_that_fits(LLAMA2_7B_EXL2_4BPW, "q4", 1000) == 0


def test_errors_are_plan_errors() -> None:
    with pytest.raises(MemoryPlanError, match="unknown cache mode 'q3'; choose one of fp16, q8, q6, q4"):
        plan_memory(SMOLLM2, "q3", 1024)
    with pytest.raises(MemoryPlanError, match="lacks the attention sizes"):
        kv_cache_bytes({"hidden_size": 64}, "fp16", 1024)
    with pytest.raises(MemoryPlanError, match="max_context must be positive"):
        plan_memory(SMOLLM2, "fp16", 0)


def test_formatting() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * GIB) == "3.00 GiB"
    assert format_bytes(-2048) == "-2.00 KiB"
    assert format_context(16384) == "16k"
    assert format_context(3328) == "3328"


@pytest.mark.slow
def test_weights_estimate_matches_the_embedded_model_on_disk(smol_dir: Path) -> None:
    config = json.loads((smol_dir / "config.json").read_text())
    planned = plan_memory(config, "fp16", 2048).weights_bytes
    on_disk = (smol_dir / "model.safetensors").stat().st_size
    assert planned <= on_disk < planned + 100_000  # the rest is the safetensors header


def _exact_params(config) -> int:
    """The parameters transformers' own class builds for `config` (on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _moe_configs():
    from transformers import MixtralConfig, OlmoeConfig, Qwen3MoeConfig

    shared = dict(
        vocab_size=49152, hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
    )
    shared = {**shared, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    return [
        # OLMoE-1B-7B's proportions: 64 experts of the intermediate size, 8 active.
        OlmoeConfig(**shared, intermediate_size=512, num_experts=64, num_experts_per_tok=8),
        # Qwen3-MoE: experts of their own width (moe_intermediate_size), the dense size unused.
        Qwen3MoeConfig(
            **shared, intermediate_size=3072, moe_intermediate_size=256, num_experts=32, num_experts_per_tok=4
        ),
        # Mixtral: num_local_experts.
        MixtralConfig(**shared, intermediate_size=1024, num_local_experts=8, num_experts_per_tok=2),
    ]


@pytest.mark.parametrize("index", range(3), ids=["olmoe", "qwen3moe", "mixtral"])
def test_a_mixture_of_experts_plan_counts_every_expert(index: int) -> None:
    # All experts sit in memory, whichever run per token: a dense estimate said 603 MiB for OLMoE-1B-7B's
    # shape at Q4_K_M (a 4.2 GB file), "fits 8 GB cards".
    from engine.models import estimate_param_count

    config = _moe_configs()[index]
    exact = _exact_params(config)
    estimate = estimate_param_count(config.to_dict())
    assert estimate == pytest.approx(exact, rel=0.01)


def test_a_gguf_plan_counts_its_tensors(smol_dir) -> None:
    from engine.models import estimate_param_count, gguf_config
    from tests.support.models_2026 import gguf_2026

    path = gguf_2026("qwen3moe", smol_dir, quant="Q4_K_M")
    config, bits = gguf_config(path)
    assert estimate_param_count(config) == config["num_parameters"] > 0
    # The plan's weights are the file's tensors (its size less the header and tokenizer).
    assert weights_bytes(config, bits) == pytest.approx(path.stat().st_size, rel=0.001)


def _write_gguf(path: Path, arch: str, fields: dict) -> Path:
    """A minimal GGUF (its header and one small tensor) with `fields` under `arch`."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    for key, value in fields.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_hybrid_gguf_plans_a_kv_cache_for_its_attention_layers_only(tmp_path: Path, smol_dir) -> None:
    from engine.memory_plan import kv_shape
    from engine.models import gguf_config
    from tests.support.models_2026 import gguf_2026

    # Per-layer KV heads (LFM2, Granite-H, Nemotron-H): 0 on a recurrent layer.
    common = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 128}
    common = {**common, "attention.head_count": 4, "attention.key_length": 32}
    lfm2 = _write_gguf(tmp_path / "lfm2.gguf", "lfm2", {**common, "attention.head_count_kv": [0, 0, 2, 0]})
    assert kv_shape(gguf_config(lfm2)[0]) == (1, 2, 32)
    # Every Nth layer attention (Qwen3.5, Qwen3-Next: full_attention_interval); a dense model: every layer.
    qwen35 = _write_gguf(
        tmp_path / "q.gguf", "qwen35", {**common, "attention.head_count_kv": 2, "full_attention_interval": 4}
    )
    assert kv_shape(gguf_config(qwen35)[0]) == (1, 2, 32)
    dense = _write_gguf(tmp_path / "d.gguf", "llama", {**common, "attention.head_count_kv": 2})
    assert kv_shape(gguf_config(dense)[0]) == (4, 2, 32)
    # The real converter's output: the tiny Qwen3.5 (3 Gated DeltaNet layers, then attention; head dim 128).
    assert kv_shape(gguf_config(gguf_2026("qwen35", smol_dir))[0]) == (1, 1, 128)


def test_a_hybrid_config_plans_a_kv_cache_for_its_attention_layers_only() -> None:
    from engine.memory_plan import kv_shape

    base = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256}
    qwen35 = {
        **base,
        "num_hidden_layers": 8,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    }
    nemotron_h = {**base, "num_hidden_layers": 8, "hybrid_override_pattern": "M-M*-M*-"}
    gpt_oss = {**base, "num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert [kv_shape(c)[0] for c in (qwen35, nemotron_h, gpt_oss)] == [2, 2, 4]
    # 2 attention layers of 8: a quarter of what every layer's cache would take.
    assert kv_cache_bytes(qwen35, "fp16", 1024) == 2 * 2 * 2 * 256 * 1024 * 2
