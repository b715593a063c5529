"""Copying to the clipboard, honestly.

Textual's `copy_to_clipboard` writes an OSC 52 sequence to the terminal, and no terminal answers it: whether the
text arrived is unknowable (tmux without `set-clipboard on`, macOS Terminal and many others drop it silently). So
where the system has a clipboard tool (wl-copy, xclip, xsel, pbcopy) the text goes there too, and the toast says
which path took it; otherwise the toast says the text was only offered to the terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess

# (command, the environment variable that says its clipboard is there); the first that runs and succeeds wins.
TOOLS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("wl-copy",), "WAYLAND_DISPLAY"),
    (("xclip", "-selection", "clipboard"), "DISPLAY"),
    (("xsel", "--clipboard", "--input"), "DISPLAY"),
    (("pbcopy",), None),
)
TOOL_TIMEOUT_S = 2.0


def system_copy(text: str, environ: dict[str, str] | None = None) -> str | None:
    """Put `text` on the system clipboard with the first tool that works here; its name, or None."""
    environ = dict(os.environ) if environ is None else environ
    for command, needs in TOOLS:
        if needs is not None and not environ.get(needs):
            continue
        if shutil.which(command[0], path=environ.get("PATH")) is None:
            continue
        try:
            done = subprocess.run(
                command, input=text.encode("utf-8"), capture_output=True, timeout=TOOL_TIMEOUT_S, env=environ
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return command[0]
    return None


def copy_text(app, text: str, what: str) -> str:
    """Copy `text` (OSC 52 to the terminal, and the system clipboard where a tool is there); the toast's line."""
    app.copy_to_clipboard(text)
    tool = system_copy(text)
    if tool is not None:
        return f"Copied {what} (system clipboard, {tool})."
    return (
        f"Sent {what} to the terminal's clipboard (OSC 52): a terminal that does not take it copies nothing "
        "(tmux: set -g set-clipboard on)."
    )
