"""The kernel probe's verdict (engine/backends/llamacpp/probe.py) on a model whose kernels switch where we say.

The stand-in computes each row's logits from the token and its position alone, as an exact kernel does, and adds
one ulp to the rows of passes whose width falls in a planted set (a kernel that rounds otherwise): the probe must
prove every width the loop sends, cap at the first that differs, check padded plain steps against wider passes,
and prove nothing where it cannot judge.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.llamacpp.probe import (
    LONG_PROBE_POSITION,
    PROBE_MAX_WIDTH,
    ProbeVerdict,
    probe_widths,
)
from engine.decoding.drafters.ngram import LONG_DRAFT_MAX

VOCAB = 32


class KernelModel:
    """decode / prefill / crop / clear as LlamaCppModel has them; `off(width, padded)` says whether a pass of
    `width` rows (a padded one-token step: width 2, padded True) rounds otherwise than the exact kernel."""

    def __init__(self, off=lambda width, padded: False) -> None:
        self.ids: list[int] = []
        self.off = off
        self.widths: list[int] = []  # every pass width decoded with outputs, in order

    def clear(self) -> None:
        self.ids = []

    def crop(self, length: int) -> None:
        del self.ids[length:]

    def prefill(self, ids) -> int:
        self.crop(0)
        self.ids = list(ids)
        return 0

    def decode(self, tokens, outputs, timed=False, pad=None):
        padded = bool(pad) and len(tokens) == 1
        width = 2 if padded else len(tokens)
        base = len(self.ids)
        rows = np.stack(
            [np.sin(np.arange(VOCAB, dtype=np.float32) * (t + 1) + base + i) for i, t in enumerate(tokens)]
        )
        if self.off(width, padded):
            rows = np.nextafter(rows, np.inf)
        self.ids.extend(tokens)
        self.widths.append(width)
        return rows[-outputs:] if outputs else None


def encode(text: str) -> list[int]:
    return [ord(c) % VOCAB for c in text]


def test_every_width_the_loop_sends_is_proven_where_every_kernel_agrees() -> None:
    model = KernelModel()
    verdict = probe_widths(model, encode, max_context=4096)
    assert verdict == ProbeVerdict(pad=False, widest=PROBE_MAX_WIDTH, checked=PROBE_MAX_WIDTH)
    assert PROBE_MAX_WIDTH == LONG_DRAFT_MAX + 1  # the widest pass: the last token plus a long-match draft
    # every width from 2 to the widest was really decoded, at each of the two positions
    assert all(model.widths.count(w) >= 2 for w in range(2, PROBE_MAX_WIDTH + 1))
    assert verdict.cap_note() is None and verdict.max_drafts == LONG_DRAFT_MAX
    assert model.ids == []  # the probe leaves an empty cache behind


@pytest.mark.parametrize("first_off", [5, 7, 8, 10, 17, 33, 49])
def test_drafts_are_capped_below_the_first_width_that_rounds_otherwise(first_off: int) -> None:
    # ggml switches kernels at batch sizes the old probe (2, 3, 4, 6, 9) never looked at: 8 rows (tiled
    # K-quant matmul), an even batch (ARM i8mm)...
    verdict = probe_widths(KernelModel(lambda w, padded: w >= first_off), encode, max_context=4096)
    assert verdict.widest == first_off - 1 and verdict.first_mismatch == first_off and not verdict.pad
    assert verdict.max_drafts == first_off - 2
    assert verdict.cap_note() == (
        f"drafts capped at {first_off - 2}: width {first_off} rounds differently on this build"
    )


def test_a_width_that_differs_alone_caps_below_it_even_if_wider_ones_agree() -> None:
    verdict = probe_widths(KernelModel(lambda w, padded: w == 12), encode, max_context=4096)
    assert verdict.widest == 11


def test_padded_plain_steps_are_the_reference_where_one_token_decodes_differ() -> None:
    # One-token decodes round otherwise; a padded step (2 rows) agrees with every wider pass: all proven.
    verdict = probe_widths(KernelModel(lambda w, padded: w == 1), encode, max_context=4096)
    assert verdict.pad and verdict.widest == PROBE_MAX_WIDTH and verdict.cap_note() is None


def test_in_pad_mode_a_wider_pass_that_differs_from_padded_steps_caps_drafts() -> None:
    # ARM's i8mm dot: one kernel for an even batch, another for an odd one. Padded steps (2 rows) agree with
    # even widths only, so drafts stop at 1 (a 2-row pass), not "pad, no cap".
    verdict = probe_widths(KernelModel(lambda w, padded: w % 2 == 1), encode, max_context=4096)
    assert verdict.pad and verdict.widest == 2 and verdict.first_mismatch == 3
    assert verdict.cap_note() == "drafts capped at 1: width 3 rounds differently on this build"


def test_where_even_two_rows_differ_from_padded_steps_nothing_is_proven() -> None:
    # (a padded step computed otherwise than a real 2-row pass: not seen on a real build, but never trusted)
    verdict = probe_widths(KernelModel(lambda w, padded: w == 1 or padded), encode, 4096)
    assert verdict.pad and verdict.widest == 0 and verdict.max_drafts == 0
    assert verdict.cap_note().startswith("drafting off: a pass of 2 tokens rounds differently")


def test_the_long_position_is_probed_where_the_context_has_room() -> None:
    seen: list[int] = []
    model = KernelModel()
    real = model.decode

    def decode(tokens, outputs, timed=False, pad=None):
        seen.append(len(model.ids))
        return real(tokens, outputs, timed, pad)

    model.decode = decode
    late_off = KernelModel(lambda w, padded: w >= 20 and len(late_off.ids) >= LONG_PROBE_POSITION)
    assert probe_widths(late_off, encode, max_context=4096).widest == 19
    assert probe_widths(model, encode, max_context=4096).widest == PROBE_MAX_WIDTH
    assert LONG_PROBE_POSITION in seen
    # a context too short for the long position: the two short ones still judge every width
    assert probe_widths(late_off, encode, max_context=300).widest == PROBE_MAX_WIDTH


def test_a_probe_that_cannot_judge_proves_nothing() -> None:
    verdict = probe_widths(KernelModel(), encode, max_context=40)
    assert verdict.widest == 0 and verdict.max_drafts == 0 and "too small" in verdict.reason
    assert verdict.cap_note().startswith("drafting off: the context (40 tokens) is too small")
    assert probe_widths(KernelModel(), lambda text: [], max_context=4096).widest == 0


def test_a_short_probe_text_is_repeated_not_trusted() -> None:
    # A tokenizer that packs the probe text into few tokens still gets every width and position probed.
    model = KernelModel(lambda w, padded: w >= 30)
    assert probe_widths(model, lambda text: encode(text)[:5], max_context=4096).widest == 29


def test_describe_names_the_verdict_the_widest_width_and_the_cap() -> None:
    full = ProbeVerdict(pad=False, widest=49, checked=49)
    assert full.describe() == (
        "plain steps one-token; widths 2-49 proven exact of 49; drafts up to 48 (every width the loop sends)"
    )
    capped = ProbeVerdict(pad=True, widest=6, checked=49, first_mismatch=7)
    assert capped.describe() == (
        "plain steps padded to 2 rows; widths 2-6 proven exact of 49; "
        "drafts capped at 5: width 7 rounds differently on this build"
    )
