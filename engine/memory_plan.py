"""Memory planning: what the weights, the KV cache and the draft model will take, and what to lower if it won't fit.

Pure functions of a model's config.json, so `specchat doctor`, the loading screen and the CLI can warn before a
load runs out of memory. Numbers are estimates of the big allocations only (weights and caches); activations and
the CUDA context come on top, which is why the advice keeps a safety margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import UserError
from engine.models import estimate_param_count
from engine.request import CACHE_MODES

# Bytes per cached element. ExLlamaV2's quantized caches store one fp16 scale per 32 elements: 2/32 = 0.0625.
QUANT_SCALE_OVERHEAD = 2 / 32
CACHE_BYTES_PER_ELEMENT: dict[str, float] = {
    "fp16": 2.0,
    "q8": 1.0 + QUANT_SCALE_OVERHEAD,
    "q6": 0.75 + QUANT_SCALE_OVERHEAD,
    "q4": 0.5 + QUANT_SCALE_OVERHEAD,
}
# Cheapest last: the order in which advice tries smaller caches.
CACHE_MODES_BY_SIZE = ("fp16", "q8", "q6", "q4")

WEIGHT_BYTES_PER_PARAM: dict[str, float] = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "float8_e4m3fn": 1.0,
    "float8_e5m2": 1.0,
}
DEFAULT_WEIGHT_BYTES_PER_PARAM = 2.0  # configs that name no dtype are nearly always fp16/bf16 checkpoints

# Activations, scratch buffers and allocator slack: keep this share of the budget free.
SAFETY_MARGIN = 0.10

assert set(CACHE_BYTES_PER_ELEMENT) == set(CACHE_MODES)


class MemoryPlanError(UserError, ValueError):
    """A config that cannot be planned for (missing sizes, unknown cache mode)."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    weights_bytes: int
    kv_cache_bytes: int
    draft_weights_bytes: int
    draft_kv_cache_bytes: int
    cache_mode: str
    draft_cache_mode: str | None
    max_context: int
    budget_bytes: int | None
    advice: str

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.draft_weights_bytes + self.draft_kv_cache_bytes

    @property
    def usable_budget_bytes(self) -> int | None:
        return None if self.budget_bytes is None else int(self.budget_bytes * (1 - SAFETY_MARGIN))

    @property
    def headroom_bytes(self) -> int | None:
        """Budget (less the safety margin) minus the plan; negative when it does not fit."""
        usable = self.usable_budget_bytes
        return None if usable is None else usable - self.total_bytes

    @property
    def fits(self) -> bool | None:
        headroom = self.headroom_bytes
        return None if headroom is None else headroom >= 0


# --------------------------------------------------------------------------------------------------- formulas


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def attention_layers(text: dict[str, Any]) -> int:
    """The layers that keep a KV cache: on a hybrid only its attention layers (Qwen3.5 / Qwen3-Next, LFM2,
    Granite-H `layer_types`; Nemotron-H's `hybrid_override_pattern`, `*` an attention layer), else every layer.
    Sliding-window layers count whole (llama.cpp keeps a full-size cache for them)."""
    layers = int(text["num_hidden_layers"])
    kinds = text.get("layer_types")
    if isinstance(kinds, list | tuple) and kinds:
        return sum(1 for kind in kinds if "attention" in str(kind) and "linear" not in str(kind))
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*")
    return layers


def kv_shape(config: dict[str, Any]) -> tuple[int, int, int]:
    """(attention layers, kv heads, head dim) from a config.json dict."""
    text = _text_config(config)
    try:
        layers = attention_layers(text)
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise MemoryPlanError(f"config.json lacks the attention sizes needed to plan memory ({exc})") from exc
    return layers, kv_heads, head_dim


def kv_cache_bytes(config: dict[str, Any], cache_mode: str, context: int) -> int:
    """2 (keys and values) x layers x kv heads x head dim x positions x bytes per element."""
    if cache_mode not in CACHE_BYTES_PER_ELEMENT:
        raise MemoryPlanError(f"unknown cache mode {cache_mode!r}; choose one of {', '.join(CACHE_MODES)}")
    layers, kv_heads, head_dim = kv_shape(config)
    return math.ceil(2 * layers * kv_heads * head_dim * context * CACHE_BYTES_PER_ELEMENT[cache_mode])


def weight_bytes_per_param(config: dict[str, Any]) -> float:
    """From an EXL2/GPTQ/AWQ quantization config's bits, else from the stored dtype."""
    quantization = config.get("quantization_config")
    if isinstance(quantization, dict):
        bits = quantization.get("bits")
        if isinstance(bits, int | float) and bits > 0:
            return float(bits) / 8
    dtype = config.get("dtype") or config.get("torch_dtype") or _text_config(config).get("dtype")
    return WEIGHT_BYTES_PER_PARAM.get(str(dtype), DEFAULT_WEIGHT_BYTES_PER_PARAM)


def weights_bytes(config: dict[str, Any], bits_per_weight: float | None = None) -> int:
    params = estimate_param_count(config)
    if params is None:
        raise MemoryPlanError("config.json lacks the sizes needed to estimate the parameter count")
    per_param = bits_per_weight / 8 if bits_per_weight else weight_bytes_per_param(config)
    return math.ceil(params * per_param)


def format_bytes(count: int | float) -> str:
    sign = "-" if count < 0 else ""
    value = float(abs(count))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_context(positions: int) -> str:
    return f"{positions // 1024}k" if positions >= 1024 and positions % 1024 == 0 else str(positions)


# --------------------------------------------------------------------------------------------------- planning


