"""Stand-in for exllamav3/tokenizer/tokenizer.py (1.6.5): tokenizer.json through the `tokenizers` library.

What the backend uses: `Tokenizer.from_config(config)` (line 773), `eos_token_id` / `bos_token_id` (lines 173-197),
`actual_vocab_size` (line 252; there is no `get_vocab_size()`), `single_id(token)` (line 297),
`encode(text, add_bos, add_eos, encode_special_tokens, ...)` -> a (1, n) tensor (line 445),
`decode(ids, decode_special_tokens)` -> str for a 1-D tensor (line 586), `get_id_to_piece_list(include_special)`
(line 757).
"""

from __future__ import annotations

import json
import os

import torch
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    def __init__(self, config):
        self.config = config
        path = os.path.join(config.directory, "tokenizer.json")
        self.tokenizer = HFTokenizer.from_file(path)
        with open(path, encoding="utf8") as f:
            added = json.load(f).get("added_tokens", [])
        self.extended_piece_to_id = {t["content"]: t["id"] for t in added if t.get("special")}
        self.extended_id_to_piece = {v: k for k, v in self.extended_piece_to_id.items()}
        self.eos_token_id = config.eos_token_id
        self.bos_token_id = config.bos_token_id
        self.actual_vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self._pieces = None
        self._pieces_special = None

    @staticmethod
    def from_config(config):
        return Tokenizer(config)

    def single_id(self, token: str) -> int:
        return self.extended_piece_to_id.get(token, self.tokenizer.token_to_id(token))

    def encode(self, text, add_bos=False, add_eos=False, encode_special_tokens=False, return_offsets=False,
               embeddings=None):  # fmt: skip
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        if add_eos and self.eos_token_id is not None:
            ids = [*ids, self.eos_token_id]
        return torch.tensor([ids], dtype=torch.long)

    def decode(self, ids, decode_special_tokens=False):
        assert isinstance(ids, torch.Tensor), "ids must be Tensor"
        if ids.dim() > 1:
            return [self.decode(ids[i], decode_special_tokens) for i in range(ids.shape[0])]
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=not decode_special_tokens)

    def get_id_to_piece_list(self, include_special_tokens=False):
        if self._pieces is None:
            decoder = self.tokenizer.decode
            self._pieces = [
                "" if i in self.extended_id_to_piece else decoder([i]) for i in range(self.actual_vocab_size)
            ]
            self._pieces_special = list(self._pieces)
            for k, v in self.extended_id_to_piece.items():
                self._pieces_special[k] = v
        return self._pieces_special if include_special_tokens else self._pieces
