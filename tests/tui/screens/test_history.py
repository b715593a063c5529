"""The history in the real app under Pilot: ctrl+n keeps the old chat, the history screen lists, searches,
opens (stats lines come back and the chat goes on), renames, deletes after asking, exports; --resume."""

from __future__ import annotations

from pathlib import Path

import orjson

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support.tui import SIZE, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.history import HistoryScreen
from tui.widgets.message import ReplyMessage, UserMessage


def saving_app(data_dir: Path, backend: ScriptedBackend, open_chat: int | None = None) -> SpecchatApp:
    settings = Settings(data_dir=data_dir)
    session = ChatSession(settings, backend=backend, presets=load_presets(None), save=True)
    return SpecchatApp(settings, session=session, open_chat=open_chat)


def texts(app: SpecchatApp) -> list[str]:
    return [m.text for m in app.chat.chat_log.messages()]


async def test_new_chat_history_open_rename_delete_export(tmp_path: Path):
    backend = ScriptedBackend(
        ["Paris is the capital.", "About two million.", "Hello there!", "It continues."]
    )
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?")
        await send(pilot, "How many people live there?")
        first_stats = [plain(r.query_one(".stats")) for r in app.chat.chat_log.replies()]
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.chat.chat_log.messages())
        await send(pilot, "Say hello")

        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen
        assert [c.title for c in screen.chats] == ["Say hello", "What is the capital of France?"]
        await pilot.press(*"million")
        await wait_until(pilot, lambda: len(screen.chats) == 1)
        assert screen.chats[0].title == "What is the capital of France?"

        # export, then rename, from the search result
        await pilot.press("ctrl+x")
        exported = tmp_path / "exports" / f"chat-{screen.chats[0].id}.md"
        assert "About two million." in exported.read_text()
        await pilot.press("ctrl+t")
        screen.search.value = "Paris facts"
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen.mode == "search" and len(screen.chats) == 2)
        assert [c.title for c in screen.chats] == ["Say hello", "Paris facts"]

        # open the older chat: both exchanges and their stats lines are back
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, HistoryScreen) and len(texts(app)) == 4)
        assert texts(app) == [
            "What is the capital of France?",
            "Paris is the capital.",
            "How many people live there?",
            "About two million.",
        ]
        assert [plain(r.query_one(".stats")) for r in app.chat.chat_log.replies()] == first_stats
        # ... and it goes on with the same context, in the same chat
        await send(pilot, "And then?")
        prompt = backend.decode(list(backend.requests[-1].prompt_ids))
        assert "What is the capital of France?" in prompt and "About two million." in prompt
        store = Store.open(tmp_path)
        chats = store.chats()
        assert [c.title for c in chats] == ["Paris facts", "Say hello"]
        assert len(store.conversation(chats[0].id)) == 6

        # delete asks first: n keeps, y deletes
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen
        await pilot.press("down", "ctrl+d")
        assert "delete 'Say hello'" in plain(screen.query_one("#history-status"))
        await pilot.press("n")
        assert len(store.chats()) == 2
        await pilot.press("down", "ctrl+d", "y")
        await wait_until(pilot, lambda: len(screen.chats) == 1)
        assert [c.title for c in store.chats()] == ["Paris facts"]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HistoryScreen))


async def test_resume_shows_the_chat_and_its_stats_before_the_model_is_ready(tmp_path: Path):
    writer = saving_app(tmp_path, ScriptedBackend(["First answer.", "Second answer."]))
    async with writer.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        chat_id = writer.session.chat_id
    app = saving_app(tmp_path, ScriptedBackend("later"), open_chat=chat_id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 4)
        messages = app.chat.chat_log.messages()
        assert [type(m) for m in messages] == [UserMessage, ReplyMessage, UserMessage, ReplyMessage]
        assert texts(app) == ["one", "First answer.", "two", "Second answer."]
        assert all("tok/s" in plain(r.query_one(".stats")) for r in app.chat.chat_log.replies())
        headers = {r.header for r in app.chat.chat_log.replies()}
        assert len(headers) == 1 and headers.pop().startswith("auto → qa · K 5 — "), headers
        assert app.session.chat_id == chat_id
        await wait_ready(pilot)
        from tests.support.tui import status

        assert "accept " in status(app) and "accept –" not in status(app)  # the last reply's figures


