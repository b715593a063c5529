"""`specchat fetch`: fetch and convert the embedded model; prints its folder and its GGUF file."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from engine.models import ensure_embedded_gguf, ensure_embedded_model, print_progress

    print(ensure_embedded_model(print_progress))
    print(ensure_embedded_gguf(print_progress))  # what the llama.cpp backend runs
    return 0
