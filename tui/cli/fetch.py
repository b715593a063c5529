"""`specchat fetch [NAME ...]`: fetch and convert the embedded model (prints its folder and its GGUF file), or fetch
named models (engine/models/named.py: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b; prints each file)."""

from __future__ import annotations

import argparse

from tui.cli.common import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="qwen2.5-coder-1.5b, qwen2.5-coder-0.5b")


def run(args: argparse.Namespace) -> int:
    from engine.models import ProgressPrinter, ensure_embedded_gguf, ensure_embedded_model, print_progress
    from engine.models.named import NAMED_MODELS, ensure_named_model, named_model

    names = getattr(args, "names", None) or []
    unknown = [name for name in names if named_model(name) is None]
    if unknown:
        raise CliError(f"unknown model name {unknown[0]!r} (known: {', '.join(NAMED_MODELS)})")
    for name in names:
        print(ensure_named_model(name, ProgressPrinter(label="")), flush=True)
    if names:
        return 0
    print(ensure_embedded_model(print_progress))
    print(ensure_embedded_gguf(print_progress))  # what the llama.cpp backend runs
    return 0
