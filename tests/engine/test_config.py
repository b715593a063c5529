"""Settings: real TOML files, real environment variables, precedence and one-line errors."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from engine.config import (
    ConfigError,
    Settings,
    config_dir,
    config_file_path,
    display_path,
    env_name,
    load_settings,
    presets_dir,
)
from engine.request import CACHE_MODES


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated XDG config home (and HOME) with no SPECCHAT_* variables set; returns the specchat dir."""
    for name in list(os.environ):
        if name.upper().startswith("SPECCHAT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    folder = tmp_path / "xdg" / "specchat"
    folder.mkdir(parents=True)
    return folder


def write_config(folder: Path, text: str) -> Path:
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- locations


def test_locations_follow_xdg_config_home(config_home: Path) -> None:
    assert config_dir() == config_home
    assert config_file_path() == config_home / "config.toml"
    assert presets_dir() == config_home / "presets"


def test_locations_default_to_dot_config_when_xdg_unset_or_relative(
    config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_dir() == tmp_path / "home" / ".config" / "specchat"
    # The XDG spec says relative values are invalid and must be ignored.
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")
    assert config_dir() == tmp_path / "home" / ".config" / "specchat"


def test_config_file_env_overrides_location(config_home: Path, tmp_path: Path, monkeypatch) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('cache_mode = "q4"\n')
    monkeypatch.setenv("SPECCHAT_CONFIG_FILE", str(other))
    assert config_file_path() == other
    assert load_settings().cache_mode == "q4"


def test_display_path_uses_tilde_under_home(config_home: Path, tmp_path: Path) -> None:
    assert display_path(tmp_path / "home" / ".config" / "specchat" / "config.toml") == (
        "~/.config/specchat/config.toml"
    )
    assert display_path("/somewhere/else.toml") == "/somewhere/else.toml"


# -------------------------------------------------------------------------------------------- defaults


def test_defaults_without_file_or_environment(config_home: Path) -> None:
    settings = load_settings()
    assert settings.model is None and settings.uses_embedded_model
    assert settings.draft == "ngram"
    assert settings.backend == "auto"
    assert settings.cache_mode == "auto" and settings.draft_cache_mode == "auto"
    assert settings.max_context == 4096
    assert settings.system_prompt is None
    assert settings.preset == "auto"
    assert settings.seed is None
    assert settings.device == "auto"
    assert settings.keymap == {}
    assert settings.gpu_split is None
    assert settings.data_dir is None


def test_cache_modes_match_the_backend_contract() -> None:
    from typing import get_args

    assert get_args(Settings.model_fields["cache_mode"].annotation) == ("auto", *CACHE_MODES)
    assert get_args(Settings.model_fields["draft_cache_mode"].annotation) == ("auto", *CACHE_MODES)


def test_auto_cache_mode_is_each_backends_default() -> None:
    from engine.backends.registry import resolve_cache_mode

    assert resolve_cache_mode("auto", "exllamav2") == "q8"
    assert resolve_cache_mode("auto", "transformers") == "fp16"  # full precision: the model's own text
    assert resolve_cache_mode("q4", "transformers") == "q4"


# ------------------------------------------------------------------------------------------ precedence


def test_precedence_cli_over_env_over_file_over_defaults(config_home: Path, monkeypatch) -> None:
    write_config(
        config_home,
        'cache_mode = "q6"\ndraft_cache_mode = "q4"\nmax_context = 8192\nsystem_prompt = "from file"\nseed = 1\n',
    )
    monkeypatch.setenv("SPECCHAT_CACHE_MODE", "fp16")
    monkeypatch.setenv("SPECCHAT_MAX_CONTEXT", "2048")
    settings = load_settings(max_context=1024)
    assert settings.max_context == 1024  # command line beats environment and file
    assert settings.cache_mode == "fp16"  # environment beats file
    assert settings.draft_cache_mode == "q4"  # file beats default
    assert settings.system_prompt == "from file"
    assert settings.seed == 1
    assert settings.backend == "auto"  # default where nobody says anything


def test_none_overrides_are_ignored(config_home: Path, monkeypatch) -> None:
    write_config(config_home, 'preset = "code"\n')
    monkeypatch.setenv("SPECCHAT_SEED", "7")
    settings = load_settings(preset=None, seed=None, model=None, cache_mode=None)
    assert settings.preset == "code"
    assert settings.seed == 7
    assert settings.cache_mode == "auto"


def test_structured_values_from_file_and_environment(config_home: Path, monkeypatch) -> None:
    write_config(
        config_home,
        'model = "~/models/llama"\ndraft = "~/models/tiny"\ngpu_split = [20, 24.5]\n'
        '[keymap]\nquit = "ctrl+q"\nstats = "f2"\n',
    )
    settings = load_settings()
    home = Path(os.environ["HOME"])
    assert settings.model == home / "models" / "llama"
    assert settings.draft == str(home / "models" / "tiny")
    assert settings.gpu_split == [20.0, 24.5]
    assert settings.keymap == {"quit": "ctrl+q", "stats": "f2"}
    monkeypatch.setenv("SPECCHAT_KEYMAP", '{"quit": "ctrl+x"}')
    monkeypatch.setenv("SPECCHAT_DRAFT", "NONE")
    settings = load_settings()
    # Tables merge across sources: the environment rebinds one key, the file's other bindings stay.
    assert settings.keymap == {"quit": "ctrl+x", "stats": "f2"}
    assert settings.draft == "none"


def test_data_dir_and_model_from_cli(config_home: Path, tmp_path: Path) -> None:
    settings = load_settings(model=tmp_path / "m", data_dir=str(tmp_path / "d"), backend="transformers")
    assert settings.model == tmp_path / "m"
    assert settings.data_dir == tmp_path / "d"
    assert settings.backend == "transformers"


# -------------------------------------------------------------------------------------------- errors


def assert_one_line(error: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert "Traceback" not in message and "pydantic" not in message
    return message


def test_file_error_names_file_and_field(config_home: Path) -> None:
    write_config(config_home, 'cache_mode = "q3"\n')
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == (
        f"{config_home / 'config.toml'}: cache_mode: must be one of auto, fp16, q8, q6, q4 (got 'q3')"
    )


def test_file_error_under_home_is_shown_with_tilde(config_home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME")
    folder = tmp_path / "home" / ".config" / "specchat"
    folder.mkdir(parents=True)
    write_config(folder, 'cache_mode = "q3"\n')
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == (
        "~/.config/specchat/config.toml: cache_mode: must be one of auto, fp16, q8, q6, q4 (got 'q3')"
    )


def test_environment_error_names_the_variable(config_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_MAX_CONTEXT", "100")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == "environment: SPECCHAT_MAX_CONTEXT: must be at least 256 (got '100')"
    monkeypatch.setenv("SPECCHAT_MAX_CONTEXT", "lots")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == "environment: SPECCHAT_MAX_CONTEXT: must be a whole number (got 'lots')"


def test_environment_error_for_bad_json_list(config_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_GPU_SPLIT", "[20,")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error).startswith("environment: SPECCHAT_GPU_SPLIT: must be a list")


def test_command_line_error_names_command_line(config_home: Path, monkeypatch) -> None:
    write_config(config_home, 'backend = "transformers"\n')
    with pytest.raises(ConfigError) as error:
        load_settings(backend="vllm")
    assert assert_one_line(error) == (
        "command line: backend: must be one of auto, exllamav2, exllamav3, transformers, llamacpp, remote (got 'vllm')"
    )


def test_command_line_beats_a_bad_env_value_is_still_reported(config_home: Path, monkeypatch) -> None:
    # A valid CLI value replaces a bad environment value entirely: nothing to report.
    monkeypatch.setenv("SPECCHAT_CACHE_MODE", "q3")
    assert load_settings(cache_mode="q4").cache_mode == "q4"


def test_toml_syntax_error_names_file_and_line(config_home: Path) -> None:
    path = write_config(config_home, 'cache_mode = "q8"\nmax_context = \n')
    with pytest.raises(ConfigError) as error:
        load_settings()
    message = assert_one_line(error)
    assert message.startswith(f"{path}: line 2: invalid TOML: ")


def test_unknown_key_in_file_suggests_the_close_name(config_home: Path) -> None:
    path = write_config(config_home, 'cach_mode = "q4"\n')
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == f"{path}: cach_mode: unknown key (did you mean 'cache_mode'?)"


def test_wrong_types_in_file(config_home: Path) -> None:
    path = write_config(config_home, 'max_context = "big"\ngpu_split = [20, -1]\n')
    with pytest.raises(ConfigError) as error:
        load_settings()
    message = assert_one_line(error)
    assert f"{path}: max_context: must be a whole number (got 'big')" in message
    assert "gpu_split: must list one positive size in GB per GPU" in message


def test_several_problems_stay_on_one_line(config_home: Path, monkeypatch) -> None:
    path = write_config(config_home, 'draft_cache_mode = "fp8"\n')
    monkeypatch.setenv("SPECCHAT_BACKEND", "cuda")
    with pytest.raises(ConfigError) as error:
        load_settings(max_context=10)
    message = assert_one_line(error)
    assert "command line: max_context: must be at least 256 (got 10)" in message
    assert (
        "environment: SPECCHAT_BACKEND: must be one of auto, exllamav2, exllamav3, transformers, llamacpp, remote (got 'cuda')"
        in message
    )
    assert f"{path}: draft_cache_mode: must be one of auto, fp16, q8, q6, q4 (got 'fp8')" in message


def test_missing_explicit_config_file(config_home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CONFIG_FILE", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == f"SPECCHAT_CONFIG_FILE: {tmp_path / 'nope.toml'} does not exist"


def test_config_path_that_is_a_folder(config_home: Path) -> None:
    (config_home / "config.toml").mkdir()
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert assert_one_line(error) == f"{config_home / 'config.toml'}: is a folder, expected a TOML file"


def test_blank_draft_and_preset_are_rejected(config_home: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(draft="  ")
    assert (
        assert_one_line(error)
        == "command line: draft: must be 'ngram', 'none', 'mtp' or a draft model folder"
    )
    with pytest.raises(ConfigError) as error:
        load_settings(preset="")
    assert assert_one_line(error) == "command line: preset: must not be empty (use 'auto')"


def test_unknown_override_is_reported_as_command_line(config_home: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(temprature=0.3)
    assert assert_one_line(error).startswith("command line: temprature: unknown key")


def test_env_name() -> None:
    assert env_name("cache_mode") == "SPECCHAT_CACHE_MODE"


def test_save_setting_replaces_or_adds_the_top_level_line_and_keeps_the_rest(tmp_path):
    from engine.config import save_setting

    path = tmp_path / "config.toml"
    path.write_text('# mine\nmax_context = 2048\n\n[keymap]\n"help.show" = "f9"\n', encoding="utf-8")
    save_setting("theme", "nord", path)
    assert path.read_text(encoding="utf-8").startswith(
        '# mine\nmax_context = 2048\n\ntheme = "nord"\n[keymap]'
    )
    save_setting("theme", "gruvbox", path)
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data == {"max_context": 2048, "theme": "gruvbox", "keymap": {"help.show": "f9"}}


def test_settings_with_a_forms_text_checks_each_value_as_the_config_files() -> None:
    # The settings dialog's engine rows reload with their text (tui/chat_settings.py's changed_options).
    from engine.config import settings_with

    settings = load_settings(endpoint="http://127.0.0.1:8080")
    assert settings_with(settings, {}) is settings
    changed = settings_with(settings, {"max_context": "2048", "endpoint": ""})
    assert changed.max_context == 2048 and changed.endpoint is None  # "" is None where the default is None
    assert settings.max_context == 4096  # the settings in force are left alone
    with pytest.raises(ConfigError, match=r"^max_context: must be at least 256 \(got '100'\)$"):
        settings_with(settings, {"max_context": "100"})
