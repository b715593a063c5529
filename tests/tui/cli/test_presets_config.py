"""The command line with a bad preset file or a bad config field (issue 19): the bad part is left out and named
in one line, everything else applies."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.config import config_dir, load_settings_dropping_bad, presets_dir
from tests.support.isolation import isolated_config_and_data  # noqa: F401


def write_preset(name: str, text: str) -> Path:
    presets_dir().mkdir(parents=True, exist_ok=True)
    path = presets_dir() / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def write_config(text: str) -> Path:
    config_dir().mkdir(parents=True, exist_ok=True)
    path = config_dir() / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_presets_command_lists_the_good_presets_and_names_the_bad_file(capsys):
    from tui.cli.presets import run as cmd_presets

    bad = write_preset("short", "k = 99\n")
    write_preset("steady", "k = 2\n")
    assert cmd_presets(argparse.Namespace()) == 0
    captured = capsys.readouterr()
    names = [line.split()[0] for line in captured.out.splitlines()]
    assert names == ["code", "qa", "creative", "steady"]
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and bad.name in errors[0] and "k: must be between 0 and 16 (got 99)" in errors[0]


# --- a bad config field drops only that field ---------------------------------------------------------------


def test_an_unknown_preset_in_the_config_keeps_the_keymap_of_the_same_file(monkeypatch):
    import tui.app
    from tui.cli.chat import run as cmd_chat
    from tui.cli.entry import build_parser

    write_config('preset = "nosuch"\n[keymap]\n"reply.cancel" = "ctrl+g"\n')
    opened = {}
    monkeypatch.setattr(tui.app, "run_app", lambda settings, **kw: opened.update(settings=settings, **kw))
    assert cmd_chat(build_parser().parse_args([])) == 0
    assert opened["settings"].keymap == {"reply.cancel": "ctrl+g"}
    assert opened["settings"].preset == "auto"
    message = opened["startup_error"]
    assert "config.toml: preset: unknown preset 'nosuch'" in message and "auto is used" in message
    assert opened["session"] is not None and opened["session"].mode == "auto"


@pytest.mark.parametrize(
    ("line", "field"),
    [('cache_mode = "q3"', "cache_mode"), ("banana = 3", "banana"), ("max_context = 1", "")],
)
def test_a_bad_config_field_falls_back_alone(line: str, field: str):
    write_config(f'{line}\nsystem_prompt = "be brief"\n[keymap]\n"reply.cancel" = "ctrl+g"\n')
    settings, problems = load_settings_dropping_bad()
    assert settings.keymap == {"reply.cancel": "ctrl+g"} and settings.system_prompt == "be brief"
    assert len(problems) == 1 and "config.toml" in problems[0] and "ignored" in problems[0]
    assert settings.max_context == 4096 and settings.cache_mode == "auto"
