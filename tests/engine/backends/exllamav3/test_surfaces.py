"""Where the rest of the app names ExLlamaV3: `specchat doctor`'s probe line, the CLI's backend list, TabbyAPI's
draft mode on the remote backend, and `specchat --backend exllamav3` on a machine without CUDA (one line)."""

from __future__ import annotations

import pytest

from engine.backends.remote.servers import build_profile
from engine.benchmarks.doctor import CHECK_NAMES, DoctorReport, check_environment
from engine.config import BACKEND_NAMES
from tests.support.cli import assert_one_line_error
from tests.support.cli import run_cli_isolated as run_cli


def _check(report: DoctorReport, name: str):
    return next(c for c in report.checks if c.name == name)


def test_doctor_has_an_exllamav3_line_without_cuda():
    import torch

    if torch.cuda.is_available():  # pragma: no cover - a CUDA machine
        pytest.skip("this machine has CUDA")
    report = DoctorReport()
    check_environment(report)
    check = _check(report, "exllamav3")
    assert check.status == "warn" and check.reason.startswith("not usable without CUDA")
    names = [c.name for c in report.checks]
    assert names.index("exllamav3") == names.index("exllamav2") + 1 and "exllamav3" in CHECK_NAMES


def test_doctor_on_a_gpu_says_what_exllamav3_runs(monkeypatch):
    import torch

    from engine.backends import exllamav2, exllamav3

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(
        exllamav2.library, "probe_exllamav2", lambda progress=None: (True, "exllamav2 0.3.2 on NVIDIA H200")
    )
    monkeypatch.setattr(
        exllamav3.library, "probe_exllamav3", lambda progress=None: (True, "exllamav3 1.6.5 on NVIDIA H200")
    )
    report = DoctorReport()
    check_environment(report)
    check = _check(report, "exllamav3")
    assert (check.status, check.reason) == ("pass", "exllamav3 1.6.5 on NVIDIA H200")
    monkeypatch.setattr(
        exllamav3.library, "probe_exllamav3", lambda progress=None: (False, "ImportError: no triton")
    )
    report = DoctorReport()
    check_environment(report)
    assert _check(report, "exllamav3").status in (
        "warn",
        "fail",
    )  # not installed: warn; installed but broken: fail


def test_every_backend_list_has_exllamav3():
    assert (
        "exllamav3" in BACKEND_NAMES
        and BACKEND_NAMES.index("exllamav3") == BACKEND_NAMES.index("exllamav2") + 1
    )
    from tui.cli.common import OneLineParser, add_model_flags

    parser = OneLineParser(prog="specchat")
    add_model_flags(parser)
    action = next(a for a in parser._actions if "--backend" in a.option_strings)
    assert list(action.choices) == list(BACKEND_NAMES)


@pytest.mark.parametrize(
    ("parameters", "note", "speculating"),
    [
        ({"max_seq_len": 4096, "draft_mode": "mtp"}, "TabbyAPI draft mode: mtp", True),
        (
            {"max_seq_len": 4096, "draft": {"name": "d", "draft_mode": "model"}},
            "TabbyAPI draft mode: model",
            True,
        ),
        ({"max_seq_len": 4096, "draft_mode": "none"}, "TabbyAPI draft mode: none", False),
        ({"max_seq_len": 4096}, None, None),
    ],
)
def test_tabbyapi_draft_mode_is_shown(parameters, note, speculating):
    profile = build_profile(
        "tabbyapi", models={}, tabby_model={"id": "Qwen3.6-27B-exl3", "parameters": parameters}
    )
    modes = [n for n in profile.notes if n.startswith("TabbyAPI draft mode")]
    assert modes == ([note] if note else [])
    assert profile.speculating is speculating


def test_backend_exllamav3_without_cuda_is_one_line_and_exit_2(tmp_path, smol_dir):
    proc = run_cli(
        ["generate", "--model", str(smol_dir), "--prompt", "hi", "--backend", "exllamav3"], tmp_path
    )
    assert_one_line_error(proc, "exllamav3 is unusable here: no CUDA GPU visible to torch")
    assert "use --backend auto for the CPU backends" in proc.stderr
