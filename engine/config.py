"""User settings: defaults < TOML file < environment (`SPECCHAT_*`) < command line.

`load_settings(**overrides)` is the one entry point: it builds `Settings` and turns every user mistake
(bad TOML, a value out of range, an unknown key) into a one-line `ConfigError` that says where the bad
value came from (the file, "environment" or "command line") and which field it is.

The error wording helpers here (`describe_validation_error`, `describe_toml_error`, `display_path`) are
shared with `engine.presets`, so preset files and the config file read the same way.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from engine.backends.registry import CHOICES, ENGINE_OPTIONS, EngineOption
from engine.backends.registry import CacheMode as CacheMode
from engine.endpoint import normalize_endpoint
from engine.errors import UserError
from engine.paths import (  # noqa: F401 (the settings' places, read through engine.config by the front ends)
    APP_NAME,
    CACHE_DIR_ENV,
    CONFIG_FILE_ENV,
    MODEL_NAMES,
    cache_dir,
    config_dir,
    config_file_path,
    display_path,
    model_name_at,
    named_model_path,
    presets_dir,
    user_data_dir,
)

ENV_PREFIX = "SPECCHAT_"

BACKEND_NAMES: tuple[str, ...] = CHOICES  # "auto" and the registry's engines: the CLI's choices read this


def data_dir(settings: Settings | None = None) -> Path:
    """Where conversations (specchat.db) and the metrics log live: `data_dir`, else the platform's user data
    folder (`$XDG_DATA_HOME/specchat`, `~/.local/share/specchat` on Linux)."""
    if settings is not None and settings.data_dir is not None:
        return settings.data_dir
    return user_data_dir()


class ConfigError(UserError, ValueError):
    """A bad config file, environment variable or command-line value; the message is one line for the user."""


# ---------------------------------------------------------------------------------------- error wording


def show_value(value: Any) -> str:
    """A value as it would look in a message: strings quoted, booleans in TOML spelling, long ones cut."""
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds_phrase(ge: Any = None, gt: Any = None, le: Any = None, lt: Any = None) -> str:
    if ge is not None and le is not None:
        return f"must be between {ge} and {le}"
    lower = f"at least {ge}" if ge is not None else f"greater than {gt}" if gt is not None else ""
    upper = f"at most {le}" if le is not None else f"less than {lt}" if lt is not None else ""
    return "must be " + " and ".join(part for part in (lower, upper) if part)


def _field_bounds(model: type[BaseModel], field: str) -> dict[str, Any]:
    """The numeric bounds (ge/gt/le/lt) declared on a model field, so a range error can state both ends."""
    info = model.model_fields.get(field)
    bounds: dict[str, Any] = {}
    if info is None:
        return bounds
    for constraint in info.metadata:
        for name in ("ge", "gt", "le", "lt"):
            value = getattr(constraint, name, None)
            if value is not None:
                bounds[name] = value
    return bounds


def field_label(loc: tuple[Any, ...]) -> str:
    """`('gpu_split', 1)` -> `gpu_split[1]`, `('keymap', 'quit')` -> `keymap.quit`."""
    label = ""
    for part in loc:
        if isinstance(part, int):
            label += f"[{part}]"
        else:
            label += f".{part}" if label else str(part)
    return label


_TYPE_PHRASES = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text (a quoted string)",
    "list_type": "must be a list, e.g. [20.0, 24.0]",
    "dict_type": "must be a table of names to values",
    "path_type": "must be a path",
    "finite_number": "must be a finite number",
}


def describe_validation_error(
    error: Mapping[str, Any], model: type[BaseModel], known_keys: tuple[str, ...] = ()
) -> tuple[str, str]:
    """One pydantic error as (field label, user-facing phrase), e.g. ("k", "must be between 0 and 16 (got 40)")."""
    kind = error["type"]
    loc = tuple(error.get("loc", ()))
    field = field_label(loc)
    value = error.get("input")
    ctx = error.get("ctx") or {}
    got = f" (got {show_value(value)})"

    if kind == "extra_forbidden":
        keys = known_keys or tuple(model.model_fields)
        close = difflib.get_close_matches(str(loc[-1]) if loc else "", keys, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "known keys: " + ", ".join(keys)
        return field, f"unknown key ({hint})"
    if kind == "missing":
        return field, "is required"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return field, "must be one of " + ", ".join(allowed) + got
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        top = str(loc[0]) if loc else ""
        bounds = _field_bounds(model, top) if len(loc) == 1 else {}
        bounds = bounds or {key: ctx[key] for key in ("ge", "gt", "le", "lt") if key in ctx}
        return field, _bounds_phrase(**bounds) + got
    if kind in ("value_error", "assertion_error"):
        message = str(ctx.get("error", error.get("msg", "")))
        # A model-level check names its own field as "field: message".
        if not field and ": " in message:
            field, message = message.split(": ", 1)
        return field, message
    if kind in _TYPE_PHRASES:
        return field, _TYPE_PHRASES[kind] + got
    message = str(error.get("msg", kind))
    return field, message[:1].lower() + message[1:] + got


def describe_toml_error(error: tomllib.TOMLDecodeError) -> str:
    """`Invalid value (at line 2, column 5)` -> `line 2: invalid TOML: invalid value (column 5)`."""
    text = str(error)
    match = re.search(r"\(at line (\d+), column (\d+)\)$", text)
    if match is None:
        match_end = re.search(r"\(at end of document\)$", text)
        reason = text[: match_end.start()].strip() if match_end else text
        return f"invalid TOML: {reason[:1].lower()}{reason[1:]}" + (" (at end of file)" if match_end else "")
    reason = text[: match.start()].strip()
    return f"line {match.group(1)}: invalid TOML: {reason[:1].lower()}{reason[1:]} (column {match.group(2)})"


def read_toml_file(path: Path, error_type: type[ValueError]) -> dict[str, Any]:
    """Parse a TOML file, raising `error_type` with a one-line message that names the file (and line)."""
    shown = display_path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise error_type(f"{shown}: is a folder, expected a TOML file") from None
    except OSError as exc:
        raise error_type(f"{shown}: cannot read ({exc.strerror or exc})") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error_type(f"{shown}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise error_type(f"{shown}: {describe_toml_error(exc)}") from None


# ------------------------------------------------------------------------------------------- settings


def option_fields(options: tuple[EngineOption, ...]) -> dict[str, Any]:
    """The settings fields of the engine options (engine/backends/registry.py's ENGINE_OPTIONS): each one's type,
    default and bounds, as `create_model` takes them."""
    fields: dict[str, Any] = {}
    for option in options:
        described = {"description": option.help} if isinstance(option.help, str) and option.help else {}
        fields[option.name] = (option.type, Field(option.default, ge=option.ge, **described))
    return fields


# The engine options' fields, declared in the registry's table; Settings adds the app's own and the checks.
EngineSettings = create_model("EngineSettings", __base__=BaseSettings, **option_fields(ENGINE_OPTIONS))


class Settings(EngineSettings):  # type: ignore[valid-type,misc]
    """Everything a user can configure. See docs/usage.md, "Configuration", for the table of fields.

    The engine options (model, draft, backend, cache modes, context, the remote server, ...) come first, from
    `ENGINE_OPTIONS`; the fields below are the chat's and the app's own."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    system_prompt: str | None = None
    preset: str = "auto"  # "auto" (the router picks per message) or a preset name; the caller checks the name
    seed: int | None = None
    # Draft from what the chat already wrote (other variants, branches, past chats not marked private) beside the
    # drafter: engine/decoding/drafters/history.py. Off: nothing is indexed.
    history_drafting: bool = True
    keymap: dict[str, str] = Field(default_factory=dict)  # binding id -> key, read by the TUI
    data_dir: Path | None = None  # None: the platform's user data folder
    theme: str | None = (
        None  # the Textual theme; None: textual-dark. The app writes it when the user picks one
    )

    @field_validator("endpoint", mode="after")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return normalize_endpoint(value)

    @field_validator("api_key_env", mode="after")
    @classmethod
    def _check_key_env(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip().lstrip("$")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be the name of an environment variable (e.g. OPENAI_API_KEY), not the key")
        return value

    @field_validator("model", "data_dir", mode="after")
    @classmethod
    def _expand_home(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("model", mode="after")
    @classmethod
    def _named_model(cls, value: Path | None) -> Path | None:
        # A model name (qwen2.5-coder-1.5b) stands for its file in the model cache, fetched before loading.
        return named_model_path(value) or value

    @field_validator("draft", mode="after")
    @classmethod
    def _check_draft(cls, value: str) -> str:
        # The words the drafters' name map takes (ngram, none, mtp), else a draft model folder or name.
        from engine.decoding.drafters import draft_choices, is_draft_keyword

        value = value.strip()
        if not value:
            raise ValueError(f"must be {draft_choices()} or a draft model folder")
        if is_draft_keyword(value):
            return value.lower()
        return str(named_model_path(value) or Path(value).expanduser())

    @field_validator("preset", "device", mode="after")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty (use 'auto')")
        return value

    @field_validator("gpu_split", mode="after")
    @classmethod
    def _positive_split(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or any(part <= 0 for part in value)):
            raise ValueError(f"must list one positive size in GB per GPU (got {value})")
        return value

    @property
    def uses_embedded_model(self) -> bool:
        return self.model is None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file path is looked up on every construction, so SPECCHAT_CONFIG_FILE / XDG_CONFIG_HOME
        # changes (tests, the CLI's --config) take effect without re-importing.
        toml_file = TomlConfigSettingsSource(settings_cls, toml_file=config_file_path())
        return (init_settings, env_settings, toml_file)


SETTINGS_FIELDS: tuple[str, ...] = tuple(Settings.model_fields)


def env_name(field: str) -> str:
    """The environment variable that sets `field`, e.g. cache_mode -> SPECCHAT_CACHE_MODE."""
    return ENV_PREFIX + field.upper()


def _env_has(field: str) -> bool:
    # pydantic-settings matches environment names case-insensitively by default.
    wanted = env_name(field).upper()
    return any(name.upper() == wanted for name in os.environ)


def save_setting(key: str, value: str, path: Path | None = None) -> Path:
    """Set a top-level string `key = "value"` in the config file, keeping every other line as it is.

    An existing top-level line for `key` is replaced; otherwise the line goes before the first table.
    Raises ConfigError (one line) when the file cannot be read or written.
    """
    path = config_file_path() if path is None else path
    line = f"{key} = {json.dumps(value)}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{display_path(path)}: cannot read ({exc})") from None
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    first_table = next((i for i, text in enumerate(lines) if text.lstrip().startswith("[")), len(lines))
    for i in range(first_table):
        if pattern.match(lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(first_table, line)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{display_path(path)}: cannot write ({exc.strerror or exc})") from None
    return path


def load_settings(**overrides: Any) -> Settings:
    """Build Settings with `overrides` (from the command line) on top; None-valued overrides are ignored.

    Raises ConfigError with one line naming where the bad value came from and which field it is.
    """
    return _load_settings(overrides, drop_bad=False)[0]


def load_settings_dropping_bad(**overrides: Any) -> tuple[Settings, list[str]]:
    """As `load_settings`, but a bad field falls back to its default and the rest stays (the chat app opens
    with a valid `[keymap]` beside a bad `cache_mode`). Returns the settings and one line per dropped field.

    A file that is not TOML at all cannot be read field by field: ConfigError, as from `load_settings`.
    """
    return _load_settings(overrides, drop_bad=True)


def _load_settings(overrides: dict[str, Any], drop_bad: bool) -> tuple[Settings, list[str]]:
    given = {key: value for key, value in overrides.items() if value is not None}
    path = config_file_path()
    shown = display_path(path)
    if os.environ.get(CONFIG_FILE_ENV) and not path.exists():
        raise ConfigError(f"{CONFIG_FILE_ENV}: {shown} does not exist")
    # Parse the file ourselves first: a syntax error then names the file and line instead of raising
    # tomllib's bare message from inside the settings source.
    file_values = read_toml_file(path, ConfigError) if path.exists() else {}
    try:
        return Settings(**given), []
    except ValidationError as exc:
        problems = []
        bad_fields: set[str] = set()
        for error in exc.errors():
            loc = tuple(error.get("loc", ()))
            top = str(loc[0]) if loc else ""
            field, phrase = describe_validation_error(error, Settings)
            if top in given:
                where = "command line"
            elif top in SETTINGS_FIELDS and _env_has(top):
                where, field = "environment", env_name(top) + field[len(top) :]
            elif top in file_values:
                where = shown
            else:
                where = "settings"
            problems.append(f"{where}: {field}: {phrase}")
            bad_fields.add(top)
        if not drop_bad:
            raise ConfigError("; ".join(problems)) from None
    # Each bad field gets its default from the highest-priority source (init), so the file's and the
    # environment's other values still apply; an unknown key is left out.
    defaults = {
        name: Settings.model_fields[name].get_default(call_default_factory=True)
        for name in bad_fields
        if name in SETTINGS_FIELDS
    }
    unknown = bad_fields - set(SETTINGS_FIELDS)
    kept = {**{k: v for k, v in given.items() if k not in bad_fields}, **defaults}
    try:
        if unknown:
            # An unknown key is in the file: its good keys are passed by hand (under the environment's).
            good_file = {
                k: v
                for k, v in file_values.items()
                if k in SETTINGS_FIELDS and k not in bad_fields and not _env_has(k)
            }
            settings = _settings_without_file({**good_file, **kept})
        else:
            settings = Settings(**kept)
    except ValidationError:
        raise ConfigError("; ".join(problems)) from None
    return settings, [f"{p} (ignored: the default is used)" for p in problems]


def settings_with(settings: Settings, values: Mapping[str, Any]) -> Settings:
    """`settings` with `values` (a form's text: "" is None for a setting whose default is None), each checked as
    the config file's are; ConfigError, one line naming the setting, where one does not take its value."""
    if not values:
        return settings
    update = {
        name: None if text == "" and Settings.model_fields[name].default is None else text
        for name, text in values.items()
    }
    try:
        return Settings.model_validate({**settings.model_dump(), **update})
    except ValidationError as exc:
        problems = [": ".join(describe_validation_error(error, Settings)) for error in exc.errors()]
        raise ConfigError("; ".join(problems)) from None


def _settings_without_file(values: dict[str, Any]) -> Settings:
    """Settings from `values` and the environment only (the config file is not read again)."""

    class _NoFileSettings(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, **_: Any):
            return (init_settings, env_settings)

    built = _NoFileSettings(**values)
    return Settings.model_construct(**built.model_dump())
