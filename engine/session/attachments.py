"""Text files attached to a message (code chat): each becomes a fenced block headed by its name.

`/attach PATH [PATH ...]` in the prompt (or the attach key's file picker) puts the blocks in the prompt, where
the user writes the question under them; nothing is sent until they press enter. A file that is missing, a
folder, binary or too large is refused with one line that says which and why.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from engine.errors import UserError

MAX_ATTACH_BYTES = 256 * 1024  # a text file bigger than this would not fit a small model's context anyway
COMMAND = "/attach"

# Fence languages for the common suffixes (the rest get a plain fence).
LANGUAGES = {
    ".py": "python",
    ".rs": "rust",
    ".go": "go",
    ".js": "javascript",
    ".ts": "typescript",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
    ".sh": "bash",
    ".toml": "toml",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".md": "markdown",
    ".sql": "sql",
    ".html": "html",
    ".css": "css",
}


class AttachmentError(UserError):
    """A file that cannot be attached; the message names it and says why."""


def read_attachment(path: str | Path) -> str:
    """The text of `path`, or AttachmentError: missing, a folder, unreadable, binary or over MAX_ATTACH_BYTES."""
    shown = str(path)
    file = Path(path).expanduser()
    if not file.exists():
        raise AttachmentError(f"cannot attach {shown}: no such file")
    if file.is_dir():
        raise AttachmentError(f"cannot attach {shown}: it is a folder (attach the files in it)")
    try:
        size = file.stat().st_size
        if size > MAX_ATTACH_BYTES:
            raise AttachmentError(
                f"cannot attach {shown}: {size // 1024} KiB is over the {MAX_ATTACH_BYTES // 1024} KiB limit"
            )
        data = file.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"cannot attach {shown}: {exc.strerror or exc}") from exc
    if b"\0" in data:
        raise AttachmentError(f"cannot attach {shown}: it is a binary file, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AttachmentError(f"cannot attach {shown}: it is not UTF-8 text") from None


def attachment_block(path: str | Path) -> str:
    """`path` as a fenced block headed by its name (a fence longer than any inside the file)."""
    text = read_attachment(path).rstrip("\n")
    fence = "```"
    while fence in text:
        fence += "`"
    language = LANGUAGES.get(Path(path).suffix.lower(), "")
    return f"`{Path(path).name}`:\n\n{fence}{language}\n{text}\n{fence}"


def parse_attach(text: str) -> list[str] | None:
    """The paths of a prompt whose first line is `/attach PATH ...` (quotes for spaces), else None."""
    first = text.lstrip().split("\n", 1)[0]
    if first != COMMAND and not first.startswith(COMMAND + " "):
        return None
    try:
        return shlex.split(first[len(COMMAND) :])
    except ValueError:  # an unclosed quote: the whole rest as one path
        return [first[len(COMMAND) :].strip()]


def expand_attach(text: str) -> str:
    """The prompt with its `/attach` line replaced by the files' blocks (the rest of the prompt kept under them).

    AttachmentError (the first file that cannot be attached) leaves nothing changed; no paths is an error too."""
    paths = parse_attach(text)
    if paths is None:
        return text
    if not paths:
        raise AttachmentError("/attach needs a file: /attach PATH [PATH ...]")
    blocks = [attachment_block(p) for p in paths]
    rest = text.lstrip().split("\n", 1)[1] if "\n" in text.lstrip() else ""
    return "\n\n".join(blocks) + "\n\n" + rest.lstrip("\n")