async def test_storage_trouble_is_told_once_and_the_chat_goes_on(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    app = saving_app(blocker / "data", ScriptedBackend(["A.", "B."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        await pilot.pause(0.3)
        history = [n.message for n in app._notifications if "in memory" in n.message]
        assert len(history) == 1
        assert texts(app) == ["first", "A.", "second", "B."]


async def test_regenerated_replies_page_older_and_newer(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["Variant A.", "Variant B."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Question")
        await pilot.press("ctrl+r")
        await wait_until(
            pilot, lambda: not app.chat.generating and app.chat.chat_log.replies()[-1].text == "Variant B."
        )

        def header() -> str:
            return app.chat.chat_log.replies()[-1].header

        await wait_until(pilot, lambda: "variant 2/2" in header())
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: app.chat.chat_log.replies()[-1].text == "Variant A.")
        reply = app.chat.chat_log.replies()[-1]
        assert "variant 1/2" in reply.header and "tok/s" in plain(reply.query_one(".stats"))
        assert len(app.chat.chat_log.replies()) == 1
        await pilot.press("alt+left")  # nothing older: stays
        await pilot.pause(0.1)
        assert app.chat.chat_log.replies()[-1].text == "Variant A."
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: app.chat.chat_log.replies()[-1].text == "Variant B.")


def write_regressed_log(data_dir: Path) -> None:
    import time

    from engine.storage import metrics
    from tests.support.metrics_rows import baseline_rows, recent_rows

    shift = time.time() - 1_800_000_000.0  # the synthetic series ends now
    for row in baseline_rows(acceptance=0.7) + recent_rows(acceptance=0.5):
        metrics.append(data_dir / "metrics.jsonl", {**row, "timestamp": row["timestamp"] + shift})


async def test_status_bar_warns_of_a_regression_and_opens_the_trend(tmp_path: Path):
    from tests.support.tui import status
    from tui.screens.trend import TrendScreen

    app = saving_app(tmp_path, ScriptedBackend("ok"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "⚠" not in status(app)
    write_regressed_log(tmp_path)
    app = saving_app(tmp_path, ScriptedBackend("ok"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert status(app).endswith("⚠ acceptance −20 pts (qa)")
        await pilot.click("#status-bar")
        await wait_until(pilot, lambda: isinstance(app.screen, TrendScreen))
        body = plain(app.screen.query_one("#trend-body"))
        assert "regression: m + ngram [qa, abc]: acceptance 70% -> 50%" in body
        assert "acceptance and speed per reply" in body  # the plot


async def test_inspector_shows_the_reply_beside_the_presets_recent_average(tmp_path: Path):
    from tui.screens.inspector import InspectorScreen

    app = saving_app(tmp_path, ScriptedBackend(["One two three four.", "Five six seven eight nine."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.session.set_mode("qa")
        await send(pilot, "first")
        await send(pilot, "second")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        text = plain(app.screen.query_one("#inspector-recent"))
        assert "last 2 qa (with this)" in text  # the average counts the reply inspected, and says so
        last = app.chat.chat_log.replies()[-1].stats
        rows = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
        pooled = sum(r["accepted_tokens"] for r in rows) / sum(r["drafted_tokens"] for r in rows)
        acceptance_line = next(line for line in text.splitlines() if "acceptance" in line)
        assert f"{last.acceptance_rate * 100:.0f}%" in acceptance_line
        assert acceptance_line.rstrip().endswith(f"{pooled * 100:.0f}%")


async def test_damaged_database_is_told_once_in_the_app(tmp_path: Path):
    (tmp_path / "specchat.db").write_bytes(b"garbage, not sqlite" * 100)
    app = saving_app(tmp_path, ScriptedBackend("fine"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.pause(0.3)
        told = [n.message for n in app._notifications if "damaged" in n.message]
        assert len(told) == 1 and "specchat.db.corrupt-" in told[0]
    assert len(list(tmp_path.glob("specchat.db.corrupt-*"))) == 1
    assert [c.title for c in Store.open(tmp_path).chats()] == ["hello"]


# --- history: the renamed chat stays highlighted ------------------------------------------------------------


async def test_after_rename_the_highlight_stays_and_ctrl_x_exports_that_chat(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["First answer.", "Second answer."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first chat")
        await pilot.press("ctrl+n")
        await send(pilot, "second chat")
        await pilot.press("f7")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen
        assert [c.title for c in screen.chats] == ["second chat", "first chat"]
        await pilot.press("down", "ctrl+t")
        screen.search.value = "renamed first"
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen.mode == "search" and len(screen.chats) == 2)
        target = next(c for c in screen.chats if c.title == "renamed first")
        assert screen.selected() == target.id
        await pilot.press("ctrl+x")
        exported = tmp_path / "exports" / f"chat-{target.id}.md"
        await wait_until(pilot, exported.exists)
        assert "First answer." in exported.read_text()
