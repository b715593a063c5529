"""The chat's flows in the real app under Pilot, on a real SQLite file where they save: editing any message (Esc
cancels; a new branch that pages back), continuing a cut reply, find, attach, "stopping…", Enter while a reply
streams, the history's rename cursor, no empty chat for a refused message, memory-only shown while it lasts, and a
chat open in another window."""

from __future__ import annotations

import threading
from pathlib import Path

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support.isolation import isolated_config  # noqa: F401
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.find import FindScreen
from tui.screens.history import HistoryScreen
from tui.screens.path_picker import PathPickerScreen
from tui.widgets.message import ReplyMessage, UserMessage

SMALL = (80, 24)


def saving_app(data_dir: Path, backend: ScriptedBackend, open_chat: int | None = None) -> SpecchatApp:
    settings = Settings(data_dir=data_dir)
    session = ChatSession(settings, backend=backend, presets=load_presets(None), save=True)
    return SpecchatApp(settings, session=session, open_chat=open_chat)


def texts(app: SpecchatApp) -> list[str]:
    return [m.text for m in app.chat.chat_log.messages() if m.display]


def told(app: SpecchatApp, part: str) -> list[str]:
    return [n.message for n in app._notifications if part in n.message]


# --- 1. editing: Esc cancels, any message, a branch that stays reachable ----------------------------------


async def test_esc_cancels_an_edit_and_the_old_exchange_stays(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1", "A2"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        await pilot.press("ctrl+e")
        assert app.chat.prompt.text == "two" and app.chat.editing == 2
        # Nothing is hidden while editing: the old exchange is on screen, marked.
        assert texts(app) == ["one", "A1", "two", "A2"]
        assert app.chat.chat_log.messages()[2].has_class("editing")
        await pilot.press(*" more")
        await pilot.press("escape")
        assert app.chat.editing is None and app.chat.prompt.text == ""
        assert texts(app) == ["one", "A1", "two", "A2"]
        assert [t.content for t in app.session.turns] == ["one", "A1", "two", "A2"]
        assert not any(m.has_class("editing") for m in app.chat.chat_log.messages())
        await pilot.press("ctrl+z")  # the edited text is not lost
        assert app.chat.prompt.text == "two more"


async def test_esc_after_the_chat_changed_under_an_edit_keeps_what_was_typed(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await pilot.press("ctrl+e")
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.chat.chat_log.messages())
        app.chat.prompt.set_text("a new question")
        await pilot.press("escape")
        assert app.chat.prompt.text == "a new question" and app.chat.editing is None


async def test_esc_on_an_edit_gives_back_what_the_prompt_held(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await pilot.press(*"half typed")
        await pilot.press("alt+up", "alt+up")  # the message "one"
        assert isinstance(app.focused, UserMessage)
        await pilot.press("ctrl+e")
        assert app.chat.prompt.text == "one"
        await pilot.press("escape")
        assert app.chat.prompt.text == "half typed"


async def test_editing_an_earlier_message_makes_a_branch_that_pages_back(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1", "A2", "A3", "B2"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
        await pilot.press("alt+up", "alt+up", "alt+up", "alt+up")  # A3, three, A2, two
        assert isinstance(app.focused, UserMessage) and app.focused.text == "two"
        await pilot.press("ctrl+e")
        assert app.chat.prompt.text == "two"
        app.chat.prompt.set_text("TWO")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.chat.generating and texts(app)[-1] == "B2")
        assert texts(app) == ["one", "A1", "TWO", "B2"]
        edited = app.chat.chat_log.messages()[2]
        assert "branch 2/2" in edited.header
        # The old branch, with its later exchange, is a key away.
        await pilot.press("alt+up", "alt+up")
        assert app.focused is edited
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: texts(app) == ["one", "A1", "two", "A2", "three", "A3"])
        assert "branch 1/2" in app.chat.chat_log.messages()[2].header
        assert app.focused is app.chat.chat_log.messages()[2]
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: texts(app) == ["one", "A1", "TWO", "B2"])
    # All of it is in the database, and a reopened chat pages the same way.
    assert len(Store.open(tmp_path).messages(app.session.chat_id)) == 8


