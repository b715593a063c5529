"""Flags before a subcommand apply to it or are refused, and a reader that closes the pipe early ends the output
quietly: never a flag silently ignored, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from tests.support.cli import assert_one_line_error
from tests.support.cli import run_cli_isolated as run_cli
from tui.cli.entry import EXIT_BROKEN_PIPE, parse_command_line


def test_model_and_preset_before_generate_apply_to_it():
    args = parse_command_line(["--model", "/nope", "--preset", "code", "generate", "--prompt", "hi"])
    assert (args.model, args.preset, args.prompt) == (Path("/nope"), "code", "hi")


def test_a_flag_after_the_subcommand_wins_over_the_same_flag_before_it():
    args = parse_command_line(["--preset", "code", "generate", "--preset", "qa", "--prompt", "hi"])
    assert args.preset == "qa"


def test_model_before_generate_is_the_model_it_loads(tmp_path):
    # It used to load the embedded model and exit 0.
    proc = run_cli(
        ["--model", str(tmp_path / "nope"), "--preset", "code", "generate", "--prompt", "hi"], tmp_path
    )
    assert_one_line_error(proc, "model folder not found", "nope")


@pytest.mark.parametrize(
    ("argv", "command", "flag"),
    [
        (["--model", "/nope", "history", "list"], "history", "--model"),
        (["--preset", "code", "presets"], "presets", "--preset"),
        (["--resume", "generate", "--prompt", "hi"], "generate", "--resume"),
        (["--chat", "3", "paths"], "paths", "--chat"),
    ],
)
def test_a_flag_the_subcommand_does_not_take_is_one_line_and_exit_2(tmp_path, argv, command, flag):
    proc = run_cli(argv, tmp_path)
    assert_one_line_error(proc, f"{command} does not take {flag}", f"specchat {command} --help")
    assert proc.stdout == ""


def test_flags_before_no_subcommand_still_open_the_chat_with_them():
    args = parse_command_line(["--model", "/nope", "--resume"])
    assert (args.command, args.model, args.resume) == (None, Path("/nope"), True)


def closed_early(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `specchat ARGV` into a pipe whose reader is gone before the first line (`| head -0`, at once)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tui.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        os.close(write_end)


@pytest.fixture
def env_with_chats(tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data"
    session = ChatSession(
        Settings(data_dir=data),
        backend=ScriptedBackend(["One.", "Two."]),
        presets=load_presets(None),
        save=True,
    )
    session.load()
    for text in ("first question", "second question"):
        session.new_chat()
        session.send(text, lambda e: None, threading.Event())
    env = dict(os.environ, SPECCHAT_DATA_DIR=str(data), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env.pop("SPECCHAT_CONFIG_FILE", None)
    return env


@pytest.mark.parametrize(
    "argv",
    [["history", "list", "--json"], ["history", "list"], ["history", "show", "1"], ["paths"], ["presets"]],
)
def test_a_closed_pipe_ends_the_output_quietly(env_with_chats, argv):
    proc = closed_early(argv, env_with_chats)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stderr == ""
    assert proc.returncode == EXIT_BROKEN_PIPE
