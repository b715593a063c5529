"""What the exllamav2 backend loads, beside the backend: the cache's page size and a draft's RoPE stretch, the
config read as exllamav2 needs it, a tokenizer seen as the draft-compatibility check sees one, and `Models`, all
that `load()` builds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.exllamav2.library import UNUSABLE_HINT
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
    return max(PAGE_SIZE, -(-tokens // PAGE_SIZE) * PAGE_SIZE)


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


class ExLlamaV2Vocab:
    """An ExLlamaV2Tokenizer seen through the few transformers methods `engine.decoding.draft_compat` asks for."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces = tokenizer.get_id_to_piece_list(True)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.pieces[i] if 0 <= i < len(self.pieces) else None for i in ids]

    def convert_tokens_to_ids(self, tokens: str) -> int | None:
        return self.tokenizer.single_id(tokens)


def vocab_view(name: str, tokenizer: Any, end_of_turn: str | None) -> Any:
    from engine.decoding.draft_compat import VocabView

    vocab = ExLlamaV2Vocab(tokenizer)
    special: dict[str, int | None] = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    if end_of_turn:
        special["end_of_turn"] = tokenizer.single_id(end_of_turn)
    return VocabView(name=name, tokenizer_size=len(vocab), special_ids=special, tokenizer=vocab)


@dataclass(slots=True)
class Models:
    """Everything `load()` builds."""

    model: Any
    cache: Any
    tokenizer: Any
    generator: Any
    draft_model: Any | None
    draft_cache: Any | None
    paged: bool
    cache_len: int
    eos_id: int | None
    end_of_turn_id: int | None
    draft_forward_s: float
    target_forward_s: float
    device: str
    # Verify cost by width and the draft step, from the warm-up timings: what adaptive K weighs.
    costs: VerifyCostModel | None = None