async def test_ctrl_e_on_a_selected_reply_edits_the_message_it_answers(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1", "A2"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        await pilot.press("alt+up", "alt+up", "alt+up")  # A2, two, A1
        assert isinstance(app.focused, ReplyMessage) and app.focused.text == "A1"
        await pilot.press("ctrl+e")
        assert app.chat.prompt.text == "one" and app.chat.editing == 0


async def test_an_edit_stopped_before_its_first_token_brings_the_old_branch_back(tmp_path: Path):
    gate = threading.Event()
    app = saving_app(tmp_path, ScriptedBackend(["A1", "never"], gate=gate, gate_after_rounds=99))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        app.session.backend.gate_after_rounds = 0
        await pilot.press("ctrl+e")
        app.chat.prompt.set_text("ONE")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.generating)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.generating)
        assert texts(app) == ["one", "A1"]
        assert (
            app.chat.prompt.text == "ONE" and app.chat.editing == 0
        )  # the edit goes on: nothing typed is lost


# --- 7. continue, find, attach ----------------------------------------------------------------------------


async def test_continue_extends_a_reply_cut_at_its_token_limit(tmp_path: Path):
    words = " ".join(f"w{i}" for i in range(30))
    app = saving_app(tmp_path, ScriptedBackend([words, "more words here"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        app.session.set_overrides(max_new_tokens=6)
        await send(pilot, "count")
        first = app.chat.chat_log.replies()[-1].text
        assert first == "w0 w1 w2 w3 w4 w5"
        assert told(app, "alt+c continues it")
        await pilot.press("alt+c")
        await wait_until(
            pilot, lambda: not app.chat.generating and len(app.chat.chat_log.replies()[-1].text) > len(first)
        )
        replies = [r for r in app.chat.chat_log.replies() if r.display]
        assert len(replies) == 1 and replies[0].text == first + "more words here"
        assert app.session.turns[-1].content == replies[0].text
        await pilot.press("alt+c")  # ended by itself this time: nothing to continue
        assert told(app, "Nothing to continue")


async def test_find_jumps_to_the_newest_match_then_older_ones():
    app = make_app(ScriptedBackend(["apple pie", "banana", "apple tart"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        for text in ("fruit one", "fruit two", "fruit three"):
            await send(pilot, text)
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, FindScreen))
        await pilot.press(*"apple")
        assert "2 messages" in plain(app.screen.query_one("#find-count"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, FindScreen))
        assert app.focused.text == "apple tart"
        await pilot.press("ctrl+f", "enter")
        await wait_until(pilot, lambda: getattr(app.focused, "text", "") == "apple pie")
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, FindScreen))
        await pilot.press("ctrl+u", *"nowhere", "enter")
        await wait_until(pilot, lambda: bool(told(app, "No message contains")))


async def test_attach_puts_a_text_file_in_the_prompt_and_refuses_what_is_not_text(tmp_path: Path):
    code = tmp_path / "greet.py"
    code.write_text("def greet():\n    return 'hi'\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02")
    big = tmp_path / "big.txt"
    big.write_text("x" * (300 * 1024))
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        app.chat.prompt.set_text(f"/attach {code}\nwhat does it do?")
        await pilot.press("enter")
        assert app.chat.prompt.text == (
            "`greet.py`:\n\n```python\ndef greet():\n    return 'hi'\n```\n\nwhat does it do?"
        )
        assert app.session.turns == [] and not app.chat.generating  # nothing was sent
        for path, why in (
            (tmp_path / "missing.py", "no such file"),
            (binary, "binary"),
            (big, "limit"),
            (tmp_path, "folder"),
        ):
            typed = f"/attach {path}"
            app.chat.prompt.set_text(typed)
            await pilot.press("enter")
            assert app.chat.prompt.text == typed  # kept as typed
            assert told(app, why)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPickerScreen))
        await pilot.press("escape")


# --- 6. stopping…, 8. enter while a reply streams ----------------------------------------------------------


