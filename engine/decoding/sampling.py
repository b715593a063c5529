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
    from engine.request import SamplerSettings


def reply_uniforms(seed: int, count: int) -> list[float]:
    """The pre-drawn uniform of each reply position (at least one), from a generator seeded by the request."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(max(1, count), generator=generator, dtype=torch.float64).tolist()


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


# Candidates scored for top-p / min-p without top-k: the most likely tokens, enough for any sane nucleus.
CANDIDATE_POOL = 256


def filtered_candidates(
    row: torch.Tensor, temperature: float, settings: SamplerSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling distribution of one position after temperature, top-k, top-p and min-p, sparse.

    Returns (token ids, probabilities) in descending probability, zeros dropped, summing to 1 (float32).
    top-k, top-p and min-p keep a prefix of the tokens sorted by logit, so they are decided on the `CANDIDATE_POOL`
    most likely ones (with the full vocabulary's normaliser); only a nucleus, or a min-p set, wider than the pool
    sorts everything.
    Same semantics as transformers' warpers: top-p keeps a token while the probability above it is < top_p.
    """
    logits = row.float() / temperature
    vocab = logits.shape[-1]
    if 0 < settings.top_k < vocab:
        values, ids = torch.topk(logits, settings.top_k)
        normaliser = torch.logsumexp(values, -1)  # top-p and min-p see the top-k set renormalised
    elif settings.top_p < 1.0 or settings.min_p > 0.0:
        values, ids = torch.topk(logits, min(CANDIDATE_POOL, vocab))
        normaliser = torch.logsumexp(logits, -1)
    else:
        values, ids = torch.sort(logits, descending=True)
        normaliser = torch.logsumexp(values, -1)
    probs = (values - normaliser).exp()
    if settings.top_p < 1.0:
        cumulative = probs.cumsum(-1)
        if (
            float(cumulative[-1]) < settings.top_p
            and ids.shape[-1] < vocab
            and not (0 < settings.top_k < vocab)
        ):
            values, ids = torch.sort(logits, descending=True)  # a nucleus wider than the pool
            probs = (values - normaliser).exp()
            cumulative = probs.cumsum(-1)
        keep = int(((cumulative - probs) < settings.top_p).sum())
        ids, probs = ids[: max(keep, 1)], probs[: max(keep, 1)]
    if settings.min_p > 0.0:
        if (
            ids.shape[-1] == min(CANDIDATE_POOL, vocab) < vocab
            and not (0 < settings.top_k < vocab)
            and settings.top_p >= 1.0
            and float(probs[-1]) >= settings.min_p * float(probs[0])
        ):
            # min-p keeps every pooled token, so it may keep tokens past the pool too: decide on the full row
            values, ids = torch.sort(logits, descending=True)
            probs = (values - normaliser).exp()
        keep = int((probs >= settings.min_p * probs[0]).sum())
        ids, probs = ids[: max(keep, 1)], probs[: max(keep, 1)]
    return ids, probs / probs.sum()


def filtered_probabilities(row: torch.Tensor, temperature: float, settings: SamplerSettings) -> torch.Tensor:
    """The same distribution as `filtered_candidates`, dense over the vocabulary (for tests and peers)."""
    ids, probs = filtered_candidates(row, temperature, settings)
    return torch.zeros(row.shape[-1], dtype=torch.float32).index_put_((ids,), probs)


def sample_from(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF sample: the index whose interval of the cumulative distribution holds `uniform`."""
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
    history = None
    if penalty != 1.0:  # the history tensor is built only where a penalty reads it
        history = torch.tensor(list(context) + list(drafts), dtype=torch.long, device=logits.device)
    tokens: list[int] = []
    for j in range(rows):
        row = logits[j]
        if history is not None:
            row = row.clone()
            apply_repetition_penalty(row, history[: len(context) + j], penalty)
        if temperatures[j] <= 0:
            tokens.append(int(row.argmax()))
        else:
            ids, probs = filtered_candidates(row, temperatures[j], settings)
            tokens.append(int(ids[sample_from(probs, uniforms[reply_index + j])]))
    return tokens
