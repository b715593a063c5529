"""Progress lines for the CLI while a model is fetched, converted or loaded: one line per stage, updated in place on
a terminal, a line per quarter in a log."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

from engine.models.embedded import EMBEDDED_MODEL_NAME


class ProgressPrinter:
    """Progress to a stream: one line per stage, updated in place on a terminal, percent steps elsewhere."""

    def __init__(self, stream: IO[str] | None = None, label: str = EMBEDDED_MODEL_NAME) -> None:
        self._stream = stream
        self._label = label  # what is being prepared; "" where the stage names it
        self._stage: str | None = None
        self._last_percent: int | None = None

    def __call__(self, stage: str, fraction: float | None) -> None:
        stream = self._stream or sys.stderr
        interactive = stream.isatty()
        percent = None if fraction is None else max(0, min(100, round(fraction * 100)))
        new_stage = stage != self._stage
        if not new_stage and (percent is None or percent == self._last_percent):
            return
        if not new_stage and not interactive and percent != 100 and percent - (self._last_percent or 0) < 25:
            return  # in a log file, a line per quarter is plenty
        if new_stage and self._stage is not None and interactive:
            stream.write("\n")
        text = f"specchat: {self._label + ': ' if self._label else ''}{stage}" + (
            "" if percent is None else f" {percent:3d}%"
        )
        stream.write(("\r" + text) if interactive else (text + "\n"))
        if interactive and stage == "done":
            stream.write("\n")
        stream.flush()
        self._stage, self._last_percent = stage, percent


def print_progress(stage: str, fraction: float | None) -> None:
    """The CLI's default progress callback (stderr)."""
    _default_printer(stage, fraction)


_default_printer = ProgressPrinter()


def model_label(model: str | Path | None) -> str:
    """What a progress line calls a model: the embedded model's name where none is set, else the name as given
    (qwen2.5-coder-1.5b) or the file or folder name without .gguf."""
    if model is None or str(model) == "":
        return EMBEDDED_MODEL_NAME
    return Path(str(model)).name.removesuffix(".gguf") or str(model)


def progress_printer(model: str | Path | None, stream: IO[str] | None = None) -> ProgressPrinter:
    """A progress callback whose lines name the model being loaded (`print_progress` names the embedded one)."""
    return ProgressPrinter(stream, label=model_label(model))
