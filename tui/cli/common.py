"""What every subcommand of the `specchat` command line shares: the one-line parser, the model flags, the settings.

Every user mistake ends as one line on stderr and exit code 2 (`EXIT_USAGE`), never a traceback: a subcommand
raises `CliError` (or any `engine.errors.UserError`) and `tui.cli.entry` prints it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import UnionType
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

EXIT_USAGE = 2


class CliError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The engine options' flags (engine/backends/registry.py's ENGINE_OPTIONS), then the chat's own two."""
    from engine.backends.registry import ENGINE_OPTIONS

    add_option_flags(p, ENGINE_OPTIONS)
    p.add_argument("--system-prompt", help="system prompt for the conversation")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible replies)")


def add_option_flags(p: argparse.ArgumentParser, options: tuple) -> None:
    """One flag per option the command line takes: --name-with-dashes, its help, a Literal's choices, the type
    a path or a number is read as."""
    for option in options:
        if not option.flag:
            continue
        kind = _flag_type(option.type)
        extra: dict[str, Any] = {"type": kind} if kind is not None else {}
        if option.metavar:
            extra["metavar"] = option.metavar
        choices = _choices(option.type)
        if choices:
            extra["choices"] = list(choices)
        text = option.help() if callable(option.help) else option.help
        p.add_argument(option.flag_name, help=text, **extra)


def _without_none(kind: Any) -> tuple:
    return tuple(
        arg
        for arg in (get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,))
        if arg is not type(None)
    )


def _flag_type(kind: Any) -> type | None:
    """Path or int where the setting is one (or one or None); None: the flag's text goes to the settings as is."""
    parts = _without_none(kind)
    return parts[0] if len(parts) == 1 and parts[0] in (Path, int, float) else None


def _choices(kind: Any) -> tuple:
    parts = _without_none(kind)
    return get_args(parts[0]) if len(parts) == 1 and get_origin(parts[0]) is Literal else ()


# The chat's own settings the command line gives beside the engine options (--preset is the chat's and bench's).
CHAT_FLAGS = ("system_prompt", "seed", "preset")


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (None: not given)."""
    from engine.backends.registry import ENGINE_OPTIONS

    names = [option.name for option in ENGINE_OPTIONS if option.flag] + list(CHAT_FLAGS)
    return {name: getattr(args, name, None) for name in names}


def cli_settings(args: argparse.Namespace, check_paths: bool = True):
    from engine.config import load_settings

    settings = load_settings(**cli_overrides(args))
    if not check_paths:
        return settings
    from engine.models import ProgressPrinter
    from engine.models.named import ensure_named_files

    ensure_named_files(
        settings, ProgressPrinter(label="")
    )  # --model qwen2.5-coder-1.5b: fetched on first use
    if settings.model is not None and not Path(settings.model).exists():
        raise CliError(f"model folder not found: {settings.model}")
    from engine.decoding.drafters import draft_keywords, is_draft_keyword

    draft = settings.draft
    if not is_draft_keyword(draft) and not Path(draft).exists():
        raise CliError(
            f"draft must be {', '.join(draft_keywords())} or a model folder; folder not found: {draft}"
        )
    return settings


def number_list(text: str | None, flag: str, kind: type, low: float, high: float) -> tuple | None:
    if text is None:
        return None
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CliError(f"{flag} must be a comma-separated list of numbers (got {text!r})") from None
    if not values or any(not low <= v <= high for v in values):
        raise CliError(f"{flag}: each value must be between {low:g} and {high:g} (got {text!r})")
    return values
