"""Autouse fixtures that keep a test module off the user's own config (and data): a module takes one by importing
it (`from tests.support.isolation import isolated_config  # noqa: F401`); pytest applies it to that module only."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    """A config folder of the test's own; no config file or model named by the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    monkeypatch.delenv("SPECCHAT_MODEL", raising=False)


@pytest.fixture(autouse=True)
def isolated_config_and_data(tmp_path, monkeypatch):
    """As isolated_config, and a data folder of the test's own; no preset named by the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    monkeypatch.delenv("SPECCHAT_MODEL", raising=False)
    monkeypatch.delenv("SPECCHAT_PRESET", raising=False)
