"""Our sampler and cache settings as exllamav3's: the pure half of the backend (no exllamav3 import).

`Job(sampler=None)` means exllamav3's `DefaultSampler` (min-p 0.08, temperature 0.8: generator/sampler/presets.py),
not neutral, so every reply gets a `ComboSampler` built from the request's settings. ComboSampler's own defaults are
neutral (rep_p 1.0, min_p 0, top_k 0, top_p 1.0) and it samples greedily (`SS_Argmax`) at temperature exactly 0.0
or top_k 1; our temperature 0 is greedy too, and only exactly 0 is: a small positive temperature samples.
"""

from __future__ import annotations

from typing import Any

from engine.request import SamplerSettings

# Our cache modes as exllamav3's K/V bits (CacheLayer_quant takes 2..8 bits each); None: CacheLayer_fp16.
CACHE_BITS: dict[str, tuple[int, int] | None] = {"fp16": None, "q8": (8, 8), "q6": (6, 6), "q4": (4, 4)}


def combo_sampler_kwargs(sampler: SamplerSettings, temperature: float) -> dict[str, Any]:
    """Every ComboSampler keyword a reply relies on, set explicitly."""
    return {
        "rep_p": sampler.repetition_penalty,
        "freq_p": 0.0,
        "pres_p": 0.0,
        "dry_multiplier": 0.0,
        "temperature": temperature,
        "min_p": sampler.min_p,
        "top_k": sampler.top_k,
        "top_p": sampler.top_p,
        "temp_last": False,
        "adaptive_target": 1.0,
    }


def build_sampler(combo_cls: type, sampler: SamplerSettings, temperature: float) -> Any:
    """A fresh ComboSampler for one reply."""
    return combo_cls(**combo_sampler_kwargs(sampler, temperature))


def cache_kwargs(mode: str, layer_fp16: Any, layer_quant: Any) -> dict[str, Any]:
    """`Cache(...)` keywords for one of our cache modes."""
    bits = CACHE_BITS[mode]
    if bits is None:
        return {"layer_type": layer_fp16}
    k_bits, v_bits = bits
    return {"layer_type": layer_quant, "k_bits": k_bits, "v_bits": v_bits}
