"""`specchat` run as a child process, and what a one-line error looks like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    """`specchat ARGS` in a child process. XDG_CONFIG_HOME / XDG_DATA_HOME point into the calling test's folders
    (`isolated_user_config`), and the child inherits them."""
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=timeout,
    )


def run_cli_isolated(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`specchat ARGS` in a child process reading its config from `tmp_path/config` (no SPECCHAT_CONFIG_FILE)."""
    full_env = dict(os.environ)
    full_env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    full_env.pop("SPECCHAT_CONFIG_FILE", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, no traceback, and exactly one line on stderr that says `error` and holds every fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    error_lines = [line for line in lines if "error" in line]
    assert len(error_lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])
