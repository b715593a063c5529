"""Presets: the shipped TOML files, user overrides and additions, and one-line errors for bad files."""

from __future__ import annotations

import os
import tomllib
from dataclasses import FrozenInstanceError
from importlib import resources
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.presets import (
    FILE_KEYS,
    PRESET_NAMES_BUILTIN,
    Preset,
    PresetError,
    load_builtin_presets,
    load_presets,
)
from engine.request import SamplerSettings


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "presets"
    folder.mkdir()
    return folder


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(folder: Path) -> str:
    with pytest.raises(PresetError) as error:
        load_presets(folder)
    message = str(error.value)
    assert "\n" not in message and "pydantic" not in message
    return message


# ------------------------------------------------------------------------------------------ built-ins


def test_builtin_files_ship_as_package_data_with_comments() -> None:
    for name in PRESET_NAMES_BUILTIN:
        text = resources.files("presets").joinpath(f"{name}.toml").read_text(encoding="utf-8")
        data = tomllib.loads(text)
        assert set(data) <= set(FILE_KEYS)
        # Every built-in sets every key explicitly, and explains itself in comments.
        assert set(data) == set(FILE_KEYS)
        assert text.count("#") >= 4


def test_builtin_values_match_the_tasks() -> None:
    presets = load_builtin_presets()
    assert tuple(presets) == PRESET_NAMES_BUILTIN == ("code", "qa", "creative")
    code, qa, creative = presets["code"], presets["qa"], presets["creative"]
    assert (code.k, qa.k, creative.k) == (6, 5, 3)
    assert code.temperature == pytest.approx(0.2)
    assert qa.temperature == pytest.approx(0.5)
    assert creative.temperature == pytest.approx(0.9)
    assert (code.max_new_tokens, qa.max_new_tokens, creative.max_new_tokens) == (1024, 512, 768)
    assert creative.ramp_start == pytest.approx(0.5) and creative.ramp_tokens == 24
    for preset in presets.values():
        assert preset.source == "built-in" and preset.is_builtin
        assert preset.repetition_penalty == 1.0
        assert preset.drafting
        assert preset.ramp_tokens > 0 and preset.ramp_start < preset.temperature
        assert preset.description and "\n" not in preset.description
        assert 0 < preset.top_p <= 1 and 0 <= preset.min_p < 1


def test_sampler_carries_every_sampling_field() -> None:
    creative = load_builtin_presets()["creative"]
    sampler = creative.sampler()
    assert isinstance(sampler, SamplerSettings)
    assert sampler == SamplerSettings(
        temperature=0.9,
        top_p=0.95,
        top_k=0,
        min_p=0.05,
        repetition_penalty=1.0,
        ramp_tokens=24,
        ramp_start=0.5,
    )
    # The ramp starts cool and reaches the preset's temperature at its end.
    assert sampler.temperature_at(0) == pytest.approx(0.5)
    assert sampler.temperature_at(12) == pytest.approx(0.7)
    assert sampler.temperature_at(24) == pytest.approx(0.9)


def test_preset_is_frozen() -> None:
    code = load_builtin_presets()["code"]
    with pytest.raises((ValidationError, FrozenInstanceError, TypeError)):
        code.k = 2  # type: ignore[misc]


def test_no_user_folder_means_builtins_only(tmp_path: Path) -> None:
    assert tuple(load_presets(tmp_path / "missing")) == PRESET_NAMES_BUILTIN


def test_default_user_folder_is_in_the_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    write_to = tmp_path / "specchat" / "presets"
    write_to.mkdir(parents=True)
    write(write_to, "fast.toml", "k = 8\n")
    presets = load_presets()
    assert presets["fast"].k == 8
    assert presets["fast"].source == str(write_to / "fast.toml")


# -------------------------------------------------------------------------------- user add / override


def test_partial_override_keeps_the_builtin_values(user_dir: Path) -> None:
    path = write(user_dir, "code.toml", "# faster, please\nk = 8\nmax_new_tokens = 2048\n")
    presets = load_presets(user_dir)
    builtin = load_builtin_presets()["code"]
    code = presets["code"]
    assert code.k == 8 and code.max_new_tokens == 2048
    assert code.temperature == builtin.temperature
    assert code.top_k == builtin.top_k and code.ramp_tokens == builtin.ramp_tokens
    assert code.description == builtin.description
    assert code.source == str(path) and not code.is_builtin
    assert tuple(presets) == PRESET_NAMES_BUILTIN  # an override keeps its place


def test_cooling_a_builtin_clamps_its_inherited_ramp_start(user_dir: Path) -> None:
    write(user_dir, "creative.toml", "temperature = 0.3\n")
    creative = load_presets(user_dir)["creative"]
    assert creative.temperature == pytest.approx(0.3)
    assert creative.ramp_start == pytest.approx(0.3)


def test_user_presets_are_added_after_builtins_sorted(user_dir: Path) -> None:
    write(user_dir, "zeta.toml", 'description = "Last one"\nk = 2\n')
    write(user_dir, "alpha.toml", "temperature = 0.0\nk = 0\ndrafting = false\n")
    write(user_dir, "notes.txt", "not a preset")
    presets = load_presets(user_dir)
    assert tuple(presets) == ("code", "qa", "creative", "alpha", "zeta")
    alpha = presets["alpha"]
    assert alpha.k == 0 and alpha.drafting is False and alpha.temperature == 0.0
    # Unset fields take the model defaults; a missing description names the file.
    assert alpha.max_new_tokens == 512 and alpha.repetition_penalty == 1.0
    assert alpha.description == "user preset (alpha.toml)"
    assert presets["zeta"].description == "Last one"


