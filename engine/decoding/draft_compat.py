"""Can this draft model draft for that target? Checked once at load, before any token is generated.

A draft proposes token ids and the target verifies them, so both must mean the same text by the same id.
Three rules, each reported by name when it fails:
  vocabulary size     equal, or the draft's larger with every target id spelled the same (padded embeddings)
  special tokens      the same ids for bos, eos and the end-of-turn token
  token strings       identical strings for a sample of ids spread across the vocabulary
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.errors import BackendError

# Ids compared string by string: the first ones (specials, bytes), then an even spread over the vocabulary.
SAMPLE_HEAD = 300
SAMPLE_SPREAD = 700


class DraftIncompatibleError(BackendError):
    """The draft model cannot draft for the target; the message names the failing rule."""


class TokenizerLike(Protocol):
    def __len__(self) -> int: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]: ...

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...


@dataclass(frozen=True, slots=True)
class VocabView:
    """What the check needs to know about one model's vocabulary."""

    name: str
    tokenizer_size: int  # tokens the tokenizer can produce (len(tokenizer))
    special_ids: dict[str, int | None]  # role -> id, e.g. {"bos": 1, "eos": 2, "end_of_turn": 2}
    tokenizer: TokenizerLike


def sample_ids(size: int) -> list[int]:
    head = list(range(min(size, SAMPLE_HEAD)))
    if size <= SAMPLE_HEAD:
        return head
    step = max(1, (size - SAMPLE_HEAD) // SAMPLE_SPREAD)
    spread = list(range(SAMPLE_HEAD, size, step))
    return sorted(set(head + spread + [size - 1]))


def check_draft_compatible(target: VocabView, draft: VocabView) -> None:
    """Raise DraftIncompatibleError naming the first failing rule; return None when the draft can draft."""
    prefix = f"draft model {draft.name} cannot draft for {target.name}"
    # Rule 1: the vocabulary. A smaller draft vocabulary cannot spell the target's text; a larger one is fine
    # when it extends the target's (the check below compares the shared ids), its extra ids are never proposed.
    if draft.tokenizer_size < target.tokenizer_size:
        raise DraftIncompatibleError(
            f"{prefix}: vocabulary size differs ({draft.tokenizer_size} tokens vs the target's "
            f"{target.tokenizer_size}); use a draft from the same model family"
        )
    # Rule 2: special tokens. A draft that ends turns on another id would stop or run on differently.
    for role, target_id in target.special_ids.items():
        if target_id is None:
            continue
        draft_id = draft.special_ids.get(role)
        if draft_id != target_id:
            raise DraftIncompatibleError(
                f"{prefix}: special token ids differ ({role}: draft {draft_id} vs target {target_id}); "
                "use a draft from the same model family"
            )
    # Rule 3: token strings over a sample of the shared ids.
    ids = sample_ids(target.tokenizer_size)
    target_tokens = target.tokenizer.convert_ids_to_tokens(ids)
    draft_tokens = draft.tokenizer.convert_ids_to_tokens(ids)
    for token_id, ours, theirs in zip(ids, target_tokens, draft_tokens, strict=True):
        if ours != theirs:
            raise DraftIncompatibleError(
                f"{prefix}: token strings differ (id {token_id} is {theirs!r} in the draft, {ours!r} in the "
                "target); use a draft with the same tokenizer"
            )


def special_token_ids(tokenizer, end_of_turn: str | None = None) -> dict[str, int | None]:
    """bos / eos / end-of-turn ids of a transformers tokenizer (None where it has none)."""
    ids: dict[str, int | None] = {
        "bos": getattr(tokenizer, "bos_token_id", None),
        "eos": getattr(tokenizer, "eos_token_id", None),
    }
    if end_of_turn:
        token_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        unk = getattr(tokenizer, "unk_token_id", None)
        ids["end_of_turn"] = token_id if token_id is not None and token_id != unk else None
    return ids
