"""Weight and cache types the patched build computes alike in a pass and in one-token steps (scripts/patch_llama_cpp.py):

- float32, bfloat16 and IQ4_NL weights: tinyBLAS took a batch of 2+ rows with another summation order than the
  one-row vec_dot, so the load probe found width 2 rounding otherwise and every plain step was padded;
- quantized caches (q8_0, q4_0) across 256 cache cells: a row took the stock attention kernel while the view held
  <= 256 cells and the fixed chunks above, so a pass that crossed 256 was never compared with plain steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.backends.llamacpp.library import patched_build
from engine.backends.llamacpp.model import LlamaCppModel
from engine.backends.llamacpp.probe import probe_widths
from engine.models import ensure_embedded_gguf
from tests.support.models_2026 import quantized
from tests.support.threads import fixed_threads

pytestmark = [
    pytest.mark.slow,  # real GGUFs (quantized once per machine, then cached)
    pytest.mark.skipif(
        not patched_build(),
        reason="the stock llama.cpp build (the patch did not apply): its kernels round otherwise",
    ),
]


@pytest.fixture(scope="module")
def weights() -> dict[str, Path]:
    f16 = ensure_embedded_gguf()
    return {
        "F32": ensure_embedded_gguf(precision="f32"),
        "BF16": quantized(f16, "BF16"),
        "IQ4_NL": quantized(f16, "IQ4_NL"),
    }


def open_model(path: Path, n_ctx: int, cache_type: int | None = None) -> LlamaCppModel:
    """The model alone (no load-time measuring): the tests look at its kernels."""
    import llama_cpp

    cache = llama_cpp.GGML_TYPE_F16 if cache_type is None else cache_type
    return LlamaCppModel(llama_cpp, path, n_ctx, fixed_threads(), cache, 512, 0, repack=False)


def tokens(model: LlamaCppModel, text: str) -> list[int]:
    return list(model.model.tokenize(text.encode(), add_bos=False, special=False))


def assert_passes_equal_steps(model: LlamaCppModel, ids: list[int], start: int, spans, what: str) -> None:
    """After `start` cached tokens, a pass of each span in `spans` gives the rows one-token steps give."""
    model.prefill(ids[:start])
    singles = [model.decode([ids[start + j]], outputs=1)[0] for j in range(max(spans))]
    for span in spans:
        model.crop(start)
        rows = model.decode(ids[start : start + span], outputs=span)
        same = [np.array_equal(rows[j], singles[j]) for j in range(span)]
        assert all(same), f"{what}, a pass of {span}: rows {same.index(False)}.. differ"


@pytest.mark.parametrize("kind", ["F32", "BF16", "IQ4_NL"])
def test_every_width_is_proven_without_padded_steps(weights: dict[str, Path], kind: str) -> None:
    from engine.backends.llamacpp.native import gguf_tensor_types

    path = weights[kind]
    code = {"F32": 0, "BF16": 30, "IQ4_NL": 20}[kind]  # ggml_type codes
    assert code in gguf_tensor_types(path)  # the file really holds such weights
    # A short context: the probe's first start alone (the weights' kernels do not depend on the cache's length)
    model = open_model(path, 120)
    try:
        verdict = probe_widths(model, lambda text: tokens(model, text), 120)
        assert not verdict.pad and verdict.widest == verdict.checked, verdict.describe()
    finally:
        model.close()


@pytest.mark.parametrize("cache", ["Q8_0", "Q4_0", "F16"])
def test_a_pass_across_256_cache_cells_equals_plain_steps(cache: str) -> None:
    import llama_cpp

    model = open_model(ensure_embedded_gguf(precision="q4_1"), 512, getattr(llama_cpp, f"GGML_TYPE_{cache}"))
    try:
        ids = (tokens(model, "The quick brown fox jumps over the lazy dog. 1, 2, 3. ") * 40)[:300]
        # rows at 236..275: views of <= 256 cells and above
        assert_passes_equal_steps(model, ids, 236, (2, 20, 21, 30, 40), f"{cache} cache")
    finally:
        model.close()


def test_attention_sinks_over_a_float16_cache_take_the_chunks_at_every_width() -> None:
    """gpt-oss's attention sinks over a float16 cache: stock llama.cpp sends a pass of 64 rows and more over a
    view of <= 256 cells to its tiled attention kernel (ggml-cpu/ops.cpp), which sums otherwise than the one-row
    path; the patch keeps every row of a pass in its fixed 256-cell chunks, so the rows equal plain steps."""
    from engine.models import ensure_embedded_model
    from tests.support.models_2026 import gguf_2026

    model = open_model(gguf_2026("gptoss", ensure_embedded_model()), 256)
    try:
        ids = (tokens(model, "The quick brown fox jumps over the lazy dog. 1, 2, 3. ") * 20)[:200]
        # up to 64 rows: specchat_exact_rows(), the widest pass the patch keeps exact
        assert_passes_equal_steps(model, ids, 8, (2, 49, 64), "attention sinks")
    finally:
        model.close()
