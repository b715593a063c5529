"""The context figure is the truth: `ctx` in the status bar is the size of what the next reply will see, after a
reply, reopening a chat (--resume, the history screen), trimming, paging variants and during a prefill; turns
trimmed out of the context stay on screen, dimmed under one rule; the inspector says how many turns the model sees.
Plus the smaller chat fixes of the same issue (ctrl+n, Markdown `<…>` text, ^b in the footer).

The real app under Pilot on the ScriptedBackend (its word tokenizer makes the token counts exact) and a real
SQLite store in tmp_path.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from textual.widgets._footer import FooterKey

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support.tui import SIZE, make_app, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.inspector import InspectorScreen
from tui.widgets.chat_log import ContextRule
from tui.widgets.message import ReplyMessage

LONG_REPLY = " ".join(f"tok{i}" for i in range(150))
MAX_CONTEXT = 512


def saving_app(data_dir: Path, backend: ScriptedBackend, open_chat: int | None = None) -> SpecchatApp:
    settings = Settings(data_dir=data_dir, max_context=MAX_CONTEXT)
    session = ChatSession(settings, backend=backend, presets=load_presets(None), save=True)
    return SpecchatApp(settings, session=session, open_chat=open_chat)


def ctx(app: SpecchatApp) -> int:
    found = re.search(r"ctx (\d+)/", status(app))
    assert found, status(app)
    return int(found.group(1))


def next_prompt_growth(backend: ScriptedBackend, text: str) -> int:
    """Tokens a new user message adds to a rendered conversation (the word tokenizer: one per word + the role)."""
    return len(backend.encode_chat([{"role": "user", "content": text}])) - len(backend.encode_chat([]))


def dimmed(app: SpecchatApp) -> list[bool]:
    return [m.has_class("out-of-context") for m in app.chat.chat_log.messages()]


async def fill_until_trimmed(pilot, app: SpecchatApp) -> None:
    for i in range(5):
        await send(pilot, f"question number {i} " + "padding " * 20)
    assert app.session.context_start > 0, "the chat should have outgrown the context"


async def test_trimmed_turns_are_dimmed_under_a_rule_and_ctx_is_the_next_prompt(tmp_path: Path):
    backend = ScriptedBackend(LONG_REPLY, max_context=MAX_CONTEXT)
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.session.set_mode("qa")
        await fill_until_trimmed(pilot, app)
        session = app.session
        hidden = session.context_start
        # Still on screen, all of them; the ones the model no longer sees are dimmed, the rest are not.
        assert len(app.chat.chat_log.messages()) == len(session.turns)
        assert dimmed(app) == [i < hidden for i in range(len(session.turns))]
        rules = list(app.chat.chat_log.query(ContextRule))
        assert len(rules) == 1
        children = list(app.chat.chat_log.children)
        assert children[children.index(rules[0]) + 1] is app.chat.chat_log.messages()[hidden]
        assert "not in the model's context" in plain(rules[0])
        # The figure is what the next prompt really holds, less the message not typed yet.
        shown = ctx(app)
        assert shown + 256 <= MAX_CONTEXT  # room kept for the reply (qa: min(512, 512 // 2))
        await send(pilot, "and one more")
        assert len(backend.requests[-1].prompt_ids) == shown + next_prompt_growth(backend, "and one more")
        # The inspector says how much of the chat the model sees.
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        line = plain(app.screen.query_one("#inspector-context"))
        seen = len(session.context_turns)
        assert f"the model sees the last {seen} of {len(session.turns)} turns" in line
        assert f"{session.context_used}/{MAX_CONTEXT} tokens" in line


async def test_a_trimmed_chat_reopens_with_the_context_the_next_reply_sees(tmp_path: Path):
    first = ScriptedBackend(LONG_REPLY, max_context=MAX_CONTEXT)
    app = saving_app(tmp_path, first)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.session.set_mode("qa")
        await fill_until_trimmed(pilot, app)
        chat_id, turns = app.session.chat_id, len(app.session.turns)
    # --resume: the store holds every turn, the trimmed ones too; the figure must not count them.
    backend = ScriptedBackend(LONG_REPLY, max_context=MAX_CONTEXT)
    app = saving_app(tmp_path, backend, open_chat=chat_id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == turns)
        app.session.set_mode("qa")
        shown = ctx(app)
        assert 0 < shown <= MAX_CONTEXT - 256
        assert app.session.context_start > 0
        assert dimmed(app)[0] and not dimmed(app)[-1]
        assert len(app.chat.chat_log.query(ContextRule)) == 1
        await send(pilot, "hello again")
        assert len(backend.requests[-1].prompt_ids) == shown + next_prompt_growth(backend, "hello again")
        # The history screen opens it the same way (ctrl+n, then the chat from the list).
        await pilot.press("ctrl+n")
        assert ctx(app) == 0 and not app.chat.chat_log.query(ContextRule)
        await app.chat.show_chat(chat_id)
        assert app.session.context_start > 0 and ctx(app) <= MAX_CONTEXT - 256
        assert dimmed(app)[0] and not dimmed(app)[-1]


async def test_an_untrimmed_chat_reopens_at_the_figure_it_was_left_at(tmp_path: Path):
    app = saving_app(tmp_path, ScriptedBackend(["Paris is the capital.", "About two million people."]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "What is the capital of France?")
        await send(pilot, "How many people live there?")
        left_at, chat_id = ctx(app), app.session.chat_id
        assert not any(dimmed(app)) and not app.chat.chat_log.query(ContextRule)
    app = saving_app(tmp_path, ScriptedBackend(), open_chat=chat_id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: len(app.chat.chat_log.messages()) == 4)
        assert ctx(app) == left_at


async def test_ctx_during_the_prefill_is_the_prompt_being_read():
    gate = threading.Event()
    backend = ScriptedBackend("One two three.", gate=gate, gate_after_rounds=0)
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        gate.set()
        await send(pilot, "first question")
        before = ctx(app)
        gate.clear()  # the next reply holds before its first round: its prompt is being read
        paste = "pasted " * 300
        await send(pilot, paste, wait=False)
        await wait_until(pilot, lambda: bool(backend.requests) and len(backend.requests) == 2)
        await wait_until(pilot, lambda: ctx(app) != before)
        assert ctx(app) == len(backend.requests[-1].prompt_ids)
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)


async def test_paging_variants_keeps_ctx_the_truth(tmp_path: Path):
    backend = ScriptedBackend(["short.", "a much longer variant " * 20])
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        short = ctx(app)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.chat.generating and len(backend.requests) == 2)
        await wait_until(pilot, lambda: "variant 2/2" in app.chat.chat_log.replies()[-1].header)
        long = ctx(app)
        assert long > short
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: "variant 1/2" in app.chat.chat_log.replies()[-1].header)
        assert ctx(app) == short
        await send(pilot, "next")
        assert len(backend.requests[-1].prompt_ids) == short + next_prompt_growth(backend, "next")


# --- the smaller items ----------------------------------------------------------------------------------------


async def test_ctrl_n_starts_the_status_bar_afresh():
    app = make_app(ScriptedBackend("One two three four five."))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        assert "tok/s" in status(app) and "– tok/s" not in status(app)
        await pilot.press("ctrl+n")
        bar = status(app)
        assert "accept –" in bar and "– tok/s" in bar and "ctx 0/" in bar
        assert "▁" not in bar and "█" not in bar  # no sparkline of the old chat either


async def test_angle_brackets_in_a_reply_are_kept_as_text():
    app = make_app(ScriptedBackend("Chapter <<The Lighthouse>> begins; use a <b> tag and x < y > z."))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "title?")
        reply = app.chat.chat_log.replies()[-1]
        shown = " ".join(
            block._content.plain for block in reply.markdown.children if hasattr(block, "_content")
        )
        assert "<<The Lighthouse>>" in shown and "<b> tag" in shown


def footer_keys(app: SpecchatApp) -> list[str]:
    return [k.description for k in app.screen_stack[0].query(FooterKey)]


async def test_the_footer_offers_copy_code_on_a_selected_reply_with_code():
    app = make_app(ScriptedBackend(["Plain words only.", "Here:\n\n```python\nprint(1)\n```\n"]))
    async with app.run_test(size=(160, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "plain")
        await send(pilot, "code")
        await pilot.press("alt+up")  # the last reply: it has a code block
        assert isinstance(app.focused, ReplyMessage)
        await wait_until(pilot, lambda: "copy code" in footer_keys(app))
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: app.clipboard == "print(1)")
        await pilot.press("alt+up")  # the first: no code, so no such key
        await wait_until(pilot, lambda: "copy code" not in footer_keys(app))


async def test_a_dialog_shows_one_scrollbar_not_the_chats_beside_it():
    from tui.screens.help import HelpScreen

    app = make_app(ScriptedBackend(" ".join(["A long reply line."] * 200)))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "long please")
        assert app.chat.chat_log.styles.scrollbar_visibility == "visible"
        await pilot.press("f5")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await wait_until(pilot, lambda: app.chat.chat_log.styles.scrollbar_visibility == "hidden")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.chat.chat_log.styles.scrollbar_visibility == "visible")


async def test_an_interrupted_reply_keeps_the_presets_temperature(tmp_path: Path):
    # A creative reply starts its ramp at 0.5; what is stored as it starts (all a killed process leaves) is 0.9.
    settings = Settings(data_dir=tmp_path, preset="creative")
    session = ChatSession(settings, backend=ScriptedBackend("Once upon a time."), save=True)
    session.load()
    session.send("Tell me a story", on_event=lambda _e: None, cancel=threading.Event())
    stored = Store.open(tmp_path).conversation(session.chat_id)
    assert stored[-1].role == "assistant" and stored[-1].temperature == 0.9


def test_history_entries_are_one_line_each():
    from types import SimpleNamespace

    from tui.screens.history import TITLE_CELLS, chat_option_text

    long = SimpleNamespace(
        title="Explain " + "the lighthouse keeper's map " * 8, updated_at=0.0, message_count=12
    )
    pasted = SimpleNamespace(title="line one\nline two", updated_at=0.0, message_count=2)
    for chat in (long, pasted):
        text = chat_option_text(chat)
        assert "\n" not in text.plain and text.no_wrap
        assert text.plain.split("  ")[0].__len__() <= TITLE_CELLS
    assert chat_option_text(long).plain.split("  ")[0].endswith("…")


def test_a_first_reply_is_not_compared_with_itself():
    from types import SimpleNamespace

    from tui.screens.inspector import recent_comparison

    stats = SimpleNamespace(preset="qa", acceptance_rate=0.5, mean_accepted_length=2.0, decode_tokens_per_s=40.0,
                            ttft_s=0.1)  # fmt: skip
    recent = SimpleNamespace(replies=1, acceptance=0.5, tau=2.0, tokens_per_s=40.0, ttft_s=0.1)
    assert "no earlier qa replies" in recent_comparison(stats, recent).plain
    recent.replies = 5
    table = recent_comparison(stats, recent)
    headers = [c.header for c in table.columns]
    assert headers[2] == "last 5 qa (with this)"  # fits 80 columns; says it counts this reply
