"""Runs tests/e2e/tmux_e2e.sh: the real `specchat` in a real terminal (tmux), on the embedded model."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import paths

SCRIPT = paths.E2E / "tmux_e2e.sh"
SPECCHAT = paths.SPECCHAT


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_end_to_end(smol_dir):
    # smol_dir: the embedded model is fetched and converted before the clock in the script starts.
    if not SPECCHAT.exists():
        pytest.skip(f"{SPECCHAT} not installed")
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tmux_e2e: OK" in result.stdout
    assert "creative" in result.stdout
    assert "tmux_e2e: paste OK" in result.stdout
    assert "tmux_e2e: draft kept across quit OK" in result.stdout
