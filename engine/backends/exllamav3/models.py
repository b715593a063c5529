"""What the exllamav3 backend loads, beside the backend: the cache's page size, its tokenizer's size as the
draft-compatibility check sees it, and `Models`, all that `load()` builds (the shared parts in
engine/backends/library_generator/models.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.backends.library_generator.models import LibraryVocab, LoadedModels
from engine.backends.library_generator.models import round_up_to_page as pages

PAGE_SIZE = 256  # exllamav3's constants.PAGE_SIZE: cache sizes must be a multiple of it


def round_up_to_page(tokens: int) -> int:
    return pages(tokens, PAGE_SIZE)


class ExLlamaV3Vocab(LibraryVocab):
    """An exllamav3 Tokenizer as the draft-compatibility check sees one."""

    def __len__(self) -> int:
        return int(self.tokenizer.actual_vocab_size)  # exllamav3 has no get_vocab_size()


@dataclass(slots=True)
class Models(LoadedModels):
    """Everything `load()` builds: the shared parts and exllamav3's own."""

    calibrator: Any | None  # the library's dynamic-draft calibrator, lent to the generator per reply
