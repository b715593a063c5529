"""The decoding bench runs all four variants side by side and reports ratios from that one run."""

from __future__ import annotations

import io

import pytest

from engine.benchmarks.bench import VARIANTS, run_bench
from engine.benchmarks.runner import load_prompt_set
from engine.config import Settings


@pytest.mark.parametrize("name", ["public", "heldout"])
def test_prompt_sets_cover_every_category(name: str):
    prompts = load_prompt_set(name)
    assert len(prompts) >= 12
    categories = [p["category"] for p in prompts]
    assert {c: categories.count(c) >= 4 for c in ("code", "qa", "creative")} == {
        "code": True,
        "qa": True,
        "creative": True,
    }


def test_the_held_out_split_shares_no_prompt_with_the_public_one():
    public = {p["prompt"] for p in load_prompt_set("public")}
    assert not public & {p["prompt"] for p in load_prompt_set("heldout")}


@pytest.mark.slow
def test_bench_on_a_tiny_model_prints_the_table_and_ratios(tiny_model_dir):
    out = io.StringIO()
    prompts = [
        {"category": "code", "prompt": "def add(a, b): return a + b. def add(a, b): return"},
        {"category": "creative", "prompt": "la la la la la la la la"},
    ]
    summary = run_bench(
        Settings(model=tiny_model_dir),
        quick=True,
        out=out,
        prompts=prompts,
        max_new_tokens=24,
        cache_context=256,
    )
    text = out.getvalue()
    assert set(summary["tokens_per_s"]) == set(VARIANTS)
    assert "cache fp32" in text  # the default cache on this backend: full precision, named as stored
    assert summary["sampled_identical_count"] == 2  # the presets' samplers, with and without drafting
    speed = summary["cache_speed"]
    assert speed["q8_vs_full"] == pytest.approx(speed["q8"] / speed["full"])
    assert "decode at 256 tokens of context" in text
    assert all(v > 0 for v in summary["tokens_per_s"].values())
    # at temperature 0 our loop (with and without drafting) and transformers' generate agree token for token
    assert summary["all_identical"] is True
    assert len(summary["prompts"]) == 2
    for label in (
        "n-gram vs plain, whole set",
        "n-gram vs transformers prompt lookup",
        "plain vs transformers plain",
    ):
        assert label in text
    kv = summary["kv_cache_bytes"]
    assert kv["fp32"] == 2 * kv["fp16"] > kv["fp16"] > kv["q8"] > 0
    assert "KV cache at 1024 tokens" in text
    # adaptive K beside fixed K 2, 5, 8 and the presets' K, from the same run
    assert set(summary["adaptive_vs_fixed_total"]) == {"fixed-2", "fixed-5", "fixed-8", "fixed-preset"}
    best = summary["best_fixed_k"]
    assert summary["adaptive_vs_best_fixed_total"] == pytest.approx(
        summary["tokens_per_s"]["ours-ngram"] / summary["tokens_per_s"][f"fixed-{best}"]
    )
    assert summary["tokens_per_s"][f"fixed-{best}"] == max(
        summary["tokens_per_s"][f"fixed-{k}"] for k in (2, 5, 8)
    )
    assert f"adaptive K vs best fixed K ({best})" in text and "adaptive K vs the presets' fixed K" in text
    assert summary["ngram_vs_plain_total"] == pytest.approx(
        summary["tokens_per_s"]["ours-ngram"] / summary["tokens_per_s"]["ours-plain"]
    )


@pytest.mark.slow
def test_answer_check_compares_each_backend_with_the_fp32_reference(tiny_model_dir, monkeypatch):
    import engine.benchmarks.answers as answers

    monkeypatch.setattr(answers, "MAX_NEW", 12)
    prompts = [{"category": "qa", "prompt": "Name a colour."}]
    out = io.StringIO()
    summary = answers.run_answer_check(Settings(model=tiny_model_dir), prompts, out)
    text = out.getvalue()
    assert "the reference is transformers' generate() at fp32" in text
    facts = len(answers.FACTUAL_QUESTIONS)
    # Our transformers backend gives the model's own greedy tokens, plain and drafting; a random model is
    # never right, and a GGUF of it does not exist (no llama.cpp rows).
    for row in ("transformers plain", "transformers ngram"):
        assert summary[row]["heldout_identical"] == 1 and summary[row]["factual_identical"] == facts
        assert summary[row]["factual_correct"] == 0
    assert not any(name.startswith("llama.cpp") for name in summary)

    # A backend whose text drifts from the reference is counted as such.
    real = answers._greedy
    monkeypatch.setattr(answers, "_greedy", lambda backend, messages, k: real(backend, messages, k)[:-1])
    drifted = answers.run_answer_check(Settings(model=tiny_model_dir), prompts, io.StringIO())
    assert drifted["transformers plain"]["heldout_identical"] == 0
