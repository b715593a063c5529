"""The conversation store: chats and their messages in SQLite at `$data_dir/specchat.db`.

A leaf: stdlib `sqlite3` and orjson, no torch, no UI. The session writes to it; the TUI and the CLI read it
through the session (or, for `specchat history`, directly).

- WAL journal, `synchronous=NORMAL`, foreign keys on, a busy timeout: two specchat processes can share a folder.
- `PRAGMA user_version` is the schema version; `MIGRATIONS` bring an older file forward, one step at a time.
  A file from a newer specchat is opened read-only (`Store.read_only`) and says so in `notices`.
- A file that is not a database (or is malformed) is moved aside as `specchat.db.corrupt-<time>`, never
  deleted or overwritten, and a new one is created.
- A folder that cannot be written, or a disk that fills up: one notice, and the store carries on in memory
  (a copy of what it had), so the chat goes on.
- Messages form a tree: `parent_id` links a reply to its user message and a user message to the reply before
  it, so a regenerated reply is a sibling of the old one instead of overwriting it. A chat's visible
  conversation is the path from its newest message up to the root.

Every public method is safe to call from any thread (one lock around one connection).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from engine.errors import UserError

T = TypeVar("T")

DB_NAME = "specchat.db"
SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 5000
# SQLite gives up without waiting in some lock races (two processes switching a new file to WAL at once, a
# reader upgrading to a writer): such "database is locked" errors are retried, with back-off, up to this long.
LOCKED_RETRY_S = 30.0
TITLE_CHARS = 60

# Forward migrations: MIGRATIONS[v] turns a version v-1 file into version v. Never edit a released step.
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        model TEXT,
        draft TEXT,
        system_prompt TEXT,
        preset_mode TEXT
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
        text TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        preset TEXT,
        k INTEGER,
        temperature REAL,
        stop_reason TEXT,
        error TEXT,
        stats TEXT
    );
    CREATE INDEX messages_by_chat ON messages(chat_id, id);
    CREATE INDEX messages_by_parent ON messages(parent_id);
    CREATE INDEX chats_by_updated ON chats(updated_at);
    """,
    # Which characters of a reply came from accepted drafts (engine.origins.encode_runs, JSON), so draft
    # colouring survives reopening a chat.
    2: """
    ALTER TABLE messages ADD COLUMN origins TEXT;
    """,
}

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


class StoreError(UserError):
    """A store failure whose message is written for the user (e.g. an unknown chat id)."""


@dataclass(frozen=True, slots=True)
class ChatRecord:
    id: int
    title: str
    created_at: float
    updated_at: float
    model: str | None
    draft: str | None
    system_prompt: str | None
    preset_mode: str | None
    message_count: int = 0


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: int
    chat_id: int
    parent_id: int | None
    role: str
    text: str
    created_at: float
    updated_at: float
    preset: str | None = None
    k: int | None = None
    temperature: float | None = None
    stop_reason: str | None = None  # None while streaming (or when the process died mid-reply)
    error: str | None = None
    stats: dict[str, Any] | None = field(default=None)
    origins: list[int] | None = field(default=None, repr=False)  # engine.origins.encode_runs of the text

    @property
    def interrupted(self) -> bool:
        """A reply that never finished: its process ended mid-stream."""
        return self.role == "assistant" and self.stop_reason is None


