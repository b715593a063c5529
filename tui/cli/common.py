"""What every subcommand of the `specchat` command line shares: the one-line parser, the model flags, the settings.

Every user mistake ends as one line on stderr and exit code 2 (`EXIT_USAGE`), never a traceback: a subcommand
raises `CliError` (or any `engine.errors.UserError`) and `tui.cli.entry` prints it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2


class CliError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_model_flags(p: argparse.ArgumentParser) -> None:
    from engine.config import BACKEND_NAMES
    from engine.decoding.drafters import draft_help

    p.add_argument(
        "--model",
        type=Path,
        help="model folder, .gguf file or name (qwen2.5-coder-1.5b; default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--draft",
        help=draft_help(),
    )
    p.add_argument(
        "--backend",
        choices=list(BACKEND_NAMES),
        help="inference engine (remote: an OpenAI-compatible server at --endpoint)",
    )
    p.add_argument(
        "--endpoint",
        help="remote server's base URL (llama-server, vLLM, TabbyAPI), e.g. http://127.0.0.1:8080",
    )
    p.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the remote server's API key"
    )
    p.add_argument("--remote-model", metavar="NAME", help="model to ask the remote server for")
    p.add_argument(
        "--cache-mode",
        choices=["auto", "fp16", "q8", "q6", "q4"],
        help="KV cache precision (default auto: q8 on exllamav2/exllamav3, full precision on transformers)",
    )
    p.add_argument(
        "--draft-cache-mode", choices=["auto", "fp16", "q8", "q6", "q4"], help="draft model's KV cache"
    )
    p.add_argument("--max-context", type=int, help="context length in tokens")
    p.add_argument("--system-prompt", help="system prompt for the conversation")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible replies)")


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (None: not given)."""
    return {
        "model": getattr(args, "model", None),
        "draft": getattr(args, "draft", None),
        "backend": getattr(args, "backend", None),
        "cache_mode": getattr(args, "cache_mode", None),
        "draft_cache_mode": getattr(args, "draft_cache_mode", None),
        "max_context": getattr(args, "max_context", None),
        "system_prompt": getattr(args, "system_prompt", None),
        "seed": getattr(args, "seed", None),
        "preset": getattr(args, "preset", None),
        "endpoint": getattr(args, "endpoint", None),
        "api_key_env": getattr(args, "api_key_env", None),
        "remote_model": getattr(args, "remote_model", None),
    }


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
