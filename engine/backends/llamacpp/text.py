"""llama.cpp's vocabulary as text: GGUF files found and checked, byte pieces streamed as whole characters, and
the vocabulary view that the draft/target compatibility check reads. No model state lives here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.decoding.round_loop import common_prefix
from engine.errors import BackendError


class ByteDetokenizer:
    """Text deltas of a growing token list from llama.cpp's byte pieces; a trailing half character (U+FFFD)
    is held back until its other bytes arrive."""

    def __init__(self, piece) -> None:
        self.piece = piece
        self.data = bytearray()
        self.sent = ""

    def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        for token in token_ids:
            self.data += self.piece(token)
        text = self.data.decode("utf-8", "replace")
        if not final and text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        shared = len(self.sent) if text.startswith(self.sent) else common_prefix(self.sent, text)
        self.sent = text
        return text[shared:]


def resolve_gguf(path: str | Path, what: str = "model") -> Path:
    """A .gguf file, or a folder holding exactly one; BackendError (one line) otherwise."""
    path = Path(path).expanduser()
    if not path.exists():
        raise BackendError(f"{what} not found: {path}")
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise BackendError(
                f"{what} folder {path} holds {len(found)} .gguf files; the llama.cpp backend needs one "
                "(give the .gguf file itself)"
            )
        path = found[0]
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise BackendError(f"{what} {path} is not a GGUF file (no GGUF header)")
    return path


class GgufTokenizer:
    """What `engine.decoding.draft_compat` needs of a tokenizer, over a llama.cpp vocabulary."""

    def __init__(self, llama_cpp, vocab, size: int) -> None:
        self._lib = llama_cpp
        self._vocab = vocab
        self._size = size

    def __len__(self) -> int:
        return self._size

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        get = self._lib.llama_vocab_get_text
        return [get(self._vocab, i).decode("utf-8", "replace") if 0 <= i < self._size else None for i in ids]

    def convert_tokens_to_ids(self, tokens: str) -> int | None:
        return None  # the check only needs ids -> strings; special ids come from the vocabulary itself
