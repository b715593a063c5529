"""The request vocabulary: what a session asks a backend for, in plain numbers (no presets, no UI).

A leaf (stdlib only): `SamplerSettings` (one message's sampler, with its temperature ramp), `GenerationRequest`
(prompt ids, K, limits, the adaptive-K key, the history drafter's corpus: `HistoryCorpus`), and the KV cache modes ("auto", each engine's default, is the
registry's). Backends, the decoding core, presets and the memory planner all read these, so they live below them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

CACHE_MODES = ("fp16", "q8", "q6", "q4")  # "auto" is each engine's default: engine/backends/registry.py


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    # Temperature ramp: the first `ramp_tokens` tokens of a reply start at `ramp_start` and rise linearly to
    # `temperature`. Cooler early tokens agree with a greedy draft more often.
    ramp_tokens: int = 0
    ramp_start: float = 0.0

    def temperature_at(self, index: int) -> float:
        """Temperature used to sample the reply's token number `index` (0-based)."""
        if self.ramp_tokens <= 0 or index >= self.ramp_tokens:
            return self.temperature
        start = min(self.ramp_start, self.temperature)
        return start + (self.temperature - start) * index / self.ramp_tokens


@dataclass(frozen=True, slots=True)
class CorpusPart:
    """One part of the history drafter's corpus: texts the chat already wrote, under a key that names them.

    `key`: the same key, the same texts (the engine keeps the part's index by it, per tokenizer, and builds it
    again only under a new key). `load()`: the texts, most important first; called off the reply path (a
    background thread), read lazily, and left unread past the engine's token budget."""

    key: str
    load: Callable[[], Iterable[str]]


@dataclass(frozen=True, slots=True)
class HistoryCorpus:
    """What the history drafter (engine/decoding/drafters/history.py) may copy from, in priority order: this
    chat's other variants and branches, then past chats, most recent first. The session fills it from the store;
    the engine tokenizes and indexes it for the loaded model and never reads storage itself."""

    parts: tuple[CorpusPart, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampler: SamplerSettings
    max_new_tokens: int
    num_draft_tokens: int = 0  # K; 0 turns drafting off for this request
    drafting: bool = True
    seed: int | None = None
    # "fixed": K drafts every round (n-gram: K wherever a match is found). "adaptive": K is the ceiling and the
    # backend picks each round's (exllamav2: each reply's) K from measured acceptance and cost.
    # "dynamic" (exllamav3 with a draft model or MTP head): the library's own dynamic draft length cuts each round's
    # draft by the drafter's confidence; elsewhere it drafts like "fixed".
    k_mode: str = "fixed"
    # Whose acceptance estimates an adaptive K learns from and adds to (the preset's name), and the
    # per-position acceptance r_i to start them from (from the metrics log) the first time that key is seen.
    tuning_key: str = ""
    acceptance_prior: tuple[float, ...] = ()
    # The conversation as chat messages (what `prompt_ids` renders): a remote server takes these, not ids.
    messages: tuple[dict[str, str], ...] = ()
    # Text the chat already wrote, for the history drafter beside the request's own (None: none handed in).
    history: HistoryCorpus | None = None

    @property
    def effective_k(self) -> int:
        return self.num_draft_tokens if self.drafting else 0
