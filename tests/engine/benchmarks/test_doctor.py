"""`specchat doctor`: every check listed, the failing rule named, exit codes 0 / 1 / 2, and the baseline rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engine.benchmarks.doctor import CHECK_NAMES, compare_baseline
from engine.benchmarks.ladder import default_ladder, ladder_verdict
from tests.support.cli import run_cli


def checks_of(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    report = json.loads(proc.stdout)
    return {c["name"]: c for c in report["checks"]}


# --- the rules, with exact numbers ---------------------------------------------------------------------------


def test_baseline_rule_fails_at_8_points_or_15_percent_and_not_below():
    before = {"timestamp": 0, "acceptance": 0.70, "drafted": 100, "tokens_per_s": 100.0}
    assert compare_baseline(None, before)[0] == "pass"
    assert compare_baseline(before, {"acceptance": 0.63, "drafted": 100, "tokens_per_s": 86.0})[0] == "pass"
    status, reason = compare_baseline(before, {"acceptance": 0.62, "drafted": 100, "tokens_per_s": 100.0})
    assert status == "fail" and "acceptance 70% -> 62% (8 points" in reason
    status, reason = compare_baseline(before, {"acceptance": 0.70, "drafted": 100, "tokens_per_s": 85.0})
    assert status == "fail" and "tok/s 100.0 -> 85.0 (15% slower" in reason
    # too few drafted tokens to judge acceptance on: only speed counts
    assert compare_baseline(before, {"acceptance": 0.10, "drafted": 5, "tokens_per_s": 100.0})[0] == "pass"


def test_ladder_rule_allows_5_points_and_fails_beyond():
    def rung(context: int, acceptance: float | None, drafted: int = 50) -> dict:
        return {"context": context, "acceptance": acceptance, "drafted": drafted}

    assert ladder_verdict([rung(512, 0.70), rung(2048, 0.65), rung(4096, 0.80)])[0] == "pass"
    status, reason = ladder_verdict([rung(512, 0.70, 3000), rung(2048, 0.66, 3000), rung(4096, 0.64, 3000)])
    assert status == "fail" and "falls 6 points from 512 to 4096" in reason and "noise, 2)" in reason
    # A drop beyond 5 points on a few dozen drafts is within the noise: a warning, not a verdict (the embedded
    # model's n-gram ladder: 9/30 drafts accepted at 512 tokens, 3/24 at 3,984).
    status, reason = ladder_verdict([rung(512, 0.30, 30), rung(2048, 0.33, 30), rung(3984, 0.125, 24)])
    assert (
        status == "warn"
        and "18 points lower at 3984" in reason
        and "noise of so few drafts (22 points)" in reason
    )
    # The ladder as it is now (the same message to repeat at every rung), measured: 52/96, 52/96, 68/145.
    status, reason = ladder_verdict(
        [rung(512, 52 / 96, 96), rung(2048, 52 / 96, 96), rung(3984, 68 / 145, 145)]
    )
    assert status == "warn" and "7 points lower at 3984" in reason and "(13 points)" in reason
    # ... and the same rates on many drafts are a real fall.
    assert ladder_verdict([rung(512, 0.30, 400), rung(3984, 0.12, 400)])[0] == "fail"
    assert ladder_verdict([rung(512, 0.70), rung(2048, 0.10, drafted=3)])[0] == "warn"
    assert ladder_verdict([rung(512, 0.70)])[0] == "pass"


def test_default_ladder_climbs_to_max_context():
    assert default_ladder(4096) == [512, 2048, 4096]
    assert default_ladder(8192) == [512, 2048, 4096, 8192]
    assert default_ladder(3000) == [512, 2048, 3000]


# --- the command ---------------------------------------------------------------------------------------------


def test_missing_model_cannot_run_exit_2(tmp_path):
    proc = run_cli(["doctor", "--model", str(tmp_path / "nope")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model folder not found" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_doctor_json_on_the_embedded_model_lists_every_check_and_exits_0():
    proc = run_cli(["doctor", "--json", "--max-new-tokens", "8", "--ladder", "256,512"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = checks_of(proc)
    assert list(checks) == list(CHECK_NAMES)
    assert all(c["status"] in ("pass", "warn") and c["reason"] for c in checks.values()), checks
    assert [r["context"] for r in checks["context_ladder"]["details"]["rungs"]] == [256, 512]
    assert set(checks["memory"]["details"]["tiers"]) == {"24 GB", "16 GB", "12 GB", "8 GB"}
    base = checks["baseline"]["details"]
    assert base["tokens"] > 0 and base["tokens_per_s"] > 0 and base["ttft_s"] > 0
    assert set(checks["tasks"]["details"]["tasks"]) == {"code", "qa", "creative"}
    assert checks["restart"]["details"]["same_text"] is True
    report = json.loads(proc.stdout)
    assert report["baseline_saved"] and Path(report["baseline_file"]).is_file()


@pytest.mark.slow
def test_incompatible_draft_fails_naming_the_rule(tiny_model_dir, tiny_model_dir_other_vocab):
    proc = run_cli(
        ["doctor", "--json", "--backend", "transformers", "--model", str(tiny_model_dir)]
        + ["--draft", str(tiny_model_dir_other_vocab)]
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = checks_of(proc)
    compat = checks["compatibility"]
    assert compat["status"] == "fail" and "vocabulary size differs" in compat["reason"]
    details = compat["details"]
    sizes = details["vocab_sizes"]
    assert sizes["draft"]["embedding"] == 512 and sizes["draft"]["tokenizer"] < sizes["target"]["tokenizer"]
    assert (
        f"({sizes['draft']['tokenizer']} tokens vs the target's {sizes['target']['tokenizer']})"
        in compat["reason"]
    )
    assert details["differing_token_strings"] > 0 and details["same_tokenizer_file"] is False
    assert checks["load"]["status"] == "skip"
    assert list(checks) == list(CHECK_NAMES)


@pytest.mark.slow
def test_a_planted_baseline_10_points_higher_fails(tiny_model_dir, copy_model_dir):
    args = ["doctor", "--json", "--backend", "transformers", "--model", str(tiny_model_dir)]
    args += ["--draft", str(copy_model_dir), "--max-new-tokens", "8", "--ladder", "128"]
    first = run_cli(args)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    path = Path(report["baseline_file"])
    history = json.loads(path.read_text())
    assert len(history) == 1 and history[0]["drafted"] >= 20
    history[0]["acceptance"] += 0.10  # the earlier run accepted 10 points more ...
    history[0]["tokens_per_s"] *= 0.5  # ... and was slower, so only the acceptance rule can fire
    path.write_text(json.dumps(history))
    second = run_cli(args)
    assert second.returncode == 1, second.stdout + second.stderr
    checks = checks_of(second)
    failed = [name for name, c in checks.items() if c["status"] == "fail"]
    assert failed == ["regression"]
    assert "(10 points, rule: a drop of 8+ points fails)" in checks["regression"]["reason"]
    assert len(json.loads(path.read_text())) == 1  # a failed run is not saved as the new baseline


@pytest.mark.slow
def test_weights_newly_initialised_while_loading_fail_the_load_check(tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(tiny_model_dir, tmp_path / "missing-weight")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    proc = run_cli(
        ["doctor", "--json", "--backend", "transformers", "--model", str(folder), "--draft", "none"]
        + ["--max-new-tokens", "4", "--ladder", "128", "--no-save"]
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    load = checks_of(proc)["load"]
    assert load["status"] == "fail"
    assert "newly initialized (random): model.layers.1.mlp.down_proj.weight" in load["reason"]
    assert load["details"]["warnings"]


def test_every_ladder_rung_asks_for_the_same_copy_at_its_length():
    from transformers import AutoTokenizer

    from engine.benchmarks.ladder import LADDER_MESSAGE, ladder_prompt
    from engine.models import ensure_embedded_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())

    class Chat:  # the part of a backend ladder_prompt uses, with the embedded model's own template
        def encode_chat(self, messages):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return tokenizer.encode(text, add_special_tokens=False)

    tails = set()
    for length in (200, 512, 2048, 3984):
        ids = ladder_prompt(Chat(), length)
        assert length - 40 <= len(ids) <= length, (length, len(ids))
        text = tokenizer.decode(ids)
        assert text.count(LADDER_MESSAGE) == 1 and text.count("Note ") > (length - 150) // 30
        tails.add(text[text.index("Here is the message") :])
    assert len(tails) == 1  # the same request and message at every rung
