"""Stand-in for exllamav2's tokenizer: tokenizer.json through the `tokenizers` library, as the real one."""

from __future__ import annotations

import json
import os

import torch
from tokenizers import Tokenizer


class ExLlamaV2Tokenizer:
    def __init__(self, config, lazy_init=True, force_json=False, force_spm=False):
        self.config = config
        path_hf = os.path.join(config.model_dir, "tokenizer.json")
        if not os.path.exists(path_hf):
            raise FileNotFoundError("No supported tokenizer found.")
        self.tokenizer_model = Tokenizer.from_file(path_hf)
        with open(path_hf, encoding="utf8") as f:
            added = json.load(f).get("added_tokens", [])
        self.extended_piece_to_id = {t["content"]: t["id"] for t in added if t.get("special")}
        self.extended_id_to_piece = {v: k for k, v in self.extended_piece_to_id.items()}
        self.actual_vocab_size = self.tokenizer_model.get_vocab_size(with_added_tokens=True)
        tc_path = os.path.join(config.model_dir, "tokenizer_config.json")
        tc = {}
        if os.path.exists(tc_path):
            with open(tc_path, encoding="utf8") as f:
                tc = json.load(f)

        def from_tc(key, current, default):
            if current is not None:
                return current
            st = tc.get(key)
            if isinstance(st, dict):
                st = st.get("content")
            return self.tokenizer_model.token_to_id(st) if isinstance(st, str) else default

        self.eos_token_id = from_tc("eos_token", config.eos_token_id, 2)
        self.bos_token_id = from_tc("bos_token", config.bos_token_id, 1)
        self.pad_token_id = from_tc("pad_token", config.pad_token_id, None)
        self.id_to_piece = None
        self.id_to_piece_with_special = None

    def get_vocab_size(self) -> int:
        return self.actual_vocab_size

    def single_id(self, token: str) -> int:
        return self.extended_piece_to_id.get(token, self.tokenizer_model.token_to_id(token))

    def encode(
        self,
        text,
        add_bos=False,
        add_eos=False,
        encode_special_tokens=False,
        return_offsets=False,
        embeddings=None,
    ):
        if encode_special_tokens:
            ids = self.tokenizer_model.encode(text, add_special_tokens=False).ids
        else:
            # Special-token text is plain text: encode the pieces between them separately.
            ids = []
            for part in _split_keep(text, list(self.extended_piece_to_id)):
                ids += self.tokenizer_model.encode(part, add_special_tokens=False).ids
        if add_bos:
            ids = [self.bos_token_id] + ids
        if add_eos:
            ids = ids + [self.eos_token_id]
        return torch.tensor([ids], dtype=torch.long)

    def decode(self, ids, decode_special_tokens=False):
        assert isinstance(ids, torch.Tensor), "ids must be Tensor"
        if ids.dim() > 1:
            return [self.decode(ids[i], decode_special_tokens) for i in range(ids.shape[0])]
        return self.tokenizer_model.decode(ids.tolist(), skip_special_tokens=not decode_special_tokens)

    def get_id_to_piece_list(self, include_special_tokens=False):
        if include_special_tokens:
            if self.id_to_piece_with_special is None:
                pieces = self.get_id_to_piece_list().copy()
                for k, v in self.extended_id_to_piece.items():
                    pieces[k] = v
                self.id_to_piece_with_special = pieces
            return self.id_to_piece_with_special
        if self.id_to_piece is None:
            decoder = self.tokenizer_model.decode
            self.id_to_piece = [
                "" if i in self.extended_id_to_piece else decoder([i]) for i in range(self.actual_vocab_size)
            ]
        return self.id_to_piece


def _split_keep(text: str, specials: list[str]) -> list[str]:
    parts = [text]
    for s in specials:
        parts = [p for chunk in parts for p in _interleave(chunk.split(s), s)]
    return [p for p in parts if p]


def _interleave(pieces: list[str], sep: str) -> list[str]:
    out = []
    for i, p in enumerate(pieces):
        if i:
            out.append(sep)
        out.append(p)
    return out
