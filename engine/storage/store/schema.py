"""The store's tables and how a file comes up to date: `PRAGMA user_version` is the schema version, `MIGRATIONS`
bring an older file forward one step at a time, and full-text search over message text (FTS5) is added where SQLite
has it."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 3

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
    # A chat marked private is never indexed for the history drafter (engine/decoding/drafters/history.py).
    3: """
    ALTER TABLE chats ADD COLUMN private INTEGER NOT NULL DEFAULT 0;
    """,
}


def schema_version(con: sqlite3.Connection) -> int:
    return con.execute("PRAGMA user_version").fetchone()[0]


def migrate(con: sqlite3.Connection) -> None:
    """Bring the file up to `SCHEMA_VERSION`, one step per write transaction."""
    version = schema_version(con)
    while version < SCHEMA_VERSION:
        step = version + 1
        con.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            if schema_version(con) >= step:
                con.execute("COMMIT")
                version = schema_version(con)
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


def has_table(con: sqlite3.Connection, name: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


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


def ensure_fts(con: sqlite3.Connection, use_fts: bool) -> bool:
    """Full-text search over message text (FTS5, kept in sync by triggers) where SQLite has it; returns whether
    searches use it (a file that has the index keeps it, used or not)."""
    if has_table(con, "messages_fts"):
        return use_fts
    if not use_fts or not fts5_available():
        return False
    con.execute("BEGIN IMMEDIATE")
    try:
        if not has_table(con, "messages_fts"):
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
    return True
