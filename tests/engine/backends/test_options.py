"""The engine options, declared once (engine/backends/registry.py's ENGINE_OPTIONS): each row is a Settings field
(its config key and SPECCHAT_ variable), an EngineArgs field and a command-line flag, and a row added reaches all."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.backends import registry
from engine.backends.base import EngineArgs, engine_args_type
from engine.backends.registry import ENGINE_OPTIONS, EngineOption
from engine.config import ENV_PREFIX, Settings, env_name, load_settings, option_fields
from tui.cli.common import OneLineParser, add_model_flags, add_option_flags, cli_overrides


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions}


def test_every_option_is_a_setting_an_engine_argument_and_a_flag() -> None:
    parser = OneLineParser(prog="specchat")
    add_model_flags(parser)
    flags = _flags(parser)
    args_fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    overrides = cli_overrides(parser.parse_args([]))
    for option in ENGINE_OPTIONS:
        field = Settings.model_fields[option.name]
        assert field.annotation == option.type and field.default == option.default, option.name
        assert set(option.engines) <= set(registry.NAMES), option.name
        if option.engine_arg:
            assert args_fields[option.name].default == option.default, option.name
        else:
            assert option.name not in args_fields
        if option.flag:
            action = flags[option.name]
            assert action.option_strings == [option.flag_name]
            assert action.help == (option.help() if callable(option.help) else option.help)
            assert option.name in overrides
        else:
            assert option.name not in flags and option.name not in overrides
    assert list(args_fields) == [option.name for option in ENGINE_OPTIONS if option.engine_arg]


def test_the_same_flags_help_and_choices_as_before() -> None:
    """What the flags looked like when each was written by hand, kept as they were."""
    parser = OneLineParser(prog="specchat")
    add_model_flags(parser)
    flags = _flags(parser)
    assert [a.option_strings[0] for a in parser._actions[1:]] == [
        "--model", "--draft", "--backend", "--endpoint", "--api-key-env", "--remote-model", "--cache-mode",
        "--draft-cache-mode", "--max-context", "--system-prompt", "--seed",
    ]  # fmt: skip
    assert flags["model"].type is Path and flags["max_context"].type is int and flags["seed"].type is int
    assert flags["draft"].type is None and flags["endpoint"].type is None
    assert (
        flags["cache_mode"].choices == ["auto", "fp16", "q8", "q6", "q4"] == flags["draft_cache_mode"].choices
    )
    assert flags["backend"].choices == list(registry.CHOICES)
    assert (flags["api_key_env"].metavar, flags["remote_model"].metavar) == ("VAR", "NAME")


def test_each_option_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(env_name("max_context"), "512")
    monkeypatch.setenv(env_name("threads"), "3")
    monkeypatch.setenv(env_name("gpu_split"), "[20.0, 24.0]")
    settings = load_settings()
    args = EngineArgs.from_settings(settings)
    assert (args.max_context, args.threads, args.gpu_split) == (512, 3, (20.0, 24.0))
    monkeypatch.setenv(env_name("threads"), "0")
    with pytest.raises(ValueError, match=r"^environment: SPECCHAT_THREADS: must be at least 1 \(got '0'\)$"):
        load_settings()


BATCH = EngineOption("batch_size", int, 8, "prompt tokens a step takes", ge=1, engines=("llamacpp",))


def test_an_option_added_as_one_row_reaches_the_settings_the_engine_and_the_command_line(monkeypatch) -> None:
    rows = (*ENGINE_OPTIONS, BATCH)
    monkeypatch.setattr(registry, "ENGINE_OPTIONS", rows)

    parser = OneLineParser(prog="specchat")
    add_option_flags(parser, rows)
    assert "--batch-size" in parser.format_help() and "prompt tokens a step takes" in parser.format_help()
    given = cli_overrides(parser.parse_args(["--batch-size", "16"]))
    assert given["batch_size"] == 16

    from pydantic import create_model

    fields = option_fields(rows)
    base = create_model("Options", __base__=BaseSettings, **fields)

    class WithRow(base):  # type: ignore[valid-type,misc]
        model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    assert WithRow().batch_size == 8
    assert WithRow(**{k: v for k, v in given.items() if k in fields and v is not None}).batch_size == 16
    monkeypatch.setenv("SPECCHAT_BATCH_SIZE", "4")
    settings = WithRow()
    assert settings.batch_size == 4
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        WithRow(batch_size=0)

    args_type = engine_args_type(tuple(row for row in rows if row.engine_arg))
    assert args_type.from_settings(settings).batch_size == 4
    assert args_type().batch_size == 8