def test_integer_temperature_is_accepted(user_dir: Path) -> None:
    write(user_dir, "hot.toml", "temperature = 1\n")
    assert load_presets(user_dir)["hot"].temperature == 1.0


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("k = 40\n", "k: must be between 0 and 16 (got 40)"),
        ('k_mode = "sometimes"\n', "k_mode: must be one of fixed, adaptive, dynamic (got 'sometimes')"),
        ("k_mode = 1\n", "k_mode: must be one of fixed, adaptive, dynamic (got 1)"),
        ("temperature = -0.5\n", "temperature: must be at least 0.0 (got -0.5)"),
        ("top_p = 0.0\n", "top_p: must be greater than 0.0 and at most 1.0 (got 0.0)"),
        ("min_p = 1.0\n", "min_p: must be at least 0.0 and less than 1.0 (got 1.0)"),
        ("max_new_tokens = 0\n", "max_new_tokens: must be between 1 and 32768 (got 0)"),
        ("repetition_penalty = 0\n", "repetition_penalty: must be greater than 0.0 (got 0)"),
        ('k = "6"\n', "k: must be a whole number (got '6')"),
        ("k = 6.0\n", "k: must be a whole number (got 6.0)"),
        ("drafting = 1\n", "drafting: must be true or false (got 1)"),
        ('temperature = "hot"\n', "temperature: must be a number (got 'hot')"),
        ("description = 3\n", "description: must be text (a quoted string) (got 3)"),
        ('description = """two\nlines"""\n', "description: must be one line"),
        ("temprature = 0.3\n", "temprature: unknown key (did you mean 'temperature'?)"),
        ("[sampler]\ntop_k = 3\n", "sampler: unknown key"),
        ('name = "other"\n', "name: not allowed in a preset file (the name is the file's name)"),
        ("temperature = 0.2\nramp_start = 0.5\n", "ramp_start: must be at most temperature (0.2) (got 0.5)"),
    ],
)
def test_bad_values_name_file_and_field(user_dir: Path, text: str, expected: str) -> None:
    path = write(user_dir, "fast.toml", text)
    message = load_error(user_dir)
    assert message.startswith(f"{path}: {expected}"), message


def test_bad_value_in_builtin_override_names_the_user_file(user_dir: Path) -> None:
    path = write(user_dir, "qa.toml", "k = 17\n")
    assert load_error(user_dir) == f"{path}: k: must be between 0 and 16 (got 17)"


def test_toml_syntax_error_names_file_and_line(user_dir: Path) -> None:
    path = write(user_dir, "broken.toml", "k = 4\ntemperature = = 0.3\n")
    message = load_error(user_dir)
    assert message.startswith(f"{path}: line 2: invalid TOML: ")


def test_several_problems_in_one_file_stay_on_one_line(user_dir: Path) -> None:
    path = write(user_dir, "fast.toml", "k = 40\ntemperature = -1.0\n")
    message = load_error(user_dir)
    assert message == (
        f"{path}: k: must be between 0 and 16 (got 40); temperature: must be at least 0.0 (got -1.0)"
    )


def test_reserved_and_malformed_file_names(user_dir: Path) -> None:
    path = write(user_dir, "auto.toml", "k = 4\n")
    assert "reserved" in load_error(user_dir) and str(path) in load_error(user_dir)
    path.unlink()
    path = write(user_dir, "my preset.toml", "k = 4\n")
    message = load_error(user_dir)
    assert message.startswith(f"{path}: the file name must be a preset name")


def test_error_under_home_shows_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / ".config" / "specchat" / "presets"
    folder.mkdir(parents=True)
    write(folder, "fast.toml", "k = 40\n")
    assert os.path.expanduser("~") == str(tmp_path)
    assert load_error(folder) == "~/.config/specchat/presets/fast.toml: k: must be between 0 and 16 (got 40)"


def test_preset_model_validates_directly() -> None:
    preset = Preset(name="x", k=0, temperature=0.0)
    assert preset.sampler().temperature == 0.0
    with pytest.raises(ValidationError):
        Preset(name="x", k=-1)


def test_built_ins_adapt_k_and_a_user_file_can_fix_it(tmp_path: Path):
    builtins = load_presets(tmp_path / "none")
    assert {p.k_mode for p in builtins.values()} == {"adaptive"}
    (tmp_path / "code.toml").write_text('k_mode = "fixed"\n')
    presets = load_presets(tmp_path)
    assert presets["code"].k_mode == "fixed" and presets["code"].k == builtins["code"].k
    assert presets["qa"].k_mode == "adaptive"


def test_the_presets_command_shows_adaptive_k_as_a_ceiling(tmp_path: Path, capsys, monkeypatch):
    import argparse

    from engine.config import presets_dir
    from tui.cli.presets import run as cmd_presets

    presets_dir().mkdir(parents=True, exist_ok=True)
    (presets_dir() / "steady.toml").write_text('k = 4\nk_mode = "fixed"\n')
    assert cmd_presets(argparse.Namespace()) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert " K≤6 " in lines["code"] and " K=4 " in lines["steady"]
