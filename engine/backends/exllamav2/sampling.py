"""Our sampler as ExLlamaV2's sampler settings: every field a reply relies on, set explicitly. No exllamav2 import
(the settings class is passed in), so it runs and is tested without CUDA.
"""

from __future__ import annotations

from typing import Any

from engine.request import SamplerSettings


def sampler_fields(sampler: SamplerSettings, temperature: float) -> dict[str, Any]:
    """Every `ExLlamaV2Sampler.Settings` field a reply relies on.

    The library's defaults are not neutral (repetition penalty 1.025, top-k 50, top-p 0.8), so each one is set:
    our neutral values (top_k 0, top_p 1.0, min_p 0) also mean "off" to exllamav2's sampler, and a temperature
    below 0.01 makes it greedy, like ours at 0.
    """
    return {
        "temperature": temperature,
        "top_k": sampler.top_k,
        "top_p": sampler.top_p,
        "min_p": sampler.min_p,
        "token_repetition_penalty": sampler.repetition_penalty,
        "token_repetition_range": -1,
        "token_repetition_decay": 0,
        "token_frequency_penalty": 0.0,
        "token_presence_penalty": 0.0,
        "top_a": 0.0,
        "tfs": 0.0,
        "typical": 0.0,
        "skew": 0.0,
        "smoothing_factor": 0.0,
        "min_temp": 0.0,
        "max_temp": 0.0,
        "temp_exponent": 1.0,
        "temperature_last": False,
        "mirostat": False,
        "dry_multiplier": 0.0,
        "xtc_probability": 0.0,
        "token_bias": None,
        "cfg_scale": None,
    }


def build_sampler_settings(settings_cls: type, sampler: SamplerSettings, temperature: float) -> Any:
    """A fresh `ExLlamaV2Sampler.Settings` for one reply (never shared: the job mutates nothing else)."""
    settings = settings_cls()
    for name, value in sampler_fields(sampler, temperature).items():
        setattr(settings, name, value)
    return settings
