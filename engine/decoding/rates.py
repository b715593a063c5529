"""The one definition of a reply's speed, shared by the live status bar and the per-message stats line.

Decode speed leaves the time to first token (TTFT) out: the first chunk arrives with the prefill, so its
tokens and the time before it belong to TTFT, which is shown beside the speed rather than folded into it.
"""

from __future__ import annotations


def decode_tokens_per_s(tokens_after_first: int, t_first: float | None, t_last: float | None) -> float | None:
    """Tokens emitted after the first chunk per second between the first and the last chunk.

    None until there is something to measure: no chunk yet, a single chunk, or no time between them.
    """
    if t_first is None or t_last is None or tokens_after_first <= 0:
        return None
    elapsed = t_last - t_first
    return tokens_after_first / elapsed if elapsed > 0 else None


def time_to_first_token(t_start: float, t_first: float | None) -> float | None:
    """Seconds from the request to the first chunk; None before the first chunk."""
    return None if t_first is None else max(0.0, t_first - t_start)
