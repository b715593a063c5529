"""Which specchat windows have a chat open: one lock file per window and chat, held with `flock`.

`$data_dir/open-chats/chat-<id>.<pid>.lock` is created and locked (exclusive, non-blocking) by the window that
opens (or starts) chat `<id>`. Another window asks `others(id)`: a file it cannot lock belongs to a live window;
one it can lock was left by a process that died (the kernel drops the lock with the process) and is removed.
Nothing is written to the database, and nothing here ever stops a chat: a folder that cannot be written (a full
disk, a read-only folder) only means the check says nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no presence check
    fcntl = None  # type: ignore[assignment]

FOLDER = "open-chats"


class ChatPresence:
    def __init__(self, data_dir: Path) -> None:
        self.folder = Path(data_dir) / FOLDER
        self.chat_id: int | None = None
        self._fd: int | None = None
        self._path: Path | None = None

    def _name(self, chat_id: int, pid: int) -> Path:
        return self.folder / f"chat-{chat_id}.{pid}.lock"

    def claim(self, chat_id: int | None) -> None:
        """This window now has `chat_id` open (None: none); the previous claim is let go."""
        if chat_id == self.chat_id:
            return
        self.release()
        self.chat_id = chat_id
        if chat_id is None or fcntl is None:
            return
        path = self._name(chat_id, os.getpid())
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._fd, self._path = fd, path

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)  # type: ignore[arg-type]
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = self._path = None
        self.chat_id = None

    def others(self, chat_id: int | None = None) -> int:
        """How many other live windows have `chat_id` (default: the claimed one) open."""
        chat_id = self.chat_id if chat_id is None else chat_id
        if chat_id is None or fcntl is None:
            return 0
        count = 0
        try:
            candidates = list(self.folder.glob(f"chat-{chat_id}.*.lock"))
        except OSError:
            return 0
        for path in candidates:
            if path == self._path:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                count += 1  # held: a live window
            else:
                with contextlib.suppress(OSError):
                    path.unlink()  # left by a window that died
            finally:
                os.close(fd)
        return count
