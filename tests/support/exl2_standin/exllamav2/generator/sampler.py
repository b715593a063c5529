"""Stand-in for exllamav2.generator.sampler: Settings with the real (non-neutral) defaults."""

from __future__ import annotations

from collections import deque
from copy import copy
from dataclasses import dataclass, field


class ExLlamaV2Sampler:
    @dataclass
    class Settings:
        token_repetition_penalty: float = 1.025
        token_repetition_range: int = -1
        token_repetition_decay: int = 0
        token_frequency_penalty: float = 0.0
        token_presence_penalty: float = 0.0
        temperature: float = 0.8
        smoothing_factor: float = 0.0
        min_temp: float = 0
        max_temp: float = 0.0
        temp_exponent: float = 1.0
        top_k: int = 50
        top_p: float = 0.8
        top_a: float = 0.0
        min_p: float = 0
        tfs: float = 0
        typical: float = 0
        skew: float = 0
        temperature_last: bool = False
        mirostat: bool = False
        mirostat_tau: float = 1.5
        mirostat_eta: float = 0.1
        mirostat_mu: float | None = None
        token_bias: object | None = None
        cfg_scale: float | None = None
        post_sampling_hooks: list = field(default_factory=list)
        dry_allowed_length: int = 2
        dry_base: float = 1.75
        dry_multiplier: float = 0.0
        dry_sequence_breakers: set[int] | None = None
        dry_range: int = 0
        dry_max_ngram: int = 20
        ngram_trie: dict | None = None
        ngram_index: int = 0
        ngram_history: deque = field(default_factory=deque)
        xtc_probability: float = 0.0
        xtc_threshold: float = 0.1
        xtc_ignore_tokens: frozenset[int] | None = None

        def clone(self):
            return copy(self)
