"""scripts/gpu_check.py's whole flow, on the exllamav2 stand-in (tests/support/exl2_standin) instead of a GPU.

The numbers mean nothing here; what is checked is the script: the four runs (no drafting, n-gram, the model as its
own draft with Q8 caches, an FP16-cache baseline), the greedy identity checks, the side-by-side JSON and the list
of what it cannot verify. The real run needs CUDA (`scripts/gpu_check.sh --offline BUNDLE`).
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.support import paths

ROOT = paths.ROOT
STANDIN = paths.EXL2_STANDIN


def _forget_exllamav2() -> None:
    for name in list(sys.modules):
        if name == "exllamav2" or name.startswith("exllamav2."):
            del sys.modules[name]


@pytest.fixture
def gpu_check(monkeypatch):
    import torch

    _forget_exllamav2()
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    for name, value in (
        ("is_available", lambda: True),
        ("get_device_name", lambda i=0: "stand-in GPU"),
        ("device_count", lambda: 1),
        ("synchronize", lambda *a: None),
        ("empty_cache", lambda: None),
    ):
        monkeypatch.setattr(torch.cuda, name, value)
    import gpu_check

    yield gpu_check
    _forget_exllamav2()


def test_offline_flow_reports_four_runs_side_by_side(gpu_check, smol_dir, tmp_path, capsys):
    from tokenizers import Tokenizer

    shape = tmp_path / "bundle-model"
    shape.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol_dir / name).is_file():
            shutil.copy(smol_dir / name, shape / name)
    # The "random" model already built (random_model() then keeps it), with a script for the stand-in.
    model = tmp_path / "random-model"
    shutil.copytree(shape, model)
    (model / "model.safetensors").write_bytes(b"")
    ids = Tokenizer.from_file(str(smol_dir / "tokenizer.json")).encode("alpha, beta, gamma 日本語, alpha").ids
    script = {"reply": ids, "end": "none", "ngram_acceptance": [2, 0, 3], "draft_acceptance": [4, 4, 1]}
    (model / "standin.json").write_text(json.dumps(script), encoding="utf-8")

    rc = gpu_check.main(["--random-from", str(shape), "--model", str(model), "--max-new-tokens", "24"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["ok"] and summary["failures"] == []
    assert set(summary["runs"]) == {"a_none", "b_ngram", "c_draft_model", "d_none_fp16_cache"}
    assert {r["cache_mode"] for n, r in summary["runs"].items() if n != "d_none_fp16_cache"} == {"q8"}
    assert summary["runs"]["d_none_fp16_cache"]["cache_mode"] == "fp16"
    assert summary["acceptance_side_by_side"]["a_none"] is None
    assert summary["acceptance_side_by_side"]["c_draft_model"] > 0
    assert set(summary["tokens_per_s_side_by_side"]) == set(summary["runs"])
    assert summary["q8_vs_fp16_cache_same_tokens_until"] is None
    assert any("random" in line for line in summary["not_verified"])


def test_without_cuda_the_check_says_so_and_exits_2(monkeypatch, capsys):
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    import gpu_check

    assert gpu_check.main([]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert (
        len(lines) == 1
        and json.loads(lines[0])["error"] == "exllamav2 unusable: no CUDA GPU visible to torch"
    )
