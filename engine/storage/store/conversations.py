"""The conversations (`Store`): chats and their messages, written and read, in SQLite at `$data_dir/specchat.db`.

A leaf: stdlib `sqlite3` and orjson, no torch, no UI. The session writes to it; the TUI and the CLI read it
through the session (or, for `specchat history`, directly). The file itself, and what happens when it cannot be
used (locked, damaged, from a newer specchat, a full disk), is `database.Database`'s; the tables and their
migrations are `schema`'s.

Messages form a tree: `parent_id` links a reply to its user message and a user message to the reply before
it, so a regenerated reply is a sibling of the old one instead of overwriting it. A chat's visible
conversation is the path from its newest message up to the root.

Every public method is safe to call from any thread (one lock around one connection).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from engine.storage.store.database import Database
from engine.storage.store.records import (
    ChatRecord,
    MessageRecord,
    StoreError,
    chat_from_row,
    message_from_row,
)


class Store:
    """One SQLite conversation database. Build it with `Store.open(data_dir)`, which never raises for a bad
    file or folder: it falls back (read-only, in memory) and says why in `notices`."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @classmethod
    def open(cls, data_dir: Path, *, use_fts: bool = True) -> Store:
        return cls(Database.open(data_dir, use_fts=use_fts))

    # What the database found: where it is, whether it went read-only or to memory, whether search uses FTS5.
    @property
    def path(self) -> Path | None:
        return self.database.path

    @property
    def read_only(self) -> bool:
        return self.database.read_only

    @property
    def in_memory(self) -> bool:
        return self.database.in_memory

    @property
    def fts(self) -> bool:
        return self.database.fts

    def close(self) -> None:
        self.database.close()

    def take_notices(self) -> list[str]:
        """Messages for the user, each handed out once."""
        return self.database.take_notices()

    # --- writing (falls back to memory when the disk refuses) -------------------------------------------------

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

        return self.database.write(work)

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
        self.database.write(
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

        return self.database.write(work)

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

        self.database.write(work)

    def delete_message(self, message_id: int) -> None:
        self.database.write(lambda con: con.execute("DELETE FROM messages WHERE id = ?", (message_id,)))

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.chat(chat_id)
        title = " ".join(title.split())
        if not title:
            raise StoreError("a chat title cannot be empty")
        self.database.check_writable()
        self.database.write(
            lambda con: con.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))
        )

    def set_private(self, chat_id: int, private: bool) -> None:
        """Mark a chat private (never indexed for the history drafter) or not."""
        self.chat(chat_id)
        self.database.write(
            lambda con: con.execute("UPDATE chats SET private = ? WHERE id = ?", (int(private), chat_id))
        )

    def delete_chat(self, chat_id: int) -> None:
        self.chat(chat_id)
        self.database.check_writable()
        self.database.write(lambda con: con.execute("DELETE FROM chats WHERE id = ?", (chat_id,)))

    # --- reading ---------------------------------------------------------------------------------------------

    _CHAT_COLUMNS = (
        "c.id, c.title, c.created_at, c.updated_at, c.model, c.draft, c.system_prompt, c.preset_mode, c.private, "
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
        return [chat_from_row(row) for row in self.database.query(sql, params)]

    def chat(self, chat_id: int) -> ChatRecord:
        rows = self.database.query(f"SELECT {self._CHAT_COLUMNS} FROM chats c WHERE c.id = ?", (chat_id,))
        if not rows:
            raise StoreError(f"no chat with id {chat_id} (see: specchat history list)")
        return chat_from_row(rows[0])

    def last_chat_id(self) -> int | None:
        chats = self.chats(limit=1)
        return chats[0].id if chats else None

    def messages(self, chat_id: int) -> list[MessageRecord]:
        """Every message of a chat, every branch, oldest first."""
        rows = self.database.query("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [message_from_row(row) for row in rows]

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
        rows = self.database.query("SELECT chat_id FROM messages WHERE id = ?", (message_id,))
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
        rows = self.database.query(
            "SELECT text FROM messages WHERE role = 'user' AND trim(text) != '' "
            "GROUP BY text ORDER BY max(id) DESC LIMIT ?",
            (int(limit),),
        )
        return [row["text"] for row in rows]

    # --- the history drafter's corpus (engine/session/history.py hands it to the engine) --------------------------

    def past_key(self, exclude_chat: int | None) -> str | None:
        """What `past_texts(exclude_chat)` would read now, as a key that changes with it (a message added, edited
        or deleted, a chat marked private); None where there is nothing to read. One cheap query."""
        # The messages through their (chat_id, id) index and the chats' last change: no message text is read.
        row = self.database.query(
            "SELECT count(*) AS n, total(m.id) AS ids, (SELECT max(updated_at) FROM chats "
            "WHERE private = 0 AND id IS NOT ?1) AS changed FROM messages m JOIN chats c ON c.id = m.chat_id "
            "WHERE c.private = 0 AND m.chat_id IS NOT ?1",
            (exclude_chat,),
        )[0]
        if not row["n"]:
            return None
        digest = hashlib.sha1(f"{row['n']}:{row['ids']}:{row['changed']}".encode()).hexdigest()[:16]
        return f"past:{exclude_chat}:{digest}"

    def past_texts(self, exclude_chat: int | None) -> Iterator[str]:
        """The text of every message of the chats not marked private (`exclude_chat` left out), the most recently
        updated chat first, each chat's messages oldest first; read chat by chat, as the reader asks for more."""
        rows = self.database.query(
            "SELECT id FROM chats WHERE private = 0 AND id IS NOT ? ORDER BY updated_at DESC, id DESC",
            (exclude_chat,),
        )
        for chat in rows:
            for row in self.database.query(
                "SELECT text FROM messages WHERE chat_id = ? ORDER BY id", (chat["id"],)
            ):
                yield row["text"]

    def siblings(self, message_id: int) -> list[MessageRecord]:
        """A message and its alternatives (same parent and role), oldest first: regenerated variants."""
        rows = self.database.query("SELECT * FROM messages WHERE id = ?", (message_id,))
        if not rows:
            return []
        me = message_from_row(rows[0])
        if me.parent_id is None:
            rows = self.database.query(
                "SELECT * FROM messages WHERE chat_id = ? AND parent_id IS NULL AND role = ? ORDER BY id",
                (me.chat_id, me.role),
            )
        else:
            rows = self.database.query(
                "SELECT * FROM messages WHERE parent_id = ? AND role = ? ORDER BY id", (me.parent_id, me.role)
            )
        return [message_from_row(row) for row in rows]


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