class SlowPrefill(ScriptedBackend):
    """A prefill slice that does not look at cancel until it ends (as one llama.cpp decode call)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.started = threading.Event()

    def generate(self, request, cancel):
        self.started.set()
        self.release.wait(10)
        yield from super().generate(request, cancel)


async def test_esc_during_a_long_prefill_says_stopping_at_once():
    backend = SlowPrefill(["never shown"])
    app = make_app(backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "a long prompt", wait=False)
        await wait_until(pilot, backend.started.is_set)
        await pilot.press("escape")
        reply = app.chat.chat_log.replies()[-1]
        assert "stopping…" in plain(reply.query_one(".stats"))
        backend.release.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        assert app.chat.prompt.text == "a long prompt"


async def test_enter_while_a_reply_streams_says_so_and_keeps_the_text():
    gate = threading.Event()
    app = make_app(ScriptedBackend([" ".join(["word"] * 40)], gate=gate, gate_after_rounds=1))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first", wait=False)
        await wait_until(pilot, lambda: app.chat.generating)
        await pilot.press("enter")  # an empty prompt
        assert told(app, "A reply is being generated")
        await pilot.press(*"next")
        await pilot.press("enter")
        assert len(told(app, "A reply is being generated")) == 2
        assert app.chat.prompt.text == "next"
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)


# --- 4. rename cursor, 5. no empty chat ---------------------------------------------------------------------


async def test_rename_starts_with_the_cursor_after_the_old_title(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["ok"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "old title")
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen
        await pilot.press(*"old")  # a search typed first: the field's cursor is not at the start nor the end
        await wait_until(pilot, lambda: len(screen.chats) == 1)
        await pilot.press("ctrl+t")
        await pilot.press(*" v2", "enter")
        await wait_until(pilot, lambda: screen.mode == "search")
        assert [c.title for c in screen.chats] == ["old title v2"]


async def test_a_message_refused_as_too_long_leaves_no_chat_in_the_history(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["ok"], max_context=64))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        long = " ".join(["word"] * 200)
        await send(pilot, long, wait=False)
        await wait_until(pilot, lambda: not app.chat.generating and bool(told(app, "too long")))
        assert app.chat.prompt.text == long
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        assert app.screen.chats == []
    assert Store.open(tmp_path).chats() == []


# --- 3. memory only, shown while it lasts ---------------------------------------------------------------------


async def test_a_full_disk_shows_memory_only_in_the_status_bar_for_as_long_as_it_lasts(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["A1", "A2 " * 200, "A3"]))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        assert "not saved" not in status(app)
        # The file may not grow any more: SQLite reports "database or disk is full", as on a full disk.
        store = app.session.recorder.store
        pages = store.database.con.execute("PRAGMA page_count").fetchone()[0]
        store.database.con.execute(f"PRAGMA max_page_count = {pages}")
        await send(pilot, "two " * 300)
        await wait_until(pilot, lambda: bool(told(app, "memory only")))
        assert "not saved (memory only)" in status(app)
        await pilot.pause(1.0)
        await send(pilot, "three")
        assert "not saved (memory only)" in status(app)
        assert texts(app)[-1] == "A3"


# --- 2. another window on the same chat ---------------------------------------------------------------------


async def test_a_chat_open_in_another_window_is_said_once(tmp_path: Path):
    first = ChatSession(
        Settings(data_dir=tmp_path), backend=ScriptedBackend(["A1"]), presets=load_presets(None), save=True
    )
    first.load()
    first.send("hello", lambda e: None, threading.Event())  # this window keeps the chat open
    app = saving_app(tmp_path, ScriptedBackend(["B1"]), open_chat=first.chat_id)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: bool(told(app, "open in another specchat window")), timeout=10)
        await send(pilot, "from the second window")
        await pilot.pause(2.5)
        assert len(told(app, "open in another specchat window")) == 1


async def test_a_resumed_reply_cut_by_a_full_disk_is_not_said_to_be_a_quit(tmp_path: Path):
    gate = threading.Event()
    backend = ScriptedBackend(["word " * 3000], gate=gate, gate_after_rounds=1, tokens_per_s=0)
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write a lot", wait=False)
        await wait_until(pilot, lambda: app.chat.generating and app.session.active is not None)
        store = app.session.recorder.store
        pages = store.database.con.execute("PRAGMA page_count").fetchone()[0]
        store.database.con.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        await wait_until(pilot, lambda: app.session.memory_only)
    resumed = saving_app(tmp_path, ScriptedBackend(["x"]), open_chat=Store.open(tmp_path).last_chat_id())
    async with resumed.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: bool(resumed.chat.chat_log.replies()))
        line = plain(resumed.chat.chat_log.replies()[-1].query_one(".stats"))
        assert "full disk" in line and "interrupted" in line
