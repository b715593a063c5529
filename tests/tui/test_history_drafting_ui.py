"""History drafting as the user sees it (issue 45, items 3 and 4): drafted / accepted tokens per source in the stats
line and the inspector, history drafts in their own F6 colour (through a reopened chat too), the verdict counting
free drafts and naming its c apart from the reply's own, the engines that run their own loop saying history
drafting is not there, the F12 switch, and private chats in the saved-chats dialog.

Rules broken on purpose while writing these (each sent a test here red): history runs painted in DRAFT_STYLE;
encode_runs dropping the source (a reopened chat lost the history colour); the "by source" row left out; the
verdict row without the free drafts; history_drafting_unavailable saying "" for every engine; the F12 switch not
applied to the session; the private toggle not calling set_private; the list not saying "private"; the F12 switch
setting the flag without judging the verdict again (no "now:" line); doctor's draft_pays counting history with
history drafting off.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from textual.widgets import Switch
from textual.widgets._markdown import MarkdownParagraph

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.decoding.cost_model import VerifyCostModel
from engine.session import ChatSession
from engine.storage.store import Store
from tests.support.isolation import isolated_config_and_data  # noqa: F401 (autouse)
from tests.support.tui import plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.history import HistoryScreen
from tui.screens.inspector import InspectorScreen
from tui.screens.settings import SettingsScreen
from tui.widgets.message import DRAFT_STYLE, HISTORY_STYLE

SIZE = (120, 40)
REPLY = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"


def saving_app(data_dir: Path, backend: ScriptedBackend, **settings) -> SpecchatApp:
    config = Settings(data_dir=data_dir, **settings)
    return SpecchatApp(config, session=ChatSession(config, backend=backend, save=True))


def coloured(reply, style: str) -> str:
    block = reply.markdown.query(MarkdownParagraph)[0]._content
    return "".join(block.plain[s.start : s.end] for s in block.spans if str(s.style) == style)


def inspector_text(app) -> str:
    return plain(app.screen.query_one("#inspector-fields"))


async def test_per_source_counts_and_the_history_colour_live_and_reopened(tmp_path: Path):
    backend = ScriptedBackend(REPLY, accept_pattern=(2, 1), drafter_pattern=("history", "ngram"))
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Say the letters")
        reply = app.chat.chat_log.replies()[-1]
        stats = reply.stats
        assert set(stats.drafted_by) == {"history", "ngram"}
        assert sum(stats.drafted_by.values()) == stats.drafted_tokens
        by_source = (
            f"n-gram {stats.drafted_by['ngram']}/{stats.accepted_by['ngram']}, "
            f"history {stats.drafted_by['history']}/{stats.accepted_by['history']}"
        )
        assert f"drafted/accepted {by_source}" in plain(reply.query_one(".stats"))
        # F6: the history rounds' accepted drafts in their own colour, the n-gram's in the draft colour.
        await pilot.press("f6")
        await pilot.pause(0.1)
        history, ngram = coloured(reply, HISTORY_STYLE), coloured(reply, DRAFT_STYLE)
        assert history.startswith("alpha beta") and ngram and not set(history.split()) & set(ngram.split())
        # The inspector says the same counts, and the reply's own c apart from the verdict's.
        await pilot.press("ctrl+s")
        await wait_until(
            pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.stats is not None
        )
        text = inspector_text(app)
        assert f"by source  {by_source}" in text and "cost ratio c (this reply)" in text
        assert "history drafting" not in text  # the scripted engine is not one that runs its own loop
        await pilot.press("escape")
        # Reopened from the store: the colours as they streamed.
        chat = app.session.chat_id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.chat.chat_log.messages())
        await app.chat.show_chat(chat)
        await pilot.pause(0.1)
        reopened = app.chat.chat_log.replies()[-1]
        assert (coloured(reopened, HISTORY_STYLE), coloured(reopened, DRAFT_STYLE)) == (history, ngram)


async def test_the_inspector_counts_free_drafts_beside_a_draft_that_cannot_pay_and_names_each_c(tmp_path):
    # A draft step as dear as a target step: the draft model's drafts cannot pay, the history drafts beside it can.
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2, 6: 1.25, 7: 1.3}, 1.0)
    backend = ScriptedBackend(REPLY, draft_mode="model", costs=costs, drafter_pattern=("history",))
    app = saving_app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Say the letters")
        stats = app.chat.chat_log.replies()[-1].stats
        await pilot.press("ctrl+s")
        await wait_until(
            pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.stats is not None
        )
        text = " ".join(inspector_text(app).split())
        assert "draft verdict doesn't pay (running c 1.00, r(2) 1.05" in text
        assert "free n-gram and history drafts can" in text
        drafted, accepted = stats.drafted_by["history"], stats.accepted_by["history"]
        assert f"free drafts sent all the same: history {drafted}/{accepted}" in text


async def test_engines_that_run_their_own_loop_say_history_drafting_is_not_there(tmp_path):
    app = saving_app(tmp_path, ScriptedBackend(REPLY))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "Say the letters")
        stats = app.chat.chat_log.replies()[-1].stats
        for backend, words in (
            ("exllamav3", "exllamav3 runs its own generator loop"),
            ("exllamav2", "exllamav2 runs its own generator loop"),
            ("remote", "the server drafts by its own settings"),
        ):
            await app.push_screen(InspectorScreen(dataclasses.replace(stats, backend=backend, drafted_by={})))
            text = " ".join(inspector_text(app).split())
            assert f"history drafting not available: {words}" in text, text
            assert "by source –" in text  # nothing measured per source: one definition, "–"
            await pilot.press("escape")
        await app.push_screen(InspectorScreen(dataclasses.replace(stats, backend="llama.cpp")))
        assert "history drafting" not in inspector_text(app)


async def test_f12_turns_history_drafting_off_for_the_session(tmp_path):
    app = saving_app(tmp_path, ScriptedBackend(REPLY))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.session.settings.history_drafting
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        switch = app.screen.query_one("#settings-history-drafting", Switch)
        assert switch.value is True
        switch.value = False
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.session.settings.history_drafting is False
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert app.screen.query_one("#settings-history-drafting", Switch).value is False


async def test_ctrl_k_in_saved_chats_marks_a_chat_private_and_the_list_says_so(tmp_path):
    store = Store.open(tmp_path)
    chat = store.create_chat(
        "Secret plans", model=None, draft="ngram", system_prompt=None, preset_mode="auto"
    )
    store.add_message(chat, "user", "Secret plans")
    store.close()
    app = saving_app(tmp_path, ScriptedBackend(REPLY))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+h")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        screen = app.screen

        def listed() -> str:
            return str(screen.options.get_option_at_index(0).prompt)

        assert "private" not in listed()
        await pilot.press("ctrl+k")
        await wait_until(pilot, lambda: "private" in listed())
        assert "history drafting never copies from it" in plain(screen.query_one("#history-status"))
        assert Store.open(tmp_path).chat(chat).private
        await pilot.press("ctrl+k")
        await wait_until(pilot, lambda: "private" not in listed())
        assert not Store.open(tmp_path).chat(chat).private


async def test_the_f12_history_switch_judges_the_verdict_again_as_a_load_does(tmp_path):
    # Beside a draft model that cannot pay, the free drafts the verdict counts are n-gram and history; turned off
    # in F12, history leaves them, and the chat, the next reply's stats and doctor say the same verdict.
    from engine.benchmarks.doctor.model_runs import check_draft_pays
    from engine.benchmarks.doctor.report import DoctorReport
    from engine.decoding.verdict import machine_verdict
    from engine.presets import load_presets

    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2, 6: 1.25, 7: 1.3}, 1.0)
    backend = ScriptedBackend(REPLY, draft_mode="model", costs=costs, drafter_pattern=("ngram",))
    app = saving_app(tmp_path, backend)

    def notices() -> list[str]:
        return [" ".join(n.plain.split()) for n in app.chat.chat_log.query(".chat-notice")]

    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: notices())
        assert "n-gram and history drafts take no draft steps" in notices()[0]  # said at load
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#settings-history-drafting", Switch).value = False
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(notices()) == 2)
        line = notices()[-1]
        assert (
            line.startswith("now: ") and "n-gram drafts take no draft steps" in line and "history" not in line
        )
        # What a load with history drafting off says, and what doctor says.
        verdict = machine_verdict(backend, "model", app.session.presets, history_drafting=False)
        assert app.session.verdict == verdict and line.endswith(verdict.body())
        report = DoctorReport()
        check_draft_pays(report, backend, backend.info, load_presets(None), history_drafting=False)
        assert report.checks[-1].reason == " ".join(verdict.doctor_line().split())
        assert report.checks[-1].reason.removeprefix("no: ") == line.split("on this machine: ")[1]
        # The next reply's stats carry that verdict.
        await send(pilot, "Say the letters")
        stats = app.chat.chat_log.replies()[-1].stats
        assert "free n-gram drafts can" in stats.draft_verdict and "history" not in stats.draft_verdict
        # Switched on again: history is counted again.
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#settings-history-drafting", Switch).value = True
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(notices()) == 3)
        assert "n-gram and history drafts take no draft steps" in notices()[-1]
