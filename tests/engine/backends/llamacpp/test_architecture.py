"""ModelShape's weight counts: every weight and the routed experts' read from a GGUF header (checked against gguf's
own reader), and the parameters a token runs through on a mixture of experts."""

from __future__ import annotations

from pathlib import Path

from engine.backends.llamacpp.architecture import ModelShape, params_text, weight_counts
from engine.backends.llamacpp.native import gguf_tensors
from tests.support.models_2026 import gguf_2026


def test_the_header_reader_counts_what_ggufs_reader_counts(smol_dir: Path) -> None:
    from gguf import GGUFReader

    path = gguf_2026("qwen3moe", smol_dir)
    reader = GGUFReader(str(path))
    expected = {t.name: (int(t.n_elements), int(t.tensor_type)) for t in reader.tensors}
    assert {name: (count, code) for name, count, code in gguf_tensors(path)} == expected
    total, experts = weight_counts(path)
    assert total == sum(count for count, _code in expected.values())
    routed = [name for name in expected if "_exps" in name]
    assert routed and experts == sum(expected[name][0] for name in routed)
    assert 0 < experts < total


def test_a_token_runs_through_the_shared_weights_and_its_share_of_the_experts() -> None:
    shape = ModelShape(
        "qwen3moe", "attention", experts=8, experts_used=2, params=1_000_000, expert_params=800_000
    )
    assert shape.active_params == 400_000  # 200k shared + 2/8 of 800k
    assert "2 active per token; 400.0K of 1.0M parameters active" in shape.describe()
    dense = ModelShape("llama", "attention", params=1_000_000)
    assert dense.active_params == 1_000_000 and ", dense," in dense.describe()
    unread = ModelShape("qwen3moe", "attention", experts=8, experts_used=2)
    assert "(8 experts, 2 active per token)" in unread.describe()
    assert params_text(35_000_000_000) == "35.0B" and params_text(999) == "999"
    assert weight_counts(None) == (0, 0) and weight_counts(Path("/nonexistent.gguf")) == (0, 0)
