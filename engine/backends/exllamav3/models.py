"""What the exllamav3 backend loads, beside the backend: the cache's page size, an out-of-memory test, a tokenizer
seen as the draft-compatibility check sees one, and `Models`, all that `load()` builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAGE_SIZE = 256  # exllamav3's constants.PAGE_SIZE: cache sizes must be a multiple of it


def round_up_to_page(tokens: int) -> int:
    return max(PAGE_SIZE, -(-tokens // PAGE_SIZE) * PAGE_SIZE)


class ExLlamaV3Vocab:
    """An exllamav3 Tokenizer seen through the few transformers methods `engine.decoding.draft_compat` asks for."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces = tokenizer.get_id_to_piece_list(True)

    def __len__(self) -> int:
        return int(self.tokenizer.actual_vocab_size)  # exllamav3 has no get_vocab_size()

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.pieces[i] if 0 <= i < len(self.pieces) else None for i in ids]

    def convert_tokens_to_ids(self, tokens: str) -> int | None:
        return self.tokenizer.single_id(tokens)


def vocab_view(name: str, tokenizer: Any, end_of_turn: str | None) -> Any:
    from engine.decoding.draft_compat import VocabView

    vocab = ExLlamaV3Vocab(tokenizer)
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
    calibrator: Any | None  # the library's dynamic-draft calibrator, lent to the generator per reply
    cache_len: int
    eos_id: int | None
    end_of_turn_id: int | None
    device: str
