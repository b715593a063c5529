"""The conversation store on a real SQLite file: schema, branching, search, and every fault the issue names."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from engine.storage.store import (
    DB_NAME,
    SCHEMA_VERSION,
    Store,
    StoreError,
    database,
    export_json,
    export_markdown,
    schema,
    title_from,
)


def make_chat(
    store: Store, first: str = "What is WAL?", reply: str = "Write-ahead logging."
) -> tuple[int, int, int]:
    chat = store.create_chat(title_from(first), model="m")
    user = store.add_message(chat, "user", first)
    answer = store.add_message(
        chat, "assistant", reply, parent_id=user, stop_reason="eos", stats={"new_tokens": 3}
    )
    return chat, user, answer


def raw_rows(path: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_pragmas_and_schema_version(tmp_path: Path):
    store = Store.open(tmp_path)
    con = store.database.con
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert con.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert con.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    assert raw_rows(tmp_path / DB_NAME, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert store.take_notices() == []


def test_forward_migration_keeps_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = Store.open(tmp_path)
    chat, _, _ = make_chat(store)
    store.close()
    # A release that adds a column: the old file is brought forward and keeps its chats.
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(
        schema.MIGRATIONS,
        SCHEMA_VERSION + 1,
        "ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
    )
    upgraded = Store.open(tmp_path)
    assert raw_rows(tmp_path / DB_NAME, "PRAGMA user_version") == [(SCHEMA_VERSION + 1,)]
    assert raw_rows(tmp_path / DB_NAME, "SELECT id, pinned FROM chats") == [(chat, 0)]
    assert [m.text for m in upgraded.conversation(chat)] == ["What is WAL?", "Write-ahead logging."]


def test_regenerated_replies_branch_instead_of_overwriting(tmp_path: Path):
    store = Store.open(tmp_path)
    chat, user, first = make_chat(store)
    second = store.add_message(chat, "assistant", "Another answer.", parent_id=user, stop_reason="eos")
    assert [m.text for m in store.conversation(chat)] == ["What is WAL?", "Another answer."]
    assert [m.id for m in store.siblings(second)] == [first, second]
    # Continuing from the older variant makes that branch the visible one.
    follow = store.add_message(chat, "user", "Thanks", parent_id=first)
    assert [m.id for m in store.conversation(chat)] == [user, first, follow]
    assert [m.id for m in store.conversation(chat, leaf_id=second)] == [user, second]


def test_deleting_a_chat_deletes_its_messages(tmp_path: Path):
    store = Store.open(tmp_path)
    chat, _, _ = make_chat(store)
    other, _, _ = make_chat(store, "Second chat")
    store.delete_chat(chat)
    assert raw_rows(tmp_path / DB_NAME, "SELECT DISTINCT chat_id FROM messages") == [(other,)]
    with pytest.raises(StoreError, match=f"no chat with id {chat}"):
        store.chat(chat)
    with pytest.raises(StoreError):
        store.delete_chat(9999)


@pytest.mark.parametrize("use_fts", [True, False], ids=["fts5", "like"])
def test_search_titles_and_text_newest_first(tmp_path: Path, use_fts: bool):
    store = Store.open(tmp_path, use_fts=use_fts)
    assert store.fts is use_fts
    old, _, _ = make_chat(store, "Tell me about sqlite", "It is a library; 100% in-process.")
    new, _, _ = make_chat(store, "Poem about the sea", "Waves and sqlite dreams.")
    make_chat(store, "Unrelated", "Nothing here.")
    assert [c.id for c in store.chats("sqlite")] == [new, old]  # title of one, reply text of the other
    assert [c.id for c in store.chats("Waves")] == [new]
    assert [c.id for c in store.chats("Wav")] == [new]  # as you type
    assert [c.id for c in store.chats("and sqlite dre")] == [new]
    assert store.chats('"') == [] and store.chats("*") == []
    assert [c.id for c in store.chats("100%")] == [old]  # LIKE wildcards are literal
    assert store.chats("absent-word") == []
    store.rename_chat(new, "Sea verses")
    assert store.chat(new).title == "Sea verses"
    # Text written while streaming is searchable (the FTS index follows updates).
    chat = store.create_chat("t")
    reply = store.add_message(chat, "assistant", "")
    store.update_message(reply, "zebra crossing")
    assert [c.id for c in store.chats("zebra")] == [chat]


def test_title_from_first_message():
    assert title_from("\n  How do   I  sort a list?\nmore") == "How do I sort a list?"
    long = title_from("word " * 40)
    assert len(long) <= 60 and long.endswith("…")


def test_a_title_names_attached_files_after_the_message_own_line(tmp_path: Path):
    from engine.session.attachments import expand_attach

    (tmp_path / "add.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "notes.md").write_text("```\nnested fence\n```\n")
    asked = expand_attach(f"/attach {tmp_path / 'add.py'} {tmp_path / 'notes.md'}\nAdd type hints to this.")
    assert asked.startswith("`add.py`:")  # the message starts with the file, not the question
    assert title_from(asked) == "Add type hints to this. (add.py, notes.md)"
    assert title_from(expand_attach(f"/attach {tmp_path / 'add.py'}")) == "add.py"
    assert title_from("```python\nprint(1)\n```\nWhy does this print 1?") == "Why does this print 1?"
    assert title_from("```python\nprint(1)\n```") == "```python"  # only code: its first line, as before


def test_corrupt_file_is_moved_aside_and_a_new_one_created(tmp_path: Path):
    garbage = b"this is not a database at all\n" * 200
    (tmp_path / DB_NAME).write_bytes(garbage)
    store = Store.open(tmp_path)
    kept = list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == garbage  # never overwritten or deleted
    notices = store.take_notices()
    assert len(notices) == 1 and "damaged" in notices[0] and kept[0].name in notices[0]
    assert store.take_notices() == []  # told once
    chat, _, _ = make_chat(store)
    assert not store.in_memory and raw_rows(tmp_path / DB_NAME, "SELECT id FROM chats") == [(chat,)]
    # A second damaged file the same second does not overwrite the first one kept.
    store.close()
    (tmp_path / DB_NAME).write_bytes(b"broken again" * 100)
    for side in ("-wal", "-shm"):
        (tmp_path / (DB_NAME + side)).unlink(missing_ok=True)
    Store.open(tmp_path)
    assert len(list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))) == 2
    assert kept[0].read_bytes() == garbage


def test_newer_schema_opens_read_only(tmp_path: Path):
    store = Store.open(tmp_path)
    chat, _, _ = make_chat(store)
    store.close()
    con = sqlite3.connect(tmp_path / DB_NAME)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    con.close()
    before = (tmp_path / DB_NAME).read_bytes()
    newer = Store.open(tmp_path)
    assert newer.read_only
    (notice,) = newer.take_notices()
    assert "newer specchat" in notice and "read-only" in notice
    assert [m.text for m in newer.conversation(chat)] == ["What is WAL?", "Write-ahead logging."]
    with pytest.raises(StoreError, match="read-only"):
        newer.delete_chat(chat)
    # New messages go on in memory; the file is left as it was.
    new_chat = newer.create_chat("in memory")
    newer.add_message(new_chat, "user", "kept in memory")
    assert [m.text for m in newer.conversation(new_chat)] == ["kept in memory"]
    newer.close()
    assert raw_rows(tmp_path / DB_NAME, "SELECT count(*) FROM chats") == [(1,)]
    assert (tmp_path / DB_NAME).read_bytes() == before


def test_full_disk_moves_the_store_to_memory(tmp_path: Path):
    store = Store.open(tmp_path)
    chat, user, answer = make_chat(store)
    # A real SQLITE_FULL: cap the file at its current size, then write more than fits.
    pages = store.database.con.execute("PRAGMA page_count").fetchone()[0]
    store.database.con.execute(f"PRAGMA max_page_count = {pages}")
    reply = store.add_message(chat, "user", "x" * 50_000, parent_id=answer)
    assert store.in_memory
    (notice,) = store.take_notices()
    assert "in memory" in notice and "full" in notice
    assert [m.id for m in store.conversation(chat)] == [user, answer, reply]  # nothing earlier lost
    store.update_message(reply, "y", stop_reason="eos")
    assert store.take_notices() == []  # one message, not one per write


def hold_write_lock(path: Path, seconds: float, *, exclusive: bool) -> threading.Thread:
    """Another connection takes the write lock (EXCLUSIVE on a new file) and keeps it for `seconds`."""
    taken = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE")
        if exclusive:
            con.execute("CREATE TABLE IF NOT EXISTS other (a)")
        taken.set()
        time.sleep(seconds)
        con.execute("COMMIT")
        con.close()

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    return thread


def test_a_lock_held_past_the_busy_timeout_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Another process holding the lock longer than SQLite's own busy wait (or a lock race SQLite does not wait
    # for at all) must not push the chat into memory: opening and writing retry until the lock is free.
    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 50)
    thread = hold_write_lock(tmp_path / DB_NAME, 0.6, exclusive=True)
    store = Store.open(tmp_path)
    thread.join()
    assert not store.in_memory and store.take_notices() == []
    thread = hold_write_lock(tmp_path / DB_NAME, 0.6, exclusive=False)
    chat, _, _ = make_chat(store)
    thread.join()
    assert not store.in_memory and store.take_notices() == []
    assert raw_rows(tmp_path / DB_NAME, f"SELECT count(*) FROM messages WHERE chat_id = {chat}") == [(2,)]


def test_unwritable_folder_keeps_the_chat_in_memory(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    store = Store.open(blocker / "data")  # cannot be created (root can write anywhere, but not under a file)
    assert store.in_memory
    (notice,) = store.take_notices()
    assert "in memory" in notice and str(blocker / "data") in notice
    chat, _, _ = make_chat(store)
    assert [m.role for m in store.conversation(chat)] == ["user", "assistant"]


def test_exports(tmp_path: Path):
    import orjson

    store = Store.open(tmp_path)
    chat, _, _ = make_chat(store)
    record = orjson.loads(export_json(store.chat(chat), store.conversation(chat)))
    assert record["chat"]["title"] == "What is WAL?"
    assert [m["text"] for m in record["messages"]] == ["What is WAL?", "Write-ahead logging."]
    assert record["messages"][1]["stats"] == {"new_tokens": 3}
    text = export_markdown(store.chat(chat), store.conversation(chat), lambda m: "3 tok" if m.stats else "")
    assert text.startswith("# What is WAL?") and "## You\n\nWhat is WAL?" in text and "*3 tok*" in text


def test_stats_are_json_text_sqlite_can_query(tmp_path: Path):
    store = Store.open(tmp_path)
    make_chat(store)
    rows = raw_rows(
        tmp_path / DB_NAME,
        "SELECT json_extract(stats, '$.new_tokens') FROM messages WHERE role = 'assistant'",
    )
    assert rows == [(3,)]


def test_update_chat_records_a_new_model_draft_and_system_prompt(tmp_path: Path):
    store = Store.open(tmp_path)
    chat, _, _ = make_chat(store)
    before = store.chat(chat)
    store.update_chat(chat, model="/models/other", draft="none")
    store.update_chat(chat, system_prompt="Be brief.")
    store.close()
    again = Store.open(tmp_path)  # on disk, not only in this connection
    after = again.chat(chat)
    assert (after.model, after.draft, after.system_prompt) == ("/models/other", "none", "Be brief.")
    assert after.title == before.title and after.preset_mode == before.preset_mode
    again.update_chat(chat, system_prompt=None)
    assert again.chat(chat).system_prompt is None
    with pytest.raises(ValueError, match="not a chat setting: title"):
        again.update_chat(chat, title="x")


def test_a_version_1_file_gains_the_origins_column_and_keeps_its_messages(tmp_path):
    import sqlite3

    from engine.origins import decode_runs, encode_runs
    from engine.storage.store import MIGRATIONS

    con = sqlite3.connect(tmp_path / DB_NAME)
    con.executescript(MIGRATIONS[1])
    con.execute("INSERT INTO chats (title, created_at, updated_at) VALUES ('old', 1, 1)")
    con.execute(
        "INSERT INTO messages (chat_id, role, text, created_at, updated_at, stop_reason) "
        "VALUES (1, 'assistant', 'hello there', 1, 1, 'eos')"
    )
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    store = Store.open(tmp_path)
    [message] = store.conversation(1)
    assert message.text == "hello there" and message.origins is None
    runs = [("hello", True), (" there", False)]
    store.update_message(message.id, "hello there", stop_reason="eos", origins=encode_runs(runs))
    [message] = store.conversation(1)
    assert decode_runs(message.text, message.origins) == runs
    assert "origins" not in export_json(store.chat(1), [message]).decode()
