"""`specchat tune --apply`: write each task's winning K (and ramp decision) into the user's preset files.

Each `<config dir>/presets/<task>.toml` is edited in place (`set_toml_keys`: only the tuned keys and one
`# specchat tune ...` line change), the previous file kept as `<task>.toml.bak`; a file that would not load
afterwards is put back. Returns the diffs for the CLI to show.
"""

from __future__ import annotations

import difflib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from engine.benchmarks.tune.plan import TuneError
from engine.benchmarks.tune.results import TaskDecision

BACKUP_SUFFIX = ".bak"


@dataclass(frozen=True, slots=True)
class AppliedPreset:
    path: Path
    backup: Path | None
    diff: str


def set_toml_keys(text: str, values: dict[str, Any], comment: str) -> str:
    """`text` with top-level `key = value` lines set (replaced in place, or added before the first table) and
    one `# specchat tune ...` comment line kept current; every other line stays as it is."""
    lines = text.splitlines()
    lines = [line for line in lines if not line.startswith("# specchat tune")]
    first_table = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    for key, value in values.items():
        rendered = f"{key} = {_toml_value(value)}"
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for i in range(first_table):
            if pattern.match(lines[i]):
                lines[i] = rendered
                break
        else:
            lines.insert(first_table, rendered)
            first_table += 1
    return "\n".join([f"# specchat tune {comment}", *lines]) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return orjson.dumps(str(value)).decode()


def apply_results(decisions: dict[str, TaskDecision], folder: Path, comment: str) -> list[AppliedPreset]:
    """Write each task's winning K (and ramp decision) into `folder/<task>.toml`, backing up the old file.

    A file that would not load afterwards is put back and a PresetError raised (one line).
    """
    from engine.presets import PresetError, load_builtin_presets, load_user_preset

    builtins = load_builtin_presets()
    applied = []
    for task, decision in decisions.items():
        path = folder / f"{task}.toml"
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        new = set_toml_keys(old, decision.values(), comment)
        if new == old:
            continue
        backup = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                backup = path.with_name(path.name + BACKUP_SUFFIX)
                shutil.copy2(path, backup)
            path.write_text(new, encoding="utf-8")
        except OSError as exc:
            raise TuneError(f"cannot write {path}: {exc.strerror or exc}") from None
        try:
            load_user_preset(path, base=builtins.get(task))
        except PresetError:
            if backup is not None:
                shutil.copy2(backup, path)
            else:
                path.unlink(missing_ok=True)
            raise
        diff = "".join(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=f"{path} (before)" if old else "/dev/null",
                tofile=str(path),
            )
        )
        applied.append(AppliedPreset(path, backup, diff))
    return applied
