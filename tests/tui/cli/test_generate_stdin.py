"""`specchat generate` reads its prompt from stdin: `echo hi | specchat generate`, `--prompt - < file`."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys

import orjson
import pytest

from tests.support.cli import assert_one_line_error
from tui.cli.generate import _read_prompts


def piped(argv: list[str], stdin: bytes, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    env.pop("SPECCHAT_CONFIG_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *argv], input=stdin, capture_output=True, env=env, timeout=600
    )


def read_prompts(monkeypatch, stdin: bytes, prompt: str | None = None) -> list[str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    return _read_prompts(argparse.Namespace(prompt=prompt, prompt_file=None))


def test_text_piped_in_is_the_prompt_lines_and_all(monkeypatch):
    code = "def f(x):\n    return x + 1\n\nExplain this function.\n"
    assert read_prompts(monkeypatch, code.encode()) == [code.removesuffix("\n")]
    assert read_prompts(monkeypatch, code.encode(), prompt="-") == [code.removesuffix("\n")]


def test_a_prompt_given_wins_over_a_pipe(monkeypatch):
    assert read_prompts(monkeypatch, b"from the pipe", prompt="from the flag") == ["from the flag"]


@pytest.mark.parametrize(
    ("stdin", "said"),
    [(b"", "empty prompt on stdin"), (b"\n \n", "empty prompt on stdin"), (b"\xff\xfe", "UTF-8")],
)
def test_empty_or_binary_stdin_is_one_line_and_exit_2(tmp_path, stdin, said):
    proc = piped(["generate", "--prompt", "-"], stdin, tmp_path)
    proc.stderr = proc.stderr.decode()
    assert_one_line_error(proc, said)


@pytest.mark.slow
def test_echo_into_generate_answers_it(tmp_path, smol_dir):
    proc = piped(
        ["generate", "--model", str(smol_dir), "--json", "--max-new-tokens", "8", "--preset", "qa"],
        b"What is the capital of France?\n",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    record = orjson.loads(proc.stdout.splitlines()[0])
    assert record["text"].strip() and record["prompt_token_ids"]
