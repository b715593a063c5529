"""The unsent prompt kept across quit: ctrl+q with text in the prompt (or a message still waiting for the model)
writes it to `prompt-draft.json` in the data folder, and the next start puts it back in the prompt.

One draft per data folder, the last window to quit wins. A folder that cannot be written loses nothing that is
on screen; the draft is only what a restart would otherwise throw away.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from engine.config import Settings, data_dir

DRAFT_NAME = "prompt-draft.json"


def draft_path(settings: Settings) -> Path:
    return data_dir(settings) / DRAFT_NAME


def save_draft(settings: Settings, text: str, chat_id: int | None) -> None:
    """Keep `text` for the next start (an empty one removes the kept draft). Never raises: the app is quitting."""
    path = draft_path(settings)
    with contextlib.suppress(OSError):
        if not text.strip():
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(
            json.dumps({"text": text, "chat_id": chat_id}, ensure_ascii=False), encoding="utf-8"
        )
        os.replace(partial, path)


def load_draft(settings: Settings) -> str | None:
    """The draft kept at the last quit, or None (none, or a file that is not one: left alone). A draft read is
    taken out of the file: it is in the prompt now, and the next quit keeps it again if it is still unsent (a
    window that ends without a quit, killed or crashed, no longer brings back a draft already sent)."""
    path = draft_path(settings)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = record.get("text") if isinstance(record, dict) else None
    if not (isinstance(text, str) and text.strip()):
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return text
