"""What a library-driven engine loads, in the shapes both ExLlama libraries share: a cache length in whole pages, a
tokenizer seen as the draft-compatibility check sees one, and `LoadedModels`, what every `load()` builds (each
engine's `Models` adds its own fields). No library import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def round_up_to_page(tokens: int, page_size: int) -> int:
    """Cache length for `tokens`: the generators want a multiple of their page."""
    return max(page_size, -(-tokens // page_size) * page_size)


class LibraryVocab:
    """A library's tokenizer seen through the few transformers methods `engine.decoding.draft_compat` asks for.

    Both libraries' tokenizers have `get_id_to_piece_list` and `single_id`; how they tell their size differs, so an
    engine's vocab says it in `__len__`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces = tokenizer.get_id_to_piece_list(True)

    def __len__(self) -> int:
        raise NotImplementedError

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.pieces[i] if 0 <= i < len(self.pieces) else None for i in ids]

    def convert_tokens_to_ids(self, tokens: str) -> int | None:
        return self.tokenizer.single_id(tokens)


def vocab_view(name: str, tokenizer: Any, end_of_turn: str | None, vocab: type[LibraryVocab]) -> Any:
    from engine.decoding.draft_compat import VocabView

    seen = vocab(tokenizer)
    special: dict[str, int | None] = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    if end_of_turn:
        special["end_of_turn"] = tokenizer.single_id(end_of_turn)
    return VocabView(name=name, tokenizer_size=len(seen), special_ids=special, tokenizer=seen)


@dataclass(slots=True)
class LoadedModels:
    """What every `load()` builds; an engine's `Models` adds what only it has."""

    model: Any
    cache: Any
    tokenizer: Any
    generator: Any
    draft_model: Any | None
    draft_cache: Any | None
    cache_len: int
    eos_id: int | None
    end_of_turn_id: int | None
    device: str
