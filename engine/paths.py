"""Where specchat keeps things: the config file and presets folder, the model cache, the user data folder; the
models known by name and their cache files; a path as a user would type it. A leaf (the standard library and
platformdirs), so the engines and the model code find their folders without importing the settings.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "specchat"
CONFIG_FILE_ENV = "SPECCHAT_CONFIG_FILE"
CACHE_DIR_ENV = "SPECCHAT_CACHE_DIR"

# Models known by name (engine/models/named.py fetches them): the name stands for this file in the model cache.
MODEL_NAMES = {
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
}


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/specchat`, or `~/.config/specchat` when XDG_CONFIG_HOME is unset or not absolute."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".config"
    return base / APP_NAME


def config_file_path() -> Path:
    """The TOML settings file: `$SPECCHAT_CONFIG_FILE` if set, else `<config dir>/config.toml`."""
    explicit = os.environ.get(CONFIG_FILE_ENV, "")
    if explicit:
        return Path(explicit).expanduser()
    return config_dir() / "config.toml"


def presets_dir() -> Path:
    """Folder of user presets (`*.toml`), which add presets or override built-in ones."""
    return config_dir() / "presets"


def cache_dir() -> Path:
    """specchat's cache root (models, kernels, wheels): `$SPECCHAT_CACHE_DIR` if set, else the platform's user
    cache dir."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specchat"))


def named_model_path(value: str | Path | None) -> Path | None:
    """The cache file a model name stands for (fetched or not); None where `value` is no model name."""
    if value is None:
        return None
    file_name = MODEL_NAMES.get(str(value).strip().lower())
    return cache_dir() / "models" / file_name if file_name else None


def model_name_at(path: str | Path) -> str | None:
    """The name whose cache file `path` is, else None."""
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return None
    return next((n for n in MODEL_NAMES if named_model_path(n).resolve() == resolved), None)


def display_path(path: Path | str) -> str:
    """A path as a user would type it: `~/...` under the home folder, else as given."""
    path = Path(path)
    try:
        return "~/" + path.resolve().relative_to(Path.home().resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):
        return str(path)


def user_data_dir() -> Path:
    """The platform's user data folder for specchat (`$XDG_DATA_HOME/specchat`, `~/.local/share/specchat` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
