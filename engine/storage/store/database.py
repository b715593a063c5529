"""The store's SQLite file, kept usable whatever happens to it (`Database`).

- WAL journal, `synchronous=NORMAL`, foreign keys on, a busy timeout: two specchat processes can share a folder;
  a lock SQLite does not wait for is waited for here (`retry_locked`).
- A file from a newer specchat is opened read-only and says so in `notices`.
- A file that is not a database (or is malformed) is moved aside as `specchat.db.corrupt-<time>`, never
  deleted or overwritten, and a new one is created.
- A folder that cannot be written, or a disk that fills up: one notice, and the database carries on in memory
  (a copy of what it had), so the chat goes on.

Every method is safe to call from any thread (one lock around one connection).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import engine.storage.store.schema as schema
from engine.storage.store.records import StoreError

T = TypeVar("T")

DB_NAME = "specchat.db"
BUSY_TIMEOUT_MS = 5000
# SQLite gives up without waiting in some lock races (two processes switching a new file to WAL at once, a
# reader upgrading to a writer): such "database is locked" errors are retried, with back-off, up to this long.
LOCKED_RETRY_S = 30.0

# Errors that mean "this file is not a usable database" (as opposed to locked, or a full disk).
_CORRUPT_PHRASES = ("file is not a database", "database disk image is malformed", "file is encrypted")
# Errors that mean "cannot write here": the store carries on in memory.
_UNWRITABLE_PHRASES = (
    "database or disk is full",
    "attempt to write a readonly database",
    "disk i/o error",
    "unable to open database file",
    "readonly database",
)


def is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(
        phrase in str(exc).lower()
        for phrase in ("database is locked", "database is busy", "database table is locked")
    )


def retry_locked(action: Callable[[], T], deadline_s: float = LOCKED_RETRY_S) -> T:
    """`action()`, run again (with back-off) while another process holds the lock, until `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    pause = 0.02
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    return any(phrase in str(exc).lower() for phrase in _CORRUPT_PHRASES)


def is_unwritable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, sqlite3.OperationalError) and any(
        phrase in str(exc).lower() for phrase in _UNWRITABLE_PHRASES
    )


def move_aside(path: Path) -> Path:
    """A damaged file (and its -wal and -shm) renamed `<name>.corrupt-<time>`, never over an earlier one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # never overwrite an earlier one
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


class Database:
    """One SQLite connection to the store's file (or, when the file cannot be used, to memory). Build it with
    `Database.open(data_dir)`, which never raises for a bad file or folder: it falls back (read-only, in memory)
    and says why in `notices`."""

    def __init__(self, con: sqlite3.Connection, path: Path | None, *, read_only: bool = False) -> None:
        self.con = con
        self.lock = threading.RLock()
        self.path = path
        self.read_only = read_only
        self.in_memory = path is None
        self.notices: list[str] = []
        self.fts = False

    # --- opening ---------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: Path, *, use_fts: bool = True) -> Database:
        data_dir = Path(data_dir)
        path = data_dir / DB_NAME
        notices: list[str] = []
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            database = retry_locked(lambda: cls._open_file(path, use_fts, notices))
        except (OSError, sqlite3.Error) as exc:
            if isinstance(exc, sqlite3.DatabaseError) and is_corrupt(exc):
                raise  # _open_file handles corruption itself; anything left is a bug worth seeing
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            notices.append(
                f"cannot write the history in {data_dir} ({reason}): this chat is kept in memory only"
            )
            database = cls._memory(use_fts)
        database.notices[:0] = notices
        return database

    @classmethod
    def _memory(cls, use_fts: bool) -> Database:
        con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        database = cls(con, None)
        database._configure(memory=True)
        schema.migrate(con)
        database.fts = schema.ensure_fts(con, use_fts)
        return database

    @classmethod
    def _open_file(cls, path: Path, use_fts: bool, notices: list[str]) -> Database:
        for attempt in range(2):
            con = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
            database = cls(con, path)
            try:
                database._configure()
                version = schema.schema_version(con)
                if version > schema.SCHEMA_VERSION:
                    con.close()
                    return cls._open_read_only(path, version, notices)
                schema.migrate(con)
                database.fts = schema.ensure_fts(con, use_fts)
                con.execute("SELECT count(*) FROM chats").fetchone()
                return database
            except sqlite3.DatabaseError as exc:
                con.close()
                if not is_corrupt(exc) or attempt:
                    raise
                moved = move_aside(path)
                notices.append(
                    f"the history database {path} was damaged: kept as {moved.name}, a new one was started"
                )
        raise AssertionError("unreachable")

    @classmethod
    def _open_read_only(cls, path: Path, version: int, notices: list[str]) -> Database:
        con = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        database = cls(con, path, read_only=True)
        database.fts = schema.has_table(con, "messages_fts")
        notices.append(
            f"{path} was written by a newer specchat (schema {version}, this one reads up to "
            f"{schema.SCHEMA_VERSION}): history is read-only and new messages are not saved; upgrade specchat"
        )
        return database

    def _configure(self, memory: bool = False) -> None:
        con = self.con
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        con.execute("PRAGMA foreign_keys = ON")
        if not memory:
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch to WAL (journal mode {mode})")
            con.execute("PRAGMA synchronous = NORMAL")

    def close(self) -> None:
        with self.lock, contextlib.suppress(sqlite3.Error):
            self.con.close()

    def take_notices(self) -> list[str]:
        """Messages for the user, each handed out once."""
        with self.lock:
            notices, self.notices = self.notices, []
        return notices

    # --- writing (falls back to memory when the disk refuses) -------------------------------------------------

    def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in one write transaction; a refused write moves the store to memory and runs it there."""
        with self.lock:
            if self.read_only:  # a newer schema: what was read stays, new writes live in memory
                self.fall_back_to_memory(None)
                return self._transaction(work)
            try:
                return retry_locked(lambda: self._transaction(work))
            except (sqlite3.OperationalError, OSError) as exc:
                if not is_unwritable(exc) or self.in_memory:
                    raise
                self.fall_back_to_memory(str(exc))
                return self._transaction(work)

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        con = self.con
        con.execute("BEGIN IMMEDIATE")
        try:
            result = work(con)
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            raise
        return result

    def fall_back_to_memory(self, reason: str | None) -> None:
        """Go on in memory with a copy of what the file held; `reason` (None: say nothing) becomes a notice."""
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            self.con.backup(memory)  # reading still works on a full disk: keep what was saved
        except sqlite3.Error:
            memory.close()
            memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        with contextlib.suppress(sqlite3.Error):
            self.con.close()
        self.con = memory
        self._configure(memory=True)
        schema.migrate(memory)
        self.fts = schema.has_table(memory, "messages_fts")
        self.in_memory = True
        self.read_only = False
        if reason is not None:
            self.notices.append(f"cannot save the history ({reason}): this chat goes on in memory only")

    def check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.path} is from a newer specchat and is read-only here")

    # --- reading ---------------------------------------------------------------------------------------------

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self.lock:
            cur = self.con.execute(sql, params)
            cur.row_factory = sqlite3.Row  # type: ignore[assignment]
            return cur.fetchall()
