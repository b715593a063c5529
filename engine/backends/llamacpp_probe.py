"""llama.cpp's kernel probe: how wide a pass may be and still compute each row as a one-token decode does.

Contract: `exact_width(target, encode_text, max_context)` decodes a fixed text on the target model's context (left
empty afterwards) one token at a time and as passes of PROBE_WIDTHS tokens, near the start and past
LONG_PROBE_POSITION cached positions, and returns the widest width whose rows, and every narrower width's rows, are
bit-identical to the one-token logits; 1 where even two rows differ. The backend keeps its verify passes within it
(or pads plain steps where it is 1), so speculative output equals plain output.
"""

from __future__ import annotations

# From this many cached positions too, so that a pass straddles 512 keys: stock llama.cpp's CPU flash attention
# takes another path for a single query row over >= 512 keys, and specchat's patched build attends in fixed chunks
# of 256 cache cells (a pass whose rows fall in two chunks is compared with one-token decodes in each).
LONG_PROBE_POSITION = 508
# Pass widths compared row by row with one-token decodes (a 4-row gemm starts at 4; 9 = the widest calibrated
# pass): where all agree, any width is taken as exact, as for a build whose kernels never switch.
PROBE_WIDTHS = (2, 3, 4, 6, 9)


def exact_width(target, encode_text, max_context: int) -> int:
    """The widest pass (of PROBE_WIDTHS) whose rows are all bit-identical to one-token decodes at the same
    positions, every narrower one agreeing too; 1 where even two rows differ.

    llama.cpp may switch kernels at a batch size: Q4_K weights repacked for AVX2 run one gemv per row up to 3
    rows and a 4-row gemm from 4 rows on (logits 0.3 apart), float16 ones on a stock build take tinyBLAS from 2
    rows. Checked near the start and across 512 cached positions, where stock llama.cpp's CPU flash attention
    splits a single query row's keys by thread count (specchat's patched build chunks every row's keys alike)."""
    import numpy as np

    text = "The quick brown fox jumps over the lazy dog. 1, 2, 3, 4, 5: def f(x): return x * 2 # done"
    probe = encode_text(text)
    widest = max(PROBE_WIDTHS)
    if len(probe) < 16 + widest:
        return 1
    long = (probe * (LONG_PROBE_POSITION // len(probe) + 2))[: LONG_PROBE_POSITION + widest]
    cases = [(probe, 8), (probe, len(probe) - widest)]
    if len(long) + widest <= max_context:
        cases.append((long, LONG_PROBE_POSITION))

    def exact_up_to(ids: list[int], start: int) -> int:
        target.clear()
        target.prefill(ids[:start])
        singles = [target.decode([ids[start + j]], outputs=1, pad=False)[0] for j in range(widest)]
        exact = 1
        for width in PROBE_WIDTHS:
            target.crop(start)
            rows = target.decode(ids[start : start + width], outputs=width)
            if not all(np.array_equal(rows[j], singles[j]) for j in range(width)):
                break
            exact = width
        return exact

    try:
        return min(exact_up_to(ids, start) for ids, start in cases)
    finally:
        target.clear()
