"""Scripting for the stand-in: what a folder's `standin.json` says, and a log of loads."""

from __future__ import annotations

import json
import os

LOAD_LOG: list[str] = []  # "<component> <model_dir>" of every model loaded, in order


def read_script(model_dir: str) -> dict:
    path = os.path.join(model_dir, "standin.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf8") as f:
        return json.load(f)
