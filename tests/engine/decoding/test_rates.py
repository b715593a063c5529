"""One definition of a reply's speed (engine.decoding.rates), used live and in the per-message stats."""

from __future__ import annotations

import pytest

from engine.decoding.acceptance import AcceptanceAccounting
from engine.decoding.rates import decode_tokens_per_s, time_to_first_token
from engine.events import Chunk, Done


def test_decode_speed_leaves_the_first_chunk_and_ttft_out():
    assert decode_tokens_per_s(6, 1.0, 2.5) == 4.0
    assert decode_tokens_per_s(0, 1.0, 1.0) is None  # one chunk: nothing to measure yet
    assert decode_tokens_per_s(3, 1.0, 1.0) is None  # no time between chunks
    assert decode_tokens_per_s(3, None, None) is None
    assert time_to_first_token(10.0, 10.25) == 0.25
    assert time_to_first_token(10.0, None) is None


def _chunk(n: int, t: float) -> Chunk:
    return Chunk("x" * n, tuple(range(n)), drafted=0, accepted=0, origins=(False,) * n, t=t)


def test_live_figures_and_message_stats_agree_exactly():
    accounting = AcceptanceAccounting(t_start=0.0)
    accounting.add(_chunk(3, 1.0))  # the prefill took a second
    assert accounting.live.tokens_per_s is None and accounting.live.ttft_s == 1.0
    accounting.add(_chunk(2, 1.5))
    assert accounting.live.tokens_per_s == 4.0  # 2 tokens in 0.5 s; the first 3 belong to TTFT
    accounting.add(_chunk(4, 2.0))
    assert accounting.live.tokens_per_s == 6.0  # 6 tokens in 1.0 s (not 9 / 2.0 = 4.5 with TTFT folded in)
    stats = accounting.finish(
        Done("eos", prompt_tokens=10), 2.1, preset="qa", num_draft_tokens=0, temperature=0.5,
        draft_mode="none", backend="scripted", model="m",
    )  # fmt: skip
    assert stats.decode_tokens_per_s == accounting.live.tokens_per_s == 6.0
    assert stats.ttft_s == accounting.live.ttft_s == pytest.approx(1.0)
