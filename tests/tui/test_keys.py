"""One key table, every surface: each key of tui/keymap.py is bound, shown in the footer (where the table says so),
listed in the help screen, in `specchat --help`, in the command palette and in docs/usage.md's key table, with the
same key everywhere. Read from the real surfaces: the running app's bindings, footer, help dialog and palette."""

from __future__ import annotations

import re
import threading

from textual.widgets._footer import FooterKey

from engine.backends.scripted import ScriptedBackend
from tests.support import paths
from tests.support.tui import make_app, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.cli.entry import build_parser
from tui.commands import SpecchatCommands
from tui.keymap import ALL_KEYS, APP_KEYS, CHAT_KEYS, MESSAGE_KEYS, key_display, key_words
from tui.screens.chat import ChatScreen
from tui.screens.help import HelpScreen
from tui.widgets.message import ReplyMessage

USAGE = paths.DOCS / "usage.md"
WIDE = (250, 40)  # every footer key fits


def test_every_key_is_bound_where_the_table_puts_it_and_no_binding_is_written_by_hand():
    for owner, specs in ((ChatScreen, CHAT_KEYS), (SpecchatApp, APP_KEYS), (ReplyMessage, MESSAGE_KEYS)):
        bound = {b.id: b for b in owner.BINDINGS}
        assert set(bound) == {spec.id for spec in specs}, owner.__name__
        for spec in specs:
            binding = bound[spec.id]
            assert (binding.key, binding.action, binding.description) == (
                spec.key,
                spec.action,
                spec.description,
            )
            assert (binding.show, binding.priority) == (spec.show, spec.priority)


def test_specchat_help_lists_every_key_with_its_binding_id():
    lines = build_parser().format_help().splitlines()
    for spec in ALL_KEYS:
        rows = [line for line in lines if f"[{spec.id}]" in line]
        assert len(rows) == 1, f"{spec.id}: {rows}"
        assert rows[0].strip().startswith(key_words(spec.key)), rows[0]
        assert spec.help in rows[0]


def test_docs_usage_key_table_has_every_key():
    rows = [line for line in USAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    documented = {binding_id for row in rows for binding_id in re.findall(r"`([a-z_]+\.[a-z_]+)`", row)}
    missing = [spec.id for spec in ALL_KEYS if spec.id not in documented]
    assert missing == [], f"keys missing from docs/usage.md's key table: {missing}"


async def test_the_help_screen_lists_every_key_as_mapped():
    app = make_app(keymap={"reply.cancel": "ctrl+g"})
    async with app.run_test(size=WIDE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        lines = plain(app.screen.query(".dialog Static")[1]).splitlines()
        for spec in ALL_KEYS:
            rows = [line for line in lines if re.search(rf"\s{re.escape(spec.id)}\s*$", line)]
            assert len(rows) == 1, f"{spec.id}: {rows}"
            key = "ctrl+g" if spec.id == "reply.cancel" else spec.key
            assert rows[0].strip().startswith(key_display(key)), rows[0]
            assert spec.help in " ".join(rows[0].split())


async def test_the_palette_offers_every_chat_and_app_key_and_runs_its_action():
    app = make_app(ScriptedBackend(replies=["the first answer", "another answer"]))
    async with app.run_test(size=WIDE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        commands = {name: callback for name, callback, _ in SpecchatCommands(app.screen)._commands()}
        for spec in CHAT_KEYS + APP_KEYS:
            assert spec.palette in commands, spec.id
        # A palette command does what its key does: regenerate writes the reply again.
        await commands["reply: regenerate"]()
        await wait_until(
            pilot, lambda: not app.chat.generating and app.session.turns[-1].content == "another answer"
        )
        assert [reply.text for reply in app.chat.chat_log.replies()] == ["another answer"]
        commands["preset: use creative"]()
        assert app.session.mode == "creative"


def footer_ids(app: SpecchatApp) -> set[str]:
    by_action = {spec.action: spec.id for spec in CHAT_KEYS + APP_KEYS}
    keys = app.chat.query(FooterKey)
    return {by_action.get(key.action, key.action) for key in keys}


async def test_the_footer_shows_the_keys_the_table_marks_for_it_while_they_apply():
    shown = {spec.id for spec in CHAT_KEYS + APP_KEYS if spec.show}
    gate = threading.Event()
    app = make_app(ScriptedBackend(gate=gate, gate_after_rounds=1))
    async with app.run_test(size=WIDE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait=False)
        await wait_until(pilot, lambda: app.session.live.rounds >= 1)
        # Streaming: stop, not regenerate.
        await wait_until(
            pilot, lambda: footer_ids(app) == (shown - {"reply.regenerate"}) | {"command_palette"}
        )
        gate.set()
        await wait_until(pilot, lambda: not app.chat.generating)
        # Done: regenerate, nothing to stop.
        await wait_until(pilot, lambda: footer_ids(app) == (shown - {"reply.cancel"}) | {"command_palette"})


async def test_esc_is_in_the_footer_while_an_edit_is_under_way_and_leaves_with_it():
    app = make_app(ScriptedBackend(["first answer"]))
    async with app.run_test(size=WIDE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        await wait_until(pilot, lambda: "reply.cancel" not in footer_ids(app))
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: "reply.cancel" in footer_ids(app))  # esc cancels the edit
        await pilot.press("escape")
        assert app.chat.editing is None
        # It stayed after the edit ended (the footer's state left the edit out).
        await wait_until(pilot, lambda: "reply.cancel" not in footer_ids(app))
