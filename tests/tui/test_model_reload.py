"""Another model or draft for this chat, from the settings dialog (issue 9): the real app under Pilot, real tiny
models on the transformers backend, a real SQLite store. The conversation stays; failures keep the old model."""

from __future__ import annotations

import threading

import pytest
from textual.widgets import Input

from engine.config import Settings
from engine.session import ChatSession
from tests.support.tui import apply_settings, plain, status, wait_until
from tui.app import SpecchatApp
from tui.screens.settings import SettingsScreen

SIZE = (100, 36)
LOAD_S = 120


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SPECCHAT_CONFIG_FILE", raising=False)


def make_app(model, draft: str = "ngram") -> SpecchatApp:
    settings = Settings(model=model, draft=draft, backend="transformers", seed=7, max_context=1024)
    session = ChatSession(settings, save=True)
    session.set_overrides(max_new_tokens=6)  # random tiny models: a few tokens say which model replied
    return SpecchatApp(settings, session=session)


async def ready(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.state != "loading", timeout=LOAD_S)
    assert app.state == "ready", app.load_error


def answered(app: SpecchatApp, replies: int) -> bool:
    """`replies` replies on screen and the last one finished (its stats line is set when it ends)."""
    shown = app.chat.chat_log.replies()
    return len(shown) == replies and shown[-1].stats is not None and not app.chat.generating


async def ask(pilot, text: str) -> None:
    app = pilot.app
    count = len(app.chat.chat_log.replies())
    app.chat.prompt.set_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: answered(app, count + 1), timeout=LOAD_S)


def hold_reloads(app: SpecchatApp) -> threading.Event:
    """The session's real reload, started only once the returned event is set: the test sees the loading state."""
    gate = threading.Event()
    reload = app.session.reload

    def held(*args, **kwargs):
        gate.wait(LOAD_S)
        return reload(*args, **kwargs)

    app.session.reload = held
    return gate


def stored_chat(app: SpecchatApp):
    assert app.session.chat_id is not None
    return app.session.recorder.store.chat(app.session.chat_id)


def toasts(app: SpecchatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


@pytest.mark.slow
async def test_a_reload_keeps_the_conversation_and_the_next_reply_comes_from_the_new_model(
    tiny_model_dir, tiny_model_dir_other_vocab
):
    app = make_app(tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Remember the word pineapple.")
        first = app.chat.chat_log.replies()[-1]
        assert first.stats.model == tiny_model_dir.name
        assert stored_chat(app).model == str(tiny_model_dir)

        gate = hold_reloads(app)
        screen = await apply_settings(pilot, model=str(tiny_model_dir_other_vocab))
        assert app.screen is not screen  # the dialog closed: the paths were fine
        assert app.state == "loading"
        # The conversation stays on screen and in the session while the new model loads ...
        assert [type(m).__name__ for m in app.chat.chat_log.messages()] == ["UserMessage", "ReplyMessage"]
        assert app.chat.chat_log.messages()[0].text == "Remember the word pineapple."
        assert [t.role for t in app.session.turns] == ["user", "assistant"]
        # ... and a message sent meanwhile waits for the new model.
        app.chat.prompt.set_text("Which word?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 3)
        waiting = app.chat.chat_log.messages()[-1]
        assert waiting.text == "Which word?" and "waiting" in plain(waiting.query_one(".role"))
        gate.set()
        await ready(pilot)
        assert app.session.info.model == tiny_model_dir_other_vocab.name
        # "Model loaded" says which (as the chat hears of the load from the app).
        await wait_until(pilot, lambda: any(tiny_model_dir_other_vocab.name in t for t in toasts(app)))
        await wait_until(pilot, lambda: answered(app, 2), timeout=LOAD_S)
        # The conversation is the reply's context, rendered by the new model's own tokenizer.
        second = app.chat.chat_log.replies()[-1]
        assert second.stats is not None and not second.failed
        assert second.stats.model == tiny_model_dir_other_vocab.name
        prompt = app.session.backend.decode(list(app.session.last_prompt_ids))
        assert "Remember the word pineapple." in prompt and "Which word?" in prompt
        # The stored chat records the model it runs on now; all four messages are in it.
        chat = stored_chat(app)
        assert chat.model == str(tiny_model_dir_other_vocab) and chat.draft == "ngram"
        assert chat.message_count == 4


@pytest.mark.slow
async def test_draft_none_and_back_to_ngram_reloads_and_the_store_follows(tiny_model_dir):
    app = make_app(tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "hello")
        await apply_settings(pilot, draft="none")
        await ready(pilot)
        assert app.session.info.draft_mode == "none"
        assert "│ K off │" in status(app)
        await wait_until(pilot, lambda: any("draft none" in t for t in toasts(app)))
        assert stored_chat(app).draft == "none"
        await ask(pilot, "again")
        assert app.chat.chat_log.replies()[-1].stats.draft_mode == "none"
        await apply_settings(pilot, draft="ngram")
        await ready(pilot)
        assert app.session.info.draft_mode == "ngram"
        assert stored_chat(app).draft == "ngram"
        assert len(app.session.turns) == 4


@pytest.mark.slow
async def test_paths_that_hold_no_model_are_one_line_in_the_dialog_and_nothing_reloads(
    tiny_model_dir, tmp_path
):
    app = make_app(tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        backend = app.session.backend
        (tmp_path / "notes.txt").write_text("not a model")
        cases = {
            str(tmp_path / "nowhere"): "does not exist",
            str(tmp_path): "has no config.json",
            str(tmp_path / "notes.txt"): "not a .gguf model",
        }
        for path, why in cases.items():
            screen = await apply_settings(pilot, model=path)
            assert app.screen is screen, f"the dialog closed for {path}"
            error = plain(screen.query_one("#settings-error")).strip()
            assert why in error and "\n" not in error, error
            assert screen.query_one("#settings-model", Input).value == path  # the edit stays
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        screen = await apply_settings(pilot, draft="banana")
        assert app.screen is screen
        assert "draft: banana does not exist" in plain(screen.query_one("#settings-error"))
        await pilot.press("escape")
        assert app.session.backend is backend and app.state == "ready"


@pytest.mark.slow
async def test_an_incompatible_draft_is_one_line_and_the_old_model_stays(
    tiny_model_dir, tiny_model_dir_other_vocab
):
    app = make_app(tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "hello")
        backend, info = app.session.backend, app.session.info
        gate = hold_reloads(app)
        await apply_settings(pilot, draft=str(tiny_model_dir_other_vocab))
        assert app.state == "loading"
        app.chat.prompt.set_text("still there?")
        await pilot.press("enter")  # waits for the new model; back in the prompt when it does not load
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 3)  # the waiting message
        gate.set()
        await wait_until(pilot, lambda: app.state != "loading", timeout=LOAD_S)
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 2)  # ... taken back
        assert app.chat.prompt.text == "still there?"
        assert [type(m).__name__ for m in app.chat.chat_log.messages()] == ["UserMessage", "ReplyMessage"]
        assert app.state == "ready"
        assert app.session.backend is backend and app.session.info == info
        assert app.session.settings.draft == "ngram"
        # The dialog is back with the typed draft and why it did not load (a toast would vanish with the path),
        # once it is mounted (the chat opens it as the app's message about the failed load arrives).
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, SettingsScreen) and bool(app.screen.query("#settings-error")),
        )
        await wait_until(pilot, lambda: plain(app.screen.query_one("#settings-error")).strip() != "")
        assert app.screen.query_one("#settings-draft", Input).value == str(tiny_model_dir_other_vocab)
        message = plain(app.screen.query_one("#settings-error"))
        assert "vocabulary size differs" in message and "still on " + tiny_model_dir.name in message
        assert "\n" not in message.strip()
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert stored_chat(app).draft == "ngram"
        # The old model still answers, with the conversation.
        await pilot.press("enter")
        await wait_until(pilot, lambda: answered(app, 2), timeout=LOAD_S)
        assert app.chat.chat_log.replies()[-1].stats.model == tiny_model_dir.name
        assert len(app.session.turns) == 4


