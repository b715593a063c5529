"""A draft model that fell behind catches up in slices: n-gram rounds of a long copy never step it, and the first
round its plan wins must not feed it hundreds of tokens in one pass (llama.cpp refused any decode wider than its
batch of 512: "internal: a decode of N tokens exceeds the batch of 512", and the reply died)."""

from __future__ import annotations

import pytest
import torch

from engine.decoding.drafters.draft_model import CATCH_UP_PASS, draft_greedy
from engine.errors import BackendError

VOCAB = 50


class BatchedModel:
    """A CachedModel whose passes may be at most `batch` tokens wide, as llama.cpp's are; it drafts token + 1."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.ids: list[int] = []
        self.step_times: list[float] = []
        self.widths: list[int] = []
        self.costs = None
        self.can_crop = True

    def _run(self, tokens) -> None:
        if len(tokens) > self.batch:
            raise BackendError(
                f"internal: a decode of {len(tokens)} tokens exceeds the batch of {self.batch}"
            )
        self.widths.append(len(tokens))
        self.ids.extend(tokens)
        self.step_times.append(0.001)

    def prefill(self, ids, cancel=None) -> int:
        reused = 0
        while reused < min(len(ids), len(self.ids)) and ids[reused] == self.ids[reused]:
            reused += 1
        self.crop(reused)
        for start in range(reused, len(ids), self.batch):
            self._run(list(ids[start : start + self.batch]))
        return reused

    def next_logits(self, tokens):
        self._run(list(tokens))
        logits = torch.zeros(VOCAB)
        logits[(tokens[-1] + 1) % VOCAB] = 1.0
        return logits

    def crop(self, length: int) -> None:
        del self.ids[length:]


def test_a_draft_far_behind_catches_up_in_slices_no_wider_than_its_batch() -> None:
    model = BatchedModel(batch=CATCH_UP_PASS)
    seq = [i % VOCAB for i in range(700)]
    model.prefill(seq[:10])
    drafts = draft_greedy(model, seq, 3, VOCAB)
    assert drafts == [(seq[-1] + 1) % VOCAB, (seq[-1] + 2) % VOCAB, (seq[-1] + 3) % VOCAB]
    assert max(model.widths) <= CATCH_UP_PASS
    assert model.ids == seq + drafts[:-1]  # the draft's cache: the sequence and the drafts it was fed
    # the draft steps proper are one token each: the catch-up went in by prefill, not as a draft step
    assert model.widths[-3:] == [1, 1, 1]


def test_a_draft_a_few_tokens_behind_takes_them_with_its_first_step() -> None:
    # The usual round after a fully accepted one: the last draft and the target's own token, in one pass.
    model = BatchedModel(batch=CATCH_UP_PASS)
    seq = [i % VOCAB for i in range(300)]
    model.prefill(seq[:-2])
    before = len(model.widths)
    draft_greedy(model, seq, 2, VOCAB)
    assert model.widths[before:] == [2, 1]


@pytest.mark.slow
def test_on_llama_cpp_a_draft_600_tokens_behind_drafts_instead_of_failing() -> None:
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf

    backend = LlamaCppBackend(
        ensure_embedded_gguf(), draft=str(ensure_embedded_gguf(precision="q4_1")), max_context=2048
    )
    backend.load()
    try:
        draft = backend.draft_state
        text = " ".join(f"line {i}: keep copying this text." for i in range(120))
        seq = backend.encode_text(text)
        assert len(seq) > draft.n_batch + 100
        draft.prefill(seq[:20])
        drafts = draft_greedy(draft, seq, 3, backend.target.n_vocab)
        assert len(drafts) == 3 and draft.ids[: len(seq)] == seq
    finally:
        backend.close()
