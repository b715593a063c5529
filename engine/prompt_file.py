"""JSON Lines prompt files (`{"prompt": ..., ...}` per line), read the same way by `generate`, `bench` and `tune`.

A leaf: stdlib and orjson. Errors are one line naming the file and line, for the caller's own error type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from engine.errors import UserError


class PromptFileError(UserError, ValueError):
    """A prompt file that cannot be used; the message is written for the user."""


def read_prompt_file(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; every object has a non-empty string "prompt"."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptFileError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PromptFileError(f"{path}: not UTF-8 text") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise PromptFileError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise PromptFileError(f"{path}:{number}: each line needs a non-empty string 'prompt' field")
        records.append((number, obj))
    if not records:
        raise PromptFileError(f"{path}: no prompts in the file")
    return records
