"""scripts/gpu_check.py with both engines, on the exllamav2 and exllamav3 stand-ins instead of a GPU, and its dry
run. The numbers mean nothing here; what is checked is the script's flow: exllamav3's four runs, its open points
(reply length, counters adding up, drafting after K 0, the import time) and the dry run's plan with its times."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.support import paths

ROOT = paths.ROOT


def _forget() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in ("exllamav2", "exllamav3"):
            del sys.modules[name]


@pytest.fixture
def gpu_check(monkeypatch):
    import torch

    _forget()
    monkeypatch.syspath_prepend(str(paths.EXL2_STANDIN))
    monkeypatch.syspath_prepend(str(paths.EXL3_STANDIN))
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
    _forget()


def test_both_engines_report_side_by_side_with_the_open_points(gpu_check, smol_dir, tmp_path, capsys):
    from tokenizers import Tokenizer

    model = tmp_path / "random-model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol_dir / name).is_file():
            shutil.copy(smol_dir / name, model / name)
    (model / "model.safetensors").write_bytes(b"")
    ids = Tokenizer.from_file(str(smol_dir / "tokenizer.json")).encode("alpha, beta, gamma, delta, alpha").ids
    script = {"reply": ids, "end": "none", "ngram_acceptance": [2, 0, 3], "draft_acceptance": [9]}
    (model / "standin.json").write_text(json.dumps(script), encoding="utf-8")

    rc = gpu_check.main(["--engine", "both", "--model", str(model), "--max-new-tokens", "24"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["failures"] == [] and rc == 0 and summary["ok"]
    assert set(summary["runs"]) == {"a_none", "b_ngram", "c_draft_model", "d_none_fp16_cache"}  # exllamav2
    exl3 = summary["exllamav3"]
    assert set(exl3["runs"]) == {"a_none", "b_ngram", "c_draft_model", "d_none_fp16_cache"}
    assert exl3["probe"] == "exllamav3 1.6.5 on stand-in GPU" and exl3["import_s"] is not None
    draft = exl3["runs"]["c_draft_model"]
    assert draft["reply_length"] == {"asked": 24, "got": 24, "stop": "max_new_tokens"}
    assert draft["counters"]["accepted_match"] and draft["counters"]["drafted_gap_ok"]
    assert draft["acceptance_rate"] > 0.9 and exl3["acceptance_side_by_side"]["a_none"] is None
    # The stand-in models the K 0 hazard, so the measurement shows it (on a GPU it is measured for real).
    k0 = exl3["drafting_after_k0"]
    assert (
        k0["after_k4"]["acceptance_rate"] > 0.9
        and k0["after_k0"]["acceptance_rate"] == 0.0
        and k0["degraded"]
    )
    assert any("MTP head" in line for line in summary["not_verified"])


def test_exllamav3_alone_without_it_says_so_and_exits_2(gpu_check, capsys, monkeypatch):
    from engine.backends import exllamav3

    monkeypatch.setattr(
        gpu_check, "probe_exllamav3", lambda progress=None: (False, "ImportError: no exllamav3")
    )
    assert gpu_check.main(["--engine", "exllamav3"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "exllamav3 unusable: ImportError: no exllamav3"
    assert exllamav3.probe_exllamav3 is not None


def test_dry_run_prints_every_step_with_its_expected_time():
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],  # both engines without --engine too
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("gpu-check dry run: engines exllamav2, exllamav3; nothing is run")
    steps = [line for line in out.splitlines() if line[:4].strip().rstrip(".").isdigit()]
    assert len(steps) >= 12
    assert any("build exllamav3_ext" in s and "~900 s" in s for s in steps)  # no prebuilt extension here
    assert any("exllamav3 c_draft_model" in s for s in steps) and any("exllamav2 b_ngram" in s for s in steps)
    assert "expected total" in out and "over the 6-minute budget" in out


def test_the_bundle_pins_exllamav3_and_carries_prebuilt_extensions(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_bundle

    from engine.backends.exllamav3 import PINNED_VERSION

    assert f"exllamav3=={PINNED_VERSION}" == gpu_bundle.EXL3_WHEEL and "exllamav2==0.3.2" in gpu_bundle.EXTRA
    built = tmp_path / "torch_extensions"
    for name in ("exllamav2_ext/exllamav2_ext.so", "exllamav3_ext/exllamav3_ext.so", "exllamav3_ext/main.o"):
        (built / name).parent.mkdir(parents=True, exist_ok=True)
        (built / name).write_bytes(b"\x7fELF")
    out = tmp_path / "bundle"
    out.mkdir()
    files = gpu_bundle.add_extensions(out, built)
    assert [p.name for p in files] == ["exllamav2_ext.so", "exllamav3_ext.so"]
    assert sorted(p.name for p in (out / "ext").iterdir()) == ["exllamav2_ext.so", "exllamav3_ext.so"]
    with pytest.raises(SystemExit, match="no exllamav2_ext / exllamav3_ext .so files"):
        gpu_bundle.add_extensions(out, tmp_path / "empty-dir")


def test_dry_run_of_a_bundle_with_prebuilt_extensions_fits_the_budget(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "ext").mkdir(parents=True)
    (bundle / "model").mkdir()
    for name in ("exllamav2_ext.so", "exllamav3_ext.so"):
        (bundle / "ext" / name).write_bytes(b"\x7fELF")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--offline", str(bundle), "--dry-run", "--engine", "both"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "import exllamav3 with the prebuilt exllamav3_ext (sm_90)  ~10 s" in done.stdout
    assert "install the bundle's wheels" in done.stdout and "over the 6-minute budget" not in done.stdout