def plan_memory(
    config: dict[str, Any],
    cache_mode: str,
    max_context: int,
    draft_config: dict[str, Any] | None = None,
    draft_cache_mode: str | None = None,
    *,
    budget_bytes: int | None = None,
    bits_per_weight: float | None = None,
    draft_bits_per_weight: float | None = None,
) -> MemoryPlan:
    """Plan weights + KV cache (+ draft weights and its cache, same context) against an optional budget.

    The draft cache defaults to the main cache's mode; ExLlamaV2 sizes both caches to the same context.
    """
    if max_context <= 0:
        raise MemoryPlanError(f"max_context must be positive, got {max_context}")
    draft_mode = (draft_cache_mode or cache_mode) if draft_config is not None else None
    parts = _plan_parts(
        config, cache_mode, max_context, draft_config, draft_mode, bits_per_weight, draft_bits_per_weight
    )
    plan = MemoryPlan(
        *parts,
        cache_mode=cache_mode,
        draft_cache_mode=draft_mode,
        max_context=max_context,
        budget_bytes=budget_bytes,
        advice="",
    )
    return replace(plan, advice=_advise(plan, config, draft_config, bits_per_weight, draft_bits_per_weight))


def _plan_parts(
    config: dict[str, Any],
    cache_mode: str,
    context: int,
    draft_config: dict[str, Any] | None,
    draft_mode: str | None,
    bits: float | None,
    draft_bits: float | None,
) -> tuple[int, int, int, int]:
    draft_weights = draft_cache = 0
    if draft_config is not None and draft_mode is not None:
        draft_weights = weights_bytes(draft_config, draft_bits)
        draft_cache = kv_cache_bytes(draft_config, draft_mode, context)
    return (
        weights_bytes(config, bits),
        kv_cache_bytes(config, cache_mode, context),
        draft_weights,
        draft_cache,
    )


def _fits(parts: tuple[int, int, int, int], usable: int) -> bool:
    return sum(parts) <= usable


def max_context_that_fits(
    config: dict[str, Any],
    cache_mode: str,
    usable_bytes: int,
    draft_config: dict[str, Any] | None = None,
    draft_cache_mode: str | None = None,
    *,
    bits_per_weight: float | None = None,
    draft_bits_per_weight: float | None = None,
    multiple: int = 256,
) -> int:
    """Largest context (a multiple of `multiple`, as ExLlamaV2 caches require) that fits; 0 if none does."""
    fixed = weights_bytes(config, bits_per_weight)
    per_position = kv_cache_bytes(config, cache_mode, 1)
    if draft_config is not None:
        fixed += weights_bytes(draft_config, draft_bits_per_weight)
        per_position += kv_cache_bytes(draft_config, draft_cache_mode or cache_mode, 1)
    room = usable_bytes - fixed
    if room <= 0:
        return 0
    context = (room // per_position) // multiple * multiple
    # kv_cache_bytes rounds up per call; step down until the exact total fits.
    while (
        context > 0
        and fixed + _cache_total(config, cache_mode, context, draft_config, draft_cache_mode) > usable_bytes
    ):
        context -= multiple
    return max(context, 0)


def _cache_total(
    config: dict[str, Any],
    cache_mode: str,
    context: int,
    draft_config: dict[str, Any] | None,
    draft_cache_mode: str | None,
) -> int:
    total = kv_cache_bytes(config, cache_mode, context)
    if draft_config is not None:
        total += kv_cache_bytes(draft_config, draft_cache_mode or cache_mode, context)
    return total


def _advise(
    plan: MemoryPlan,
    config: dict[str, Any],
    draft_config: dict[str, Any] | None,
    bits: float | None,
    draft_bits: float | None,
) -> str:
    usable = plan.usable_budget_bytes
    if usable is None:
        return ""
    context_text = format_context(plan.max_context)
    if plan.fits:
        return f"fits: {format_bytes(plan.total_bytes)} of {format_bytes(usable)} usable, {format_bytes(plan.headroom_bytes or 0)} to spare"

    if plan.weights_bytes > usable:
        return (
            f"the model's weights alone need {format_bytes(plan.weights_bytes)} of {format_bytes(usable)} usable: "
            "use a smaller or more strongly quantized model"
        )
    # 1. A smaller cache at the same context (the draft's cache shrinks along with the main one).
    start = CACHE_MODES_BY_SIZE.index(plan.cache_mode)
    for mode in CACHE_MODES_BY_SIZE[start + 1 :]:
        draft_mode = mode if draft_config is not None else None
        parts = _plan_parts(config, mode, plan.max_context, draft_config, draft_mode, bits, draft_bits)
        if _fits(parts, usable):
            return f"use a {mode} cache to fit {context_text} context"
    # 2. Without the draft model (n-gram drafting needs no memory).
    if draft_config is not None:
        for mode in CACHE_MODES_BY_SIZE[start:]:
            parts = _plan_parts(config, mode, plan.max_context, None, None, bits, None)
            if _fits(parts, usable):
                cache_text = "" if mode == plan.cache_mode else f" and use a {mode} cache"
                return f"drop the draft model (use n-gram drafting){cache_text} to fit {context_text} context"
    # 3. A shorter context with the smallest cache.
    smallest = CACHE_MODES_BY_SIZE[-1]
    draft_mode = smallest if draft_config is not None else None
    context = max_context_that_fits(
        config,
        smallest,
        usable,
        draft_config,
        draft_mode,
        bits_per_weight=bits,
        draft_bits_per_weight=draft_bits,
    )
    if context > 0:
        return f"lower max_context to {format_context(context)} with a {smallest} cache ({context_text} does not fit)"
    return (
        f"weights need {format_bytes(plan.weights_bytes + plan.draft_weights_bytes)} of {format_bytes(usable)} "
        "usable, leaving no room for a cache: drop the draft model or use a smaller model"
    )
