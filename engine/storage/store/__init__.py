"""The conversation store: chats and their messages in SQLite at `$data_dir/specchat.db`. Re-exports only.

- `conversations`: `Store`, the chats and messages written and read (a tree: a regenerated reply is a sibling).
- `database`: the file kept usable (WAL, locks waited for, a damaged file moved aside, a newer one read-only, a
  full disk or unwritable folder: on in memory), every fault said once in `notices`.
- `schema`: the tables, `SCHEMA_VERSION` and the `MIGRATIONS` that bring an older file forward, FTS5 search.
- `records`: `ChatRecord`, `MessageRecord`, `title_from`, `StoreError`; `export`: a conversation as JSON or Markdown.
"""

from engine.storage.store.conversations import Store
from engine.storage.store.database import DB_NAME, Database
from engine.storage.store.export import export_json, export_markdown
from engine.storage.store.records import ChatRecord, MessageRecord, StoreError, title_from
from engine.storage.store.schema import MIGRATIONS, SCHEMA_VERSION, fts5_available

__all__ = [
    "DB_NAME",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "ChatRecord",
    "Database",
    "MessageRecord",
    "Store",
    "StoreError",
    "export_json",
    "export_markdown",
    "fts5_available",
    "title_from",
]