def title_from(text: str) -> str:
    """A chat title from its first message: the first non-empty line, spaces collapsed, cut at 60 chars."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(
        phrase in str(exc).lower()
        for phrase in ("database is locked", "database is busy", "database table is locked")
    )


def _retry_locked(action: Callable[[], T], deadline_s: float = LOCKED_RETRY_S) -> T:
    """`action()`, run again (with back-off) while another process holds the lock, until `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    pause = 0.02
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    return any(phrase in str(exc).lower() for phrase in _CORRUPT_PHRASES)


def _is_unwritable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, sqlite3.OperationalError) and any(
        phrase in str(exc).lower() for phrase in _UNWRITABLE_PHRASES
    )


def fts5_available() -> bool:
    try:
        con = sqlite3.connect(":memory:")
        try:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(a)")
        finally:
            con.close()
    except sqlite3.OperationalError:
        return False
    return True


class Store:
    """One SQLite conversation database. Build it with `Store.open(data_dir)`, which never raises for a bad
    file or folder: it falls back (read-only, in memory) and says why in `notices`."""

    def __init__(self, con: sqlite3.Connection, path: Path | None, *, read_only: bool = False) -> None:
        self._con = con
        self._lock = threading.RLock()
        self.path = path
        self.read_only = read_only
        self.in_memory = path is None
        self.notices: list[str] = []
        self.fts = False

    # --- opening ---------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: Path, *, use_fts: bool = True) -> Store:
        data_dir = Path(data_dir)
        path = data_dir / DB_NAME
        notices: list[str] = []
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            store = _retry_locked(lambda: cls._open_file(path, use_fts, notices))
        except (OSError, sqlite3.Error) as exc:
            if isinstance(exc, sqlite3.DatabaseError) and _is_corrupt(exc):
                raise  # _open_file handles corruption itself; anything left is a bug worth seeing
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            notices.append(
                f"cannot write the history in {data_dir} ({reason}): this chat is kept in memory only"
            )
            store = cls._memory(use_fts)
        store.notices[:0] = notices
        return store

    @classmethod
    def _memory(cls, use_fts: bool) -> Store:
        con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        store = cls(con, None)
        store._configure(memory=True)
        store._migrate()
        store._ensure_fts(use_fts)
        return store

    @classmethod
    def _open_file(cls, path: Path, use_fts: bool, notices: list[str]) -> Store:
        for attempt in range(2):
            con = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
            store = cls(con, path)
            try:
                store._configure()
                version = con.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    con.close()
                    return cls._open_read_only(path, version, notices)
                store._migrate()
                store._ensure_fts(use_fts)
                con.execute("SELECT count(*) FROM chats").fetchone()
                return store
            except sqlite3.DatabaseError as exc:
                con.close()
                if not _is_corrupt(exc) or attempt:
                    raise
                moved = cls._move_aside(path)
                notices.append(
                    f"the history database {path} was damaged: kept as {moved.name}, a new one was started"
                )
        raise AssertionError("unreachable")

    @classmethod
    def _open_read_only(cls, path: Path, version: int, notices: list[str]) -> Store:
        con = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        store = cls(con, path, read_only=True)
        store.fts = _has_table(con, "messages_fts")
        notices.append(
            f"{path} was written by a newer specchat (schema {version}, this one reads up to "
            f"{SCHEMA_VERSION}): history is read-only and new messages are not saved; upgrade specchat"
        )
        return store

    @staticmethod
    def _move_aside(path: Path) -> Path:
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

    def _configure(self, memory: bool = False) -> None:
        con = self._con
        con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        con.execute("PRAGMA foreign_keys = ON")
        if not memory:
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch to WAL (journal mode {mode})")
            con.execute("PRAGMA synchronous = NORMAL")

    def _migrate(self) -> None:
        con = self._con
        version = con.execute("PRAGMA user_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            step = version + 1
            con.execute("BEGIN IMMEDIATE")
            try:
                # Another process may have migrated while we waited for the write lock.
                if con.execute("PRAGMA user_version").fetchone()[0] >= step:
                    con.execute("COMMIT")
                    version = con.execute("PRAGMA user_version").fetchone()[0]
                    continue
                for statement in MIGRATIONS[step].split(";"):
                    if statement.strip():
                        con.execute(statement)
                con.execute(f"PRAGMA user_version = {step}")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            version = step

    def _ensure_fts(self, use_fts: bool) -> None:
        """Full-text search over message text (FTS5, kept in sync by triggers) where SQLite has it."""
        con = self._con
        if _has_table(con, "messages_fts"):
            self.fts = use_fts
            return
        if not use_fts or not fts5_available():
            return
        con.execute("BEGIN IMMEDIATE")
        try:
            if not _has_table(con, "messages_fts"):
                con.execute(
                    "CREATE VIRTUAL TABLE messages_fts USING fts5(text, content='messages', content_rowid='id')"
                )
                con.execute(
                    "CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN "
                    "INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text); END"
                )
                con.execute(
                    "CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN "
                    "INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text); END"
                )
                con.execute(
                    "CREATE TRIGGER messages_fts_au AFTER UPDATE OF text ON messages BEGIN "
                    "INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text); "
                    "INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text); END"
                )
                con.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self.fts = True

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._con.close()

    def take_notices(self) -> list[str]:
        """Messages for the user, each handed out once."""
        with self._lock:
            notices, self.notices = self.notices, []
        return notices

    # --- writing (falls back to memory when the disk refuses) -------------------------------------------------

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in one write transaction; a refused write moves the store to memory and runs it there."""
        with self._lock:
            if self.read_only:  # a newer schema: what was read stays, new writes live in memory
                self._fall_back_to_memory(None)
                return self._transaction(work)
            try:
                return _retry_locked(lambda: self._transaction(work))
            except (sqlite3.OperationalError, OSError) as exc:
                if not _is_unwritable(exc) or self.in_memory:
                    raise
                self._fall_back_to_memory(str(exc))
                return self._transaction(work)

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            result = work(con)
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            raise
        return result

    def _fall_back_to_memory(self, reason: str | None) -> None:
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            self._con.backup(memory)  # reading still works on a full disk: keep what was saved
        except sqlite3.Error:
            memory.close()
            memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        with contextlib.suppress(sqlite3.Error):
            self._con.close()
        self._con = memory
        self._configure(memory=True)
        self._migrate()
        self.fts = _has_table(memory, "messages_fts")
        self.in_memory = True
        self.read_only = False
        if reason is not None:
            self.notices.append(f"cannot save the history ({reason}): this chat goes on in memory only")

    def create_chat(
        self,
        title: str = "",
        *,
        model: str | None = None,
        draft: str | None = None,
        system_prompt: str | None = None,
        preset_mode: str | None = None,
    ) -> int:
        now = time.time()

        def work(con: sqlite3.Connection) -> int:
            cur = con.execute(
                "INSERT INTO chats (title, created_at, updated_at, model, draft, system_prompt, preset_mode) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (title, now, now, model, draft, system_prompt, preset_mode),
            )
            return int(cur.lastrowid or 0)

        return self._write(work)

    # Chat fields that change while a chat goes on (the settings dialog: another model, draft or system prompt).
    CHAT_SETTINGS = ("model", "draft", "system_prompt", "preset_mode")

    def update_chat(self, chat_id: int, **values: str | None) -> None:
        """Record a chat's new model, draft, system prompt or preset mode (only the fields given)."""
        unknown = set(values) - set(self.CHAT_SETTINGS)
        if unknown:
            raise ValueError(f"not a chat setting: {', '.join(sorted(unknown))}")
        if not values:
            return
        assignments = ", ".join(f"{name} = ?" for name in values)
        self._write(
            lambda con: con.execute(
                f"UPDATE chats SET {assignments} WHERE id = ?",  # column names come from CHAT_SETTINGS
                (*values.values(), chat_id),
            )
        )

    def add_message(
        self,
        chat_id: int,
        role: str,
        text: str,
        *,
        parent_id: int | None = None,
        preset: str | None = None,
        k: int | None = None,
        temperature: float | None = None,
        stop_reason: str | None = None,
        stats: dict[str, Any] | None = None,
    ) -> int:
        now = time.time()

        def work(con: sqlite3.Connection) -> int:
            cur = con.execute(
                "INSERT INTO messages (chat_id, parent_id, role, text, created_at, updated_at, preset, k, "
                "temperature, stop_reason, stats) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    chat_id,
                    parent_id,
                    role,
                    text,
                    now,
                    now,
                    preset,
                    k,
                    temperature,
                    stop_reason,
                    orjson.dumps(stats).decode() if stats is not None else None,
                ),
            )
            con.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
            return int(cur.lastrowid or 0)

        return self._write(work)

    def update_message(
        self,
        message_id: int,
        text: str,
        *,
        stop_reason: str | None = None,
        error: str | None = None,
        stats: dict[str, Any] | None = None,
        origins: list[int] | None = None,
    ) -> None:
        """Rewrite a reply's text (streaming); with `stop_reason` it is final (stats, error, origins too)."""
        now = time.time()

        def work(con: sqlite3.Connection) -> None:
            if stop_reason is None:
                con.execute(
                    "UPDATE messages SET text = ?, updated_at = ? WHERE id = ?", (text, now, message_id)
                )
            else:
                con.execute(
                    "UPDATE messages SET text = ?, updated_at = ?, stop_reason = ?, error = ?, stats = ?, "
                    "origins = ? WHERE id = ?",
                    (
                        text,
                        now,
                        stop_reason,
                        error,
                        orjson.dumps(stats).decode() if stats is not None else None,
                        orjson.dumps(origins).decode() if origins else None,
                        message_id,
                    ),
                )
            con.execute(
                "UPDATE chats SET updated_at = ? WHERE id = (SELECT chat_id FROM messages WHERE id = ?)",
                (now, message_id),
            )

        self._write(work)

    def delete_message(self, message_id: int) -> None:
        self._write(lambda con: con.execute("DELETE FROM messages WHERE id = ?", (message_id,)))

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.chat(chat_id)
        title = " ".join(title.split())
        if not title:
            raise StoreError("a chat title cannot be empty")
        self._check_writable()
        self._write(lambda con: con.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id)))

    def delete_chat(self, chat_id: int) -> None:
        self.chat(chat_id)
        self._check_writable()
        self._write(lambda con: con.execute("DELETE FROM chats WHERE id = ?", (chat_id,)))

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.path} is from a newer specchat and is read-only here")

    # --- reading ---------------------------------------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._con.execute(sql, params)
            cur.row_factory = sqlite3.Row  # type: ignore[assignment]
            return cur.fetchall()

    _CHAT_COLUMNS = (
        "c.id, c.title, c.created_at, c.updated_at, c.model, c.draft, c.system_prompt, c.preset_mode, "
        "(SELECT count(*) FROM messages m WHERE m.chat_id = c.id) AS message_count"
    )

    def chats(self, search: str = "", limit: int | None = None) -> list[ChatRecord]:
        """Chats, most recently updated first; `search` matches titles and message text."""
        where, params = "", ()
        search = search.strip()
        if search:
            if self.fts and any(ch.isalnum() for ch in search):
                # A phrase whose last word may be unfinished: search as you type finds "mill" in "million".
                phrase = '"' + search.replace('"', '""') + '"*'
                where = (
                    "WHERE c.title LIKE ? ESCAPE '\\' OR c.id IN (SELECT m.chat_id FROM messages m "
                    "WHERE m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?))"
                )
                params = (_like(search), phrase)
            else:
                where = (
                    "WHERE c.title LIKE ? ESCAPE '\\' OR c.id IN "
                    "(SELECT m.chat_id FROM messages m WHERE m.text LIKE ? ESCAPE '\\')"
                )
                params = (_like(search), _like(search))
        sql = f"SELECT {self._CHAT_COLUMNS} FROM chats c {where} ORDER BY c.updated_at DESC, c.id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [ChatRecord(**dict(row)) for row in self._query(sql, params)]

    def chat(self, chat_id: int) -> ChatRecord:
        rows = self._query(f"SELECT {self._CHAT_COLUMNS} FROM chats c WHERE c.id = ?", (chat_id,))
        if not rows:
            raise StoreError(f"no chat with id {chat_id} (see: specchat history list)")
        return ChatRecord(**dict(rows[0]))

    def last_chat_id(self) -> int | None:
        chats = self.chats(limit=1)
        return chats[0].id if chats else None

    def messages(self, chat_id: int) -> list[MessageRecord]:
        """Every message of a chat, every branch, oldest first."""
        rows = self._query("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [_message(row) for row in rows]

    def conversation(self, chat_id: int, leaf_id: int | None = None) -> list[MessageRecord]:
        """The visible conversation: the path from `leaf_id` (default: the newest message) to the root."""
        self.chat(chat_id)
        by_id = {m.id: m for m in self.messages(chat_id)}
        if not by_id:
            return []
        node = by_id.get(leaf_id) if leaf_id is not None else by_id[max(by_id)]
        path: list[MessageRecord] = []
        while node is not None:
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        return path[::-1]

    def newest_path_from(self, message_id: int) -> list[MessageRecord]:
        """`message_id` and the conversation under it down to its newest descendant, oldest first: what a branch
        shows when it is paged to (the path it was last continued on)."""
        rows = self._query("SELECT chat_id FROM messages WHERE id = ?", (message_id,))
        if not rows:
            return []
        by_id = {m.id: m for m in self.messages(rows[0]["chat_id"])}
        children: dict[int, list[int]] = {}
        for m in by_id.values():
            if m.parent_id is not None:
                children.setdefault(m.parent_id, []).append(m.id)
        # The newest message under `message_id` (itself when it has none): its path up to it is the branch.
        newest, stack = message_id, [message_id]
        while stack:
            node = stack.pop()
            newest = max(newest, node)
            stack.extend(children.get(node, ()))
        path: list[MessageRecord] = []
        node_id: int | None = newest
        while node_id is not None:
            path.append(by_id[node_id])
            if node_id == message_id:
                break
            node_id = by_id[node_id].parent_id
        return path[::-1]

    def user_messages(self, limit: int = 200) -> list[str]:
        """The text of the user's own messages, newest first, each text once (`specchat tune --from-history`)."""
        rows = self._query(
            "SELECT text FROM messages WHERE role = 'user' AND trim(text) != '' "
            "GROUP BY text ORDER BY max(id) DESC LIMIT ?",
            (int(limit),),
        )
        return [row["text"] for row in rows]

    def siblings(self, message_id: int) -> list[MessageRecord]:
        """A message and its alternatives (same parent and role), oldest first: regenerated variants."""
        rows = self._query("SELECT * FROM messages WHERE id = ?", (message_id,))
        if not rows:
            return []
        me = _message(rows[0])
        if me.parent_id is None:
            rows = self._query(
                "SELECT * FROM messages WHERE chat_id = ? AND parent_id IS NULL AND role = ? ORDER BY id",
                (me.chat_id, me.role),
            )
        else:
            rows = self._query(
                "SELECT * FROM messages WHERE parent_id = ? AND role = ? ORDER BY id", (me.parent_id, me.role)
            )
        return [_message(row) for row in rows]


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _has_table(con: sqlite3.Connection, name: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def _message(row: sqlite3.Row) -> MessageRecord:
    data = dict(row)
    stats = data.pop("stats")
    origins = data.pop("origins", None)
    try:
        runs = orjson.loads(origins) if origins else None
    except orjson.JSONDecodeError:
        runs = None  # only colouring is lost
    return MessageRecord(
        **data, stats=orjson.loads(stats) if stats else None, origins=runs if isinstance(runs, list) else None
    )


# --- export ------------------------------------------------------------------------------------------------


def export_json(chat: ChatRecord, messages: list[MessageRecord]) -> bytes:
    from dataclasses import asdict

    # Origins are the app's colouring data, not part of the conversation.
    record = {
        "chat": asdict(chat),
        "messages": [{k: v for k, v in asdict(m).items() if k != "origins"} for m in messages],
    }
    return orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n"


def export_markdown(chat: ChatRecord, messages: list[MessageRecord], stats_line=None) -> str:
    """The conversation as Markdown; `stats_line(stats_dict, message)` adds a line under each reply."""
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.created_at))
    lines = [
        f"# {chat.title or 'Untitled chat'}",
        "",
        f"*chat {chat.id} · {created} · {chat.model or ''}*",
        "",
    ]
    for message in messages:
        lines.append(f"## {'You' if message.role == 'user' else message.role.capitalize()}")
        lines.append("")
        lines.append(message.text)
        lines.append("")
        if message.role == "assistant" and stats_line is not None:
            line = stats_line(message)
            if line:
                lines += [f"*{line}*", ""]
    return "\n".join(lines)
