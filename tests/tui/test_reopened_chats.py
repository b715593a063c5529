"""Chats reopened from a real SQLite file are shown as they were: an interrupted reply's mark and stats line,
the context figure before the next reply, a reply stopped by a full context (said and stored so), draft
colours through reopening and paging variants, and the inspector's recent average of this model and backend.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets._markdown import MarkdownParagraph

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.presets import Preset
from engine.session import ChatSession
from engine.storage import metrics
from engine.storage.store import Store
from tests.support.isolation import isolated_config_and_data  # noqa: F401 (autouse)
from tests.support.tui import plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.inspector import InspectorScreen
from tui.widgets.message import DRAFT_STYLE

SMALL = (80, 24)


def saving_app(data_dir: Path, backend: ScriptedBackend, open_chat: int | None = None) -> SpecchatApp:
    from engine.config import Settings

    settings = Settings(data_dir=data_dir)
    session = ChatSession(settings, backend=backend, save=True)
    return SpecchatApp(settings, session=session, open_chat=open_chat)


def drafted_text(reply) -> str:
    block = reply.markdown.query(MarkdownParagraph)[0]._content
    return "".join(block.plain[s.start : s.end] for s in block.spans if str(s.style) == DRAFT_STYLE)


# --- a reply interrupted by a killed process ----------------------------------------------------------------


async def test_an_interrupted_reply_reopened_shows_its_mark_and_stats_line(tmp_path: Path):
    store = Store.open(tmp_path)
    chat = store.create_chat(
        "Tell me a story", model=None, draft="ngram", system_prompt=None, preset_mode="auto"
    )
    user = store.add_message(chat, "user", "Tell me a story")
    # What a process killed mid-reply leaves: the text so far, no stop reason, no stats.
    reply_id = store.add_message(
        chat, "assistant", "", parent_id=user, preset="creative", k=3, temperature=0.9
    )
    store.update_message(reply_id, "Once upon a time there was")
    store.close()
    app = saving_app(tmp_path, ScriptedBackend(), open_chat=chat)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: bool(app.chat.chat_log.replies()))
        reply = app.chat.chat_log.replies()[-1]
        line = plain(reply.query_one(".stats"))
        assert "interrupted" in line and "creative" in line and "K 3" in line and "T 0.90" in line
        assert "interrupted" in reply.header


# --- the context figure and a reply stopped by a full context -----------------------------------------------


async def test_ctx_shows_the_opened_chat_before_the_next_reply(tmp_path: Path):
    store = Store.open(tmp_path)
    chat = store.create_chat("long", model=None, draft="ngram", system_prompt=None, preset_mode="auto")
    user = store.add_message(chat, "user", scripted_words(300))
    store.add_message(chat, "assistant", scripted_words(200), parent_id=user, stop_reason="end_of_turn")
    store.close()
    app = saving_app(tmp_path, ScriptedBackend(load_delay_s=0.3), open_chat=chat)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 2)
        await wait_until(pilot, lambda: "ctx 0/" not in status(app))
        used = app.session.context_used
        assert used >= 500 and f"ctx {used}/2048" in status(app)


async def test_a_reply_stopped_by_a_full_context_says_so_and_is_stored_so(tmp_path: Path):
    backend = ScriptedBackend(scripted_words(400), max_context=600)
    presets = {"long": Preset(name="long", k=2, temperature=0.0, max_new_tokens=2000)}
    from engine.config import Settings

    settings = Settings(preset="long", data_dir=tmp_path)
    session = ChatSession(settings, backend=backend, presets=presets, save=True)
    app = SpecchatApp(settings, session=session)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, scripted_words(250))
        reply = app.chat.chat_log.replies()[-1]
        assert reply.stats.stop_reason == "context"
        line = plain(reply.query_one(".stats"))
        assert "context full" in line and "max_new_tokens" not in line
        stored = Store.open(tmp_path).conversation(app.session.chat_id)
        assert stored[-1].stop_reason == "context"


# --- draft colours on reopened and paged replies ------------------------------------------------------------


async def test_draft_colours_survive_reopening_and_paging_variants(tmp_path: Path):
    backend = ScriptedBackend()
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Write a python function")
        await pilot.press("f6")
        await pilot.pause(0.1)
        live = drafted_text(app.chat.chat_log.replies()[-1])
        assert live.startswith("Here is a")
        chat = app.session.chat_id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.chat.chat_log.messages())
        await app.chat.show_chat(chat)
        await pilot.pause(0.1)
        assert drafted_text(app.chat.chat_log.replies()[-1]) == live
        await pilot.press("ctrl+r")
        await wait_until(
            pilot, lambda: not app.chat.generating and "variant 2/2" in app.chat.chat_log.replies()[-1].header
        )
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: "variant 1/2" in app.chat.chat_log.replies()[-1].header)
        await pilot.pause(0.1)
        assert drafted_text(app.chat.chat_log.replies()[-1]) == live


# --- the inspector's recent average: same preset, model and backend -----------------------------------------


async def test_the_inspectors_recent_average_is_of_this_model_and_backend(tmp_path: Path):
    other = {"preset": "code", "model": "another-model", "backend": "llamacpp", "decode_tokens_per_s": 999.0}
    metrics.append(tmp_path / metrics.METRICS_NAME, {**other, "v": metrics.RECORD_VERSION, "timestamp": 1.0})
    app = saving_app(tmp_path, ScriptedBackend())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        app.chat.action_use_preset("code")
        await send(pilot, "Write a python function")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        recent = app.screen.recent
        assert recent is not None and recent.replies == 1
        assert (
            app.session.history.recent_average("code").replies == 2
        )  # by preset alone, the other model counts
