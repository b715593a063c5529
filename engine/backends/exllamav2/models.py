"""What the exllamav2 backend loads, beside the backend: the cache's page size and a draft's RoPE stretch, the
config read as exllamav2 needs it, its tokenizer's size as the draft-compatibility check sees it, and `Models`, all
that `load()` builds (the shared parts in engine/backends/library_generator/models.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.exllamav2.library import UNUSABLE_HINT
from engine.backends.library_generator.models import LibraryVocab, LoadedModels
from engine.backends.library_generator.models import round_up_to_page as pages
from engine.decoding.cost_model import VerifyCostModel
from engine.models.folders import FolderNeeds

# What the one folder check (engine.models.folders) asks of a folder for exllamav2.
FOLDER_NEEDS = FolderNeeds(
    engine="exllamav2",
    tokenizers=("tokenizer.json",),
    weights=("*.safetensors",),
    loads="EXL2, GPTQ or FP16 safetensors folders",
    hint=UNUSABLE_HINT,
)
PAGE_SIZE = 256  # exllamav2's PAGED_PAGE_SIZE: cache lengths must be a multiple of it


def round_up_to_page(tokens: int) -> int:
    """Cache length for `tokens`: the dynamic generator wants a multiple of its 256-token page."""
    return pages(tokens, PAGE_SIZE)


def ntk_alpha(native_len: int, target_len: int) -> float:
    """NTK RoPE alpha that stretches a model trained on `native_len` tokens to `target_len`.

    The quadratic fit the exllama community (and TabbyAPI for draft models) uses; 1.0 where no stretch is needed.
    """
    ratio = target_len / native_len
    if ratio <= 1.0:
        return 1.0
    return -0.13436 + 0.80541 * ratio + 0.28833 * ratio**2


def fix_rope_theta(config: Any, folder: Path) -> None:
    """transformers 5 writes `rope_parameters.rope_theta`; exllamav2 only reads top-level `rope_theta`."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return
    params = raw.get("rope_parameters")
    if (
        "rope_theta" not in raw
        and isinstance(params, dict)
        and isinstance(params.get("rope_theta"), int | float)
    ):
        config.rotary_embedding_base = float(params["rope_theta"])


class ExLlamaV2Vocab(LibraryVocab):
    """An ExLlamaV2Tokenizer as the draft-compatibility check sees one."""

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()


@dataclass(slots=True)
class Models(LoadedModels):
    """Everything `load()` builds: the shared parts and exllamav2's own."""

    paged: bool
    draft_forward_s: float
    target_forward_s: float
    # Verify cost by width and the draft step, from the warm-up timings: what adaptive K weighs.
    costs: VerifyCostModel | None = None
