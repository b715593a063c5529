"""The shared sampler: how a target picks its token at each verified position, for every backend.

Semantics follow transformers' logits processors: repetition penalty, then temperature, top-k, top-p, min-p.
Each reply position has its own uniform random number, drawn up front from the request's seed, and tokens are
drawn by inverse CDF. A token therefore depends only on its position and the tokens before it, not on how the
rounds were cut: with a seed, speculative and plain decoding give the same tokens at any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # a leaf module: the settings type only, no import of the backends at run time
    from engine.backends.base import SamplerSettings


def count_accepted(drafts: Sequence[int], samples: Sequence[int]) -> int:
    """Drafts kept: the longest prefix where each draft equals the target's own sample at its position."""
    accepted = 0
    for draft, sample in zip(drafts, samples, strict=False):
        if draft != sample:
            break
        accepted += 1
    return accepted


def apply_repetition_penalty(row: torch.Tensor, history: torch.Tensor, penalty: float) -> None:
    """In place, like transformers' RepetitionPenaltyLogitsProcessor over `history` (prompt + reply so far)."""
    if penalty == 1.0 or history.numel() == 0:
        return
    scores = row.gather(0, history)
    scores = torch.where(scores < 0, scores * penalty, scores / penalty)
    row.scatter_(0, history, scores)


def filtered_probabilities(row: torch.Tensor, temperature: float, settings: SamplerSettings) -> torch.Tensor:
    """The sampling distribution of one position (float64, sums to 1) after temperature, top-k, top-p, min-p."""
    logits = row.double() / temperature
    if 0 < settings.top_k < logits.shape[-1]:
        kth = torch.topk(logits, settings.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if settings.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= (1 - settings.top_p)
        remove_sorted[-1] = False  # keep at least the most likely token
        remove = remove_sorted.scatter(0, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    probs = logits.softmax(-1)
    if settings.min_p > 0.0:
        probs = probs.masked_fill(probs < settings.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs


def sample_from(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample: the token whose interval of the cumulative distribution holds `uniform`."""
    cdf = probs.cumsum(-1)
    target = torch.tensor([uniform * float(cdf[-1])], dtype=cdf.dtype)
    index = int(torch.searchsorted(cdf, target, right=True)[0])
    return min(index, probs.shape[-1] - 1)


def choose_tokens(
    logits: torch.Tensor,
    settings: SamplerSettings,
    reply_index: int,
    context: Sequence[int],
    drafts: Sequence[int],
    uniforms: Sequence[float],
) -> list[int]:
    """The target's token at each of the q rows of `logits` (row j follows context + drafts[:j]).

    `reply_index` is the reply position of row 0; `uniforms[reply_index + j]` is row j's random number.
    """
    rows = logits.shape[0]
    temperatures = [settings.temperature_at(reply_index + j) for j in range(rows)]
    penalty = settings.repetition_penalty
    if penalty == 1.0 and all(t <= 0 for t in temperatures):
        return logits.argmax(-1).tolist()  # greedy fast path: one call for the whole round
    logits = logits.float()
    history = torch.tensor(list(context) + list(drafts), dtype=torch.long, device=logits.device)
    tokens: list[int] = []
    for j in range(rows):
        row = logits[j]
        if penalty != 1.0:
            row = row.clone()
            apply_repetition_penalty(row, history[: len(context) + j], penalty)
        if temperatures[j] <= 0:
            tokens.append(int(row.argmax()))
        else:
            probs = filtered_probabilities(row, temperatures[j], settings)
            tokens.append(sample_from(probs, uniforms[reply_index + j]))
    return tokens
