"""The embedded model's default GGUF for llama.cpp: the Hugging Face folder's very weights, at F16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_the_f16_gguf_holds_the_folders_weights_bit_for_bit(smol_dir: Path) -> None:
    import gguf
    from safetensors.numpy import load_file

    from engine.models import embedded_gguf_path, ensure_embedded_gguf

    path = ensure_embedded_gguf()
    assert path == embedded_gguf_path("f16") and path != embedded_gguf_path("q4_1")
    assert embedded_gguf_path("q4_1").is_file()  # the wheel's own file stays available
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    folder = load_file(str(smol_dir / "model.safetensors"))
    # Matrices as F16, vectors (norms) as F32; q/k are permuted for llama.cpp's rope, so compare others.
    pairs = {
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
        "blk.3.attn_v.weight": "model.layers.3.self_attn.v_proj.weight",
        "output_norm.weight": "model.norm.weight",
        "blk.5.attn_norm.weight": "model.layers.5.input_layernorm.weight",
    }
    for ours, theirs in pairs.items():
        tensor = tensors[ours]
        expected = folder[theirs]
        kind = gguf.GGMLQuantizationType.F16 if expected.ndim == 2 else gguf.GGMLQuantizationType.F32
        assert tensor.tensor_type == kind, ours
        values = np.asarray(tensor.data).reshape(expected.shape)
        assert np.array_equal(values.astype(np.float32), expected.astype(np.float32)), ours
    field = reader.get_field(gguf.Keys.General.FILE_TYPE)
    assert field.contents() == int(gguf.LlamaFileType.MOSTLY_F16)


def test_llama_cpp_answers_as_the_models_own_fp32_reference(smol_dir: Path) -> None:
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.backends.transformers import TransformersBackend
    from engine.benchmarks.answers import _greedy, _reference
    from engine.models import ensure_embedded_gguf

    hf = TransformersBackend(smol_dir, draft="none")
    hf.load()
    reference = _reference(smol_dir, hf)
    lcpp = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram")
    lcpp.load()
    try:
        for question in ("What is the capital of France?", "Who wrote Romeo and Juliet?"):
            messages = [{"role": "user", "content": question}]
            expected = reference(messages)
            assert _greedy(lcpp, messages, 0) == expected
            assert _greedy(lcpp, messages, 5) == expected
        assert "Paris" in lcpp.decode(
            _greedy(lcpp, [{"role": "user", "content": "What is the capital of France?"}], 0)
        )
    finally:
        lcpp.close()
        hf.close()
