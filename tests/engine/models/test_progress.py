"""Load progress names the model being loaded: the Qwen pair's load never says SmolLM2-135M-Instruct."""

from __future__ import annotations

import io

import pytest

from engine.errors import SpecchatError
from engine.models import EMBEDDED_MODEL_NAME, model_label, progress_printer


def test_progress_lines_name_the_model_being_loaded():
    stream = io.StringIO()
    progress = progress_printer("qwen2.5-coder-1.5b", stream)
    progress("loading model", 0.1)
    progress("loading draft model", 0.6)
    assert stream.getvalue().splitlines() == [
        "specchat: qwen2.5-coder-1.5b: loading model  10%",
        "specchat: qwen2.5-coder-1.5b: loading draft model  60%",
    ]
    assert model_label(None) == EMBEDDED_MODEL_NAME
    assert (
        model_label("/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf") == "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M"
    )


def test_generate_prints_the_loaded_models_name_on_its_progress_lines(monkeypatch, capsys, tmp_path):
    import tui.cli.generate as generate
    from engine.config import Settings
    from engine.session import ChatSession
    from tui.cli.entry import main

    def load(self, progress=None):
        progress("loading model", 0.1)
        raise SpecchatError("stop here")

    model = tmp_path / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    monkeypatch.setattr(generate, "cli_settings", lambda args: Settings(model=model))
    monkeypatch.setattr(ChatSession, "load", load)
    with pytest.raises((SystemExit, SpecchatError)):
        raise SystemExit(main(["generate", "--prompt", "hi"]))
    err = capsys.readouterr().err
    assert "specchat: Qwen2.5-Coder-1.5B-Instruct-Q4_K_M: loading model" in err
    assert EMBEDDED_MODEL_NAME not in err
