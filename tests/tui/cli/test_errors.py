"""Bad input ends with one clear line on stderr and exit code 2 — never a traceback."""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.cli import assert_one_line_error
from tests.support.cli import run_cli_isolated as run_cli


def test_missing_model_folder(tmp_path):
    proc = run_cli(["generate", "--model", str(tmp_path / "nope"), "--prompt", "hi"], tmp_path)
    assert_one_line_error(proc, "model folder not found", "nope")


def test_k_out_of_range(tmp_path):
    proc = run_cli(["generate", "--prompt", "hi", "--k", "17"], tmp_path)
    assert_one_line_error(proc, "--k", "0 and 16", "17")


def test_negative_temperature(tmp_path):
    proc = run_cli(["generate", "--prompt", "hi", "--temperature", "-0.5"], tmp_path)
    assert_one_line_error(proc, "--temperature", ">= 0")


def test_empty_prompt(tmp_path):
    proc = run_cli(["generate", "--prompt", "   "], tmp_path)
    assert_one_line_error(proc, "empty prompt")


def test_prompt_file_with_bad_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": \n', encoding="utf-8")
    proc = run_cli(["generate", "--prompt-file", str(path)], tmp_path)
    assert_one_line_error(proc, "prompts.jsonl:2", "not valid JSON")


def test_prompt_file_without_prompt_field(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "no prompt key"}\n', encoding="utf-8")
    proc = run_cli(["generate", "--prompt-file", str(path)], tmp_path)
    assert_one_line_error(proc, "prompts.jsonl:1", "'prompt'")


@pytest.mark.parametrize(
    ("content", "said"),
    [('{"prompt": "no category"}\n', "category of code, qa or creative"), ('{"prompt": 3}\n', "'prompt'")],
)
def test_bench_prompt_file_without_category_is_one_line(tmp_path, content, said):
    # Checked before any model loads: it used to be a KeyError traceback minutes into the run.
    path = tmp_path / "bench.jsonl"
    path.write_text(content, encoding="utf-8")
    proc = run_cli(["bench", "--quick", "--prompts", str(path)], tmp_path)
    assert_one_line_error(proc, "bench.jsonl:1", said)


def test_missing_draft_folder(tmp_path):
    proc = run_cli(["generate", "--prompt", "hi", "--draft", str(tmp_path / "draft")], tmp_path)
    assert_one_line_error(proc, "draft", "not found")


def test_broken_config_file_names_the_file(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("cache_mode = \n", encoding="utf-8")
    proc = run_cli(["generate", "--prompt", "hi"], tmp_path, env={"SPECCHAT_CONFIG_FILE": str(config)})
    assert_one_line_error(proc, "bad.toml")


def test_bad_config_value_names_file_and_field(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('cache_mode = "q3"\n', encoding="utf-8")
    proc = run_cli(["presets"], tmp_path, env={"SPECCHAT_CONFIG_FILE": str(config)})
    assert_one_line_error(proc, "config.toml", "cache_mode")


def test_broken_preset_file_is_skipped_with_one_line_naming_file_and_field(tmp_path):
    presets = tmp_path / "config" / "specchat" / "presets"
    presets.mkdir(parents=True)
    (presets / "fast.toml").write_text("k = 40\n", encoding="utf-8")
    proc = run_cli(["presets"], tmp_path)
    # One bad file does not stop the listing: the others are listed, the bad one named on stderr.
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["code", "qa", "creative"]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fast.toml" in lines[0] and "k: must be between 0 and 16 (got 40)" in lines[0]


def test_unknown_preset(tmp_path, smol_dir):
    proc = run_cli(["generate", "--model", str(smol_dir), "--prompt", "hi", "--preset", "nope"], tmp_path)
    assert_one_line_error(proc, "unknown preset", "nope")


def test_folder_without_config_or_tokenizer(tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    proc = run_cli(
        ["generate", "--model", str(empty), "--prompt", "hi", "--backend", "transformers"], tmp_path
    )
    assert_one_line_error(proc, "config.json")


def test_exllamav2_backend_unusable_here(tmp_path, smol_dir):
    proc = run_cli(
        ["generate", "--model", str(smol_dir), "--prompt", "hi", "--backend", "exllamav2"], tmp_path
    )
    assert_one_line_error(proc, "exllamav2")


def test_usage_error_is_one_line(tmp_path):
    proc = run_cli(["generate", "--k", "many"], tmp_path)
    assert_one_line_error(proc, "--k")


@pytest.mark.slow
def test_generate_json_end_to_end(tmp_path, smol_dir):
    import orjson

    path = tmp_path / "prompts.jsonl"
    path.write_text(
        '{"prompt": "What is the capital of France?", "id": 1}\n{"prompt": "Name a primary colour."}\n',
        encoding="utf-8",
    )
    proc = run_cli(
        [
            "generate",
            "--model",
            str(smol_dir),
            "--prompt-file",
            str(path),
            "--json",
            "--max-new-tokens",
            "24",
            "--temperature",
            "0",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "auto: exllamav2 unusable" in proc.stderr
    # The embedded model runs from its GGUF on llama.cpp where the bindings are installed.
    engine = "llama.cpp" if importlib.util.find_spec("llama_cpp") else "transformers"
    assert f"-> {engine}" in proc.stderr
    records = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 2
    first = records[0]
    # Both backends run the same weights (llama.cpp the F16 GGUF made from them) and answer alike.
    assert "Paris" in first["text"]
    assert first["model"] == str(smol_dir)
    assert first["prompt_token_ids"] and first["token_ids"]
    stats = first["stats"]
    for key in [
        "prompt_tokens",
        "new_tokens",
        "drafted_tokens",
        "accepted_tokens",
        "rounds",
        "acceptance_rate",
        "mean_accepted_length",
        "per_position_acceptance",
        "acceptance_histogram",
        "alpha",
        "predicted_speedup",
        "ttft_s",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "total_s",
        "preset",
        "num_draft_tokens",
        "temperature",
        "draft_mode",
        "backend",
        "model",
        "stop_reason",
    ]:
        assert key in stats, key
    assert stats["new_tokens"] == len(first["token_ids"])
    assert stats["prompt_tokens"] == len(first["prompt_token_ids"])
    assert stats["backend"] == engine
    assert stats["preset"] == "qa"  # auto mode routes a factual question to qa
    assert stats["temperature"] == 0.0  # --temperature overrides the preset: greedy, so the answer is stable
    assert stats["draft_mode"] == "ngram"
    assert stats["accepted_tokens"] <= stats["drafted_tokens"]


def test_help_documents_every_binding_id_and_the_model_flags():
    import re

    from tui.cli.entry import build_parser
    from tui.keymap import KNOWN_IDS

    help_text = build_parser().format_help()
    documented = set(re.findall(r"\[([a-z_]+\.[a-z_]+)\]", help_text))
    assert documented == set(KNOWN_IDS)
    for flag in ("--model", "--draft", "--backend", "--cache-mode", "--preset"):
        assert flag in help_text