async def test_an_edited_system_prompt_is_written_to_the_stored_chat(tmp_path):
    from engine.backends.scripted import ScriptedBackend
    from engine.presets import load_presets

    settings = Settings(data_dir=tmp_path / "data")
    session = ChatSession(settings, backend=ScriptedBackend(), presets=load_presets(None), save=True)
    app = SpecchatApp(settings, session=session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "hello")
        assert stored_chat(app).system_prompt is None
        await apply_settings(pilot, system_prompt="You are a pirate.")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert stored_chat(app).system_prompt == "You are a pirate."
        await apply_settings(pilot, system_prompt="")
        assert stored_chat(app).system_prompt is None


@pytest.mark.slow
async def test_applying_another_draft_is_loading_at_once(tiny_model_dir):
    """The app is loading from the moment the dialog's change applies, not only once the worker starts after the
    next refresh: a second F12 apply in between went through the 'a model is loading' check, and the pair's tmux
    check saw the new draft in a bar still marked ready before the reload had begun."""
    app = make_app(tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        deferred: list = []
        app.call_after_refresh = lambda callback, *args, **kwargs: deferred.append(callback) or True
        app.chat.call_after_refresh = app.call_after_refresh
        await apply_settings(pilot, draft="none")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.state == "loading"
        assert app.chat.settings_flow.busy() == "a model is loading"
        assert [callback.__name__ for callback in deferred] == ["reload_model"]


async def test_a_reload_toast_leaves_out_the_notes_the_last_load_gave():
    """Long load notes repeated at every reload filled the toast rack at 80x24 and hid the next toast (tmux)."""
    from types import SimpleNamespace

    from engine.backends.scripted import ScriptedBackend

    def info(*notes: str):
        return SimpleNamespace(
            model="m", backend="llama.cpp", device="cpu", draft_model=None, draft_mode="ngram", notes=notes
        )

    repack = "weight repacking off: this CPU has AMX (amx_bf16, amx_int8, amx_tile)"
    app = SpecchatApp(Settings(), backend=ScriptedBackend())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await app.chat.model_loaded(info(repack, "2 threads: measured (1 thread 27.6 ms, 2 threads 18.4 ms)"))
        await app.chat.model_loaded(
            info(repack, "2 threads: measured (1 thread 30.1 ms, 2 threads 17.0 ms)", "cache: f16"),
            reloaded=True,
        )
        await pilot.pause()
        (last,) = [toast for toast in toasts(app) if "the chat goes on with it" in toast]
        assert "(cache: f16)" in last
        assert "AMX" not in last and "threads" not in last
