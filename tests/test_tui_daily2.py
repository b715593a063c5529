"""The chat as a daily tool, round 2 (issue 19): bad presets and config fields, keys that follow the state,
reopened chats shown as they were. One test per problem, on the real app under Pilot (or the real CLI).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets._footer import FooterKey
from textual.widgets._markdown import MarkdownParagraph

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.config import config_dir, presets_dir
from engine.errors import BackendError
from engine.presets import Preset
from engine.session import ChatSession
from engine.storage import metrics
from engine.storage.store import Store
from tests.support.tui import make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.inspector import InspectorScreen
from tui.widgets.message import DRAFT_STYLE

SMALL = (80, 24)


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)
    monkeypatch.delenv("SPECCHAT_MODEL", raising=False)
    monkeypatch.delenv("SPECCHAT_PRESET", raising=False)


def write_preset(name: str, text: str) -> Path:
    presets_dir().mkdir(parents=True, exist_ok=True)
    path = presets_dir() / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def write_config(text: str) -> Path:
    config_dir().mkdir(parents=True, exist_ok=True)
    path = config_dir() / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def saving_app(data_dir: Path, backend: ScriptedBackend, open_chat: int | None = None) -> SpecchatApp:
    from engine.config import Settings

    settings = Settings(data_dir=data_dir)
    session = ChatSession(settings, backend=backend, save=True)
    return SpecchatApp(settings, session=session, open_chat=open_chat)


def footer_keys(app: SpecchatApp) -> list[str]:
    return [k.description for k in app.screen_stack[0].query(FooterKey)]


def drafted_text(reply) -> str:
    block = reply.markdown.query(MarkdownParagraph)[0]._content
    return "".join(block.plain[s.start : s.end] for s in block.spans if str(s.style) == DRAFT_STYLE)


# --- a bad preset file is skipped, the others work ----------------------------------------------------------


async def test_a_bad_preset_file_is_skipped_named_in_the_chat_and_the_others_work():
    bad = write_preset("short", "banana = 3\n")
    write_preset("steady", 'k = 2\nk_mode = "fixed"\n')
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        assert app.is_running and app.state == "ready"
        banner = plain(app.chat.chat_log.banner)
        assert "Preset file skipped" in banner and bad.name in banner and "banana" in banner
        assert "short" not in app.session.presets and "steady" in app.session.presets
        app.chat.action_use_preset("steady")
        await send(pilot, "hello")
        assert app.chat.chat_log.replies()[-1].stats.preset == "steady"


def test_a_skipped_preset_chosen_by_name_says_why():
    from engine.config import Settings
    from engine.errors import SpecchatError

    write_preset("short", "k = 99\n")
    session = ChatSession(Settings(), backend=ScriptedBackend())
    with pytest.raises(SpecchatError, match=r"preset 'short' was skipped: .*short\.toml: k: must be"):
        session.set_mode("short")


# --- the footer follows the state ---------------------------------------------------------------------------


async def test_footer_says_stop_while_streaming_and_regenerate_after():
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=1))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await pilot.pause(0.2)
        assert "stop" not in footer_keys(app) and "regenerate" not in footer_keys(app)
        await send(pilot, "hello", wait=False)
        await wait_until(pilot, lambda: app.chat.generating and "stop" in footer_keys(app))
        assert "regenerate" not in footer_keys(app)
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        await wait_until(pilot, lambda: "regenerate" in footer_keys(app))
        assert "stop" not in footer_keys(app)


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


# --- typing with a reply selected goes to the prompt --------------------------------------------------------


async def test_typing_with_a_reply_selected_goes_to_the_prompt_and_fires_nothing():
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("alt+up")
        assert app.focused is app.chat.chat_log.replies()[-1]
        copied = []
        app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
        await pilot.press(*"iii could you b?")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "iii could you b?"
        assert app.focused is app.chat.prompt
        assert not isinstance(app.screen, InspectorScreen) and copied == []
        # enter on a selected reply still opens its statistics (once)
        await pilot.press("alt+up", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        assert sum(isinstance(s, InspectorScreen) for s in app.screen_stack) == 1


# --- keyboard scrolling of the chat from the prompt ---------------------------------------------------------


async def test_pageup_and_pagedown_scroll_the_chat_from_the_prompt():
    app = make_app(ScriptedBackend(scripted_words(600)))
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "a long one please")
        app.chat.prompt.set_text("typed")
        log = app.chat.chat_log
        await wait_until(pilot, lambda: log.max_scroll_y > 20 and log.scroll_y == log.max_scroll_y)
        bottom = log.scroll_y
        for key in ("pageup", "shift+pageup"):
            before = log.scroll_y
            await pilot.press(key)
            await wait_until(pilot, lambda before=before: log.scroll_y < before)
        assert app.focused is app.chat.prompt and app.chat.prompt.text == "typed"
        await pilot.press("pagedown", "shift+pagedown")
        await wait_until(pilot, lambda: log.scroll_y == bottom)


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
        assert app.session.recent_average("code").replies == 2  # by preset alone, the other model counts


# --- remote: the server gone before the first token ---------------------------------------------------------


class DroppedBeforeFirstToken(ScriptedBackend):
    def generate(self, request, cancel):
        raise BackendError(
            "the server at http://127.0.0.1:9 dropped the connection (peer closed): "
            "the partial reply is kept; ask again when the server is back"
        )
        yield  # a generator, as the real backends are


async def test_a_server_gone_before_the_first_token_gives_the_prompt_back():
    app = make_app(DroppedBeforeFirstToken())
    async with app.run_test(size=SMALL) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?", wait=False)
        await wait_until(pilot, lambda: not app.chat.generating and app.chat.prompt.text)
        assert app.chat.prompt.text == "What is the capital of France?"
        assert app.chat.chat_log.messages() == [] and app.session.turns == []
        toasts = [str(n.message) for n in app._notifications]
        assert any("dropped the connection" in t for t in toasts)
        assert not any("partial reply is kept" in t for t in toasts)
