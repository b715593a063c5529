"""The draft model's cost c, measured as it runs beside the target, and where a draft model can pay at all.

c is a one-token draft step over a plain target step (DESIGN: "c = draft step time / target step time"). A draft
model's first call in a round also feeds it the tokens it missed (rounds that did not draft, the last accepted
draft): a wider pass, which counted as a "step" made c read 1.1-1.2 for Qwen2.5-Coder 0.5B beside the 1.5B,
whose one-token steps cost 0.51 of the target's. The costs here are counted by pass width, not timed.

Mutations tried (each turned the named test red, then was reverted):
- `draft_greedy` appending every draft pass to the step times: `test_c_counts_one_token_draft_steps_only`.
- `drafting_can_pay` with every draft accepted again (no PROBE_ACCEPTANCE):
  `test_no_probe_for_a_half_as_fast_draft_on_a_compute_bound_cpu`.
- no n-gram lookup beside the draft model (`combined` never built):
  `test_beside_a_draft_that_cannot_pay_ngram_lookup_still_drafts_exactly`.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.backends.transformers import TransformersBackend
from engine.decoding.adaptive_k import AdaptiveK, drafting_can_pay
from engine.decoding.cost_model import VerifyCostModel
from engine.events import Done
from engine.request import GenerationRequest, SamplerSettings

# Qwen2.5-Coder-1.5B Q4_K_M on 2 cores (llama.cpp, measured alone): r(1 + k) for k = 0..8, and the 0.5B's step.
PAIR_CURVE_2_CORES = {1: 1.0, 2: 1.58, 3: 1.91, 4: 2.26, 5: 2.5, 6: 2.72, 7: 2.93, 8: 3.13, 9: 3.33}
PAIR_C_2_CORES = 0.51


def test_no_probe_for_a_half_as_fast_draft_on_a_compute_bound_cpu():
    costs = VerifyCostModel.from_ratios(PAIR_CURVE_2_CORES, draft_ratio=PAIR_C_2_CORES)
    # Only a draft that is never wrong could pay here (4 tokens for 2.26 + 3 x 0.51 steps: 1.06x), so probes,
    # which also make the draft catch up on what it skipped, are pure loss.
    assert not drafting_can_pay(costs, 8)
    tuner = AdaptiveK(prior=(0.7,) * 8)
    assert [tuner.choose(8, costs) for _ in range(64)] == [0] * 64
    assert tuner.probes == 0
    # The same draft on a memory-bound machine (a pass of 1 + k costs about one pass) does pay, and is probed.
    flat = VerifyCostModel.from_ratios({w: 1.0 + 0.03 * (w - 1) for w in range(1, 10)}, PAIR_C_2_CORES / 4)
    assert drafting_can_pay(flat, 8)
    assert AdaptiveK(prior=(0.7,) * 8).choose(8, flat) > 0


@pytest.fixture(scope="module")
def self_draft(tiny_model_dir: Path):
    backend = TransformersBackend(
        tiny_model_dir, draft=str(tiny_model_dir), cache_mode="fp16", draft_cache_mode="fp16"
    )
    backend.load()
    yield backend
    backend.close()


@pytest.mark.slow
def test_c_counts_one_token_draft_steps_only(self_draft: TransformersBackend):
    """The target drafting for itself accepts every draft, so each round's first draft call feeds two tokens
    (the last draft and the target's own): those passes are not draft steps."""
    draft = self_draft.draft_state
    widths: list[int] = []
    original = draft.forward

    def forward(ids, keep, timed=False):
        if timed:
            widths.append(len(ids))
        return original(ids, keep, timed)

    draft.forward = forward
    try:
        request = GenerationRequest(
            prompt_ids=(1, 9690, 198, 5248, 314, 253, 1493, 30, 2, 198, 1, 520, 9531, 198),
            sampler=SamplerSettings(temperature=0.0),
            max_new_tokens=32,
            num_draft_tokens=4,
            seed=1,
            k_mode="fixed",
        )
        done = list(self_draft.generate(request, threading.Event()))[-1]
    finally:
        draft.forward = original
    assert isinstance(done, Done)
    assert 1 in widths and 2 in widths  # both kinds of pass happened
    times = draft.step_times
    assert len(times) == len(widths)
    one_token = [t for t, w in zip(times, widths, strict=True) if w == 1]
    assert done.draft_step_s == pytest.approx(sum(one_token) / len(one_token))
    assert done.verify_cost == () or len(done.verify_cost) == 4


# --- the doctor's line and the prediction for other machines (pure) --------------------------------------


def test_the_doctor_says_in_one_line_whether_the_draft_can_pay():
    from engine.benchmarks.draft_prediction import draft_pays_verdict

    here = VerifyCostModel.from_ratios(PAIR_CURVE_2_CORES, draft_ratio=PAIR_C_2_CORES)
    status, line = draft_pays_verdict(here, "model", 8)
    assert status == "warn" and line.startswith("no: ") and "\n" not in line
    assert "r(2) 1.58" in line and "c 0.51" in line
    # the free drafters asked beside the draft model still draft where they pay, and the line says what they give
    assert "n-gram and history drafts take no draft steps (K 8 gives 1.84x)" in line
    # The same target with a draft a tenth as costly pays.
    cheap = VerifyCostModel.from_ratios(PAIR_CURVE_2_CORES, draft_ratio=0.05)
    status, line = draft_pays_verdict(cheap, "model", 8)
    assert status == "pass" and line.startswith("yes: ")
    # n-gram drafts cost no draft steps: on this curve they can pay.
    assert draft_pays_verdict(here, "ngram", 8)[0] == "pass"
    assert draft_pays_verdict(None, "model", 8)[0] == "skip"


def test_the_prediction_prices_rounds_by_the_pass_cost_model():
    from engine.benchmarks.draft_prediction import (
        GPU_24GB,
        QWEN_0_5B,
        QWEN_1_5B,
        QWEN_7B,
        Machine,
        best_draft_k,
        draft_speedup,
        fit_machine,
        pass_seconds,
        predict,
        repriced_speedup,
    )

    # A machine of round numbers: 10 GB/s, 2 cores x 50 GFLOP/s, 1 ms per layer.
    toy = Machine("toy", 10.0, 2, 50.0, 1e-3)
    model = QWEN_1_5B
    expected = 28e-3 + model.weight_bytes / 10e9 + 3 * 2 * model.params / 100e9
    assert pass_seconds(toy, model, 3) == pytest.approx(expected)
    # The fit recovers a machine from its own curve.
    curve = {w: pass_seconds(toy, model, w) / pass_seconds(toy, model, 1) for w in (1, 2, 5, 9)}
    fitted = fit_machine("fit", model, pass_seconds(toy, model, 1), curve, 2)
    assert fitted.gflops_per_core == pytest.approx(50.0)
    # (no per-layer term in the fit: the fixed part all goes to the weights' read)
    assert fitted.bandwidth_gbs == pytest.approx(
        model.weight_bytes / (28e-3 + model.weight_bytes / 10e9) / 1e9
    )
    # E(k) / (r(1 + k) + k c), exactly.
    per_position = [0.8, 0.6, 0.4]
    flat = [1.0, 1.1, 1.2, 1.3]
    assert draft_speedup(per_position, flat, 0.2, 2) == pytest.approx(2.4 / 1.6)
    assert best_draft_k(per_position, flat, 0.2) == (2, pytest.approx(1.5))
    assert best_draft_k(per_position, flat, 1.0) == (0, 1.0)  # a draft as slow as the target never pays
    # n-gram rounds re-priced: 3 + 1 + 5 tokens for r(3) + r(1) + r(5) (past the curve: its last slope).
    assert repriced_speedup([(2, 2), (0, 0), (4, 4)], flat) == pytest.approx(9 / (1.2 + 1.0 + 1.4))
    # The pair on a 24 GB GPU: per-layer launches dominate both models (c near 0.7), so the 0.5B barely pays
    # for the 1.5B, and pays well for a 7B of the same family.
    small = predict(GPU_24GB, QWEN_1_5B, QWEN_0_5B, [0.75, 0.58, 0.45, 0.36])
    big = predict(GPU_24GB, QWEN_7B, QWEN_0_5B, [0.75, 0.58, 0.45, 0.36])
    assert 0.6 < small.c < 0.8 and small.draft_speedup < 1.1
    assert big.c < 0.35 and big.draft_speedup > 1.3 and big.verdict().startswith("draft model K=")


@pytest.mark.slow
def test_beside_a_draft_that_cannot_pay_ngram_lookup_still_drafts_exactly(long_copy_dir: Path):
    """The copy model drafting for itself at the cost of a target step (c = 1: never pays) on a repeating
    cycle: adaptive K leaves the draft model off, and n-gram lookup beside it drafts the cycle, output unchanged."""
    from tests.support.draft_pairs import CPU_CURVE, LONG_CYCLE, pair, reply, request, tokens

    prompt = [*LONG_CYCLE, *LONG_CYCLE[:5]]
    backend = pair(long_copy_dir, long_copy_dir, CPU_CURVE, 1.0)
    try:
        plain, _ = reply(backend, request(prompt, 0, 48, mode="fixed"))
        chunks, done = reply(backend, request(prompt, 6, 48))
        assert tokens(chunks) == tokens(plain)
        assert sum(c.drafted for c in chunks) > 0 and sum(c.accepted for c in chunks) > 0
        assert done.draft_step_s == 0.0  # no draft-model step ran: every draft came from the lookup
    finally:
        backend.close()


# --- the kernel probe: verify passes only as wide as one-token kernels reach ------------------------------


@pytest.mark.slow
def test_drafts_stay_within_the_widest_pass_that_computes_rows_as_one_token_does(monkeypatch):
    """Q4_K weights that llama.cpp does not repack run ggml's tiled kernel from 8 rows (the Qwen pair: passes of 7+
    tokens differ). Stood in for on the embedded F16 GGUF by nudging the logits of every pass of 4+ rows, planted
    before load(): the probe load() runs finds 3, plain steps stay single-token, drafts stop at 2 per round, and
    the backend and the reply both say why."""
    import numpy as np

    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend, LlamaCppModel, patched_build
    from engine.models import ensure_embedded_gguf

    if not patched_build():
        pytest.skip("stock llama.cpp build: its F16 one-token and batched kernels differ from 2 rows on")
    real_decode = LlamaCppModel.decode

    def gemm_from_four(self, tokens, outputs, timed=False, pad=None):
        logits = real_decode(self, tokens, outputs, timed, pad)
        if len(tokens) >= 4 and logits is not None:
            logits[:, 100] = np.nextafter(logits[:, 100], np.inf)
        return logits

    monkeypatch.setattr(LlamaCppModel, "decode", gemm_from_four)
    # 256 cells hold the reply; a planted kernel's pass timings are taken afresh at every load (neither kept nor
    # read), and this context leaves out the long-context ones (10 of 16 s on one core).
    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", cache_mode="fp16", max_context=256)
    backend.load()
    try:
        assert backend.probe.widest == 3 and backend.probe.first_mismatch == 4 and not backend.pad_plain_steps
        assert backend.max_verify_width == 3
        cap = "drafts capped at 2: width 4 rounds differently on this build"
        assert cap in backend.info.notes
        request = GenerationRequest(
            prompt_ids=tuple(backend.encode_chat([{"role": "user", "content": "Count from 1 to 30."}])),
            sampler=SamplerSettings(temperature=0.0),
            max_new_tokens=40,
            num_draft_tokens=8,
            seed=0,
        )
        events = list(backend.generate(request, threading.Event()))
        assert max(e.drafted for e in events[:-1]) == 2  # K 8 asked, 2 drafted at most
        assert cap in events[-1].notes  # the reply says what shaped it
    finally:
        backend.close()
