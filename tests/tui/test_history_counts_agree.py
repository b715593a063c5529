"""Issue 45's last acceptance line: the store, the metrics log and the inspector agree on the per-source counts for a
reply drafted from history. The real app under Pilot on the embedded model (llama.cpp, SmolLM2 F16), a real SQLite
file: a greedy reply, then ctrl+r, whose regenerated reply history drafts from the earlier variant. Verify passes are
priced free (`FreeVerify`), so drafting pays whatever the machine's load.

Rule broken on purpose while writing this: the metrics log writing `accepted_by` with one accepted token moved from
n-gram to history (`ChatRecorder.metrics_record`; the sums unchanged) sent it red.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.config import Settings
from engine.session import ChatSession
from tests.support.drafting import FreeVerify
from tests.support.isolation import isolated_config_and_data  # noqa: F401 (autouse)
from tests.support.tui import plain, send, wait_until
from tui.app import SpecchatApp
from tui.formatting import source_label
from tui.screens.inspector import InspectorScreen

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that checks whether a number is prime, with a docstring."


def inspector_counts(text: str) -> tuple[tuple[int, int], dict[str, tuple[int, int]]]:
    """The inspector's totals (drafted / accepted) and its "by source" row, read back as numbers by label."""
    totals = re.search(r"drafted / accepted\s+(\d+) / (\d+)", text)
    row = re.search(r"by source\s+(.+)", text)
    assert totals is not None and row is not None, text
    by_source = {
        label: (int(d), int(a))
        for label, d, a in re.findall(r"([\w-]+(?: [\w-]+)*) (\d+)/(\d+)", row.group(1))
    }
    return (int(totals.group(1)), int(totals.group(2))), by_source


def labelled(stats: dict) -> dict[str, tuple[int, int]]:
    """A stored or logged record's per-source counts, by the label the inspector gives each source."""
    return {
        source_label(name): (drafted, stats["accepted_by"].get(name, 0))
        for name, drafted in stats["drafted_by"].items()
        if drafted > 0
    }


async def test_store_metrics_log_and_inspector_agree_on_a_history_drafted_reply(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf

    config = Settings(data_dir=tmp_path, seed=7, preset="code")
    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=2048)
    session = ChatSession(config, backend=backend, save=True)
    app = SpecchatApp(config, session=session)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.state != "loading", timeout=300)
            backend.target.costs = FreeVerify()
            session.set_overrides(temperature=0.0, max_new_tokens=64)
            await send(pilot, PROMPT, wait=False)
            await wait_until(
                pilot, lambda: app.chat.chat_log.replies() and not app.chat.generating, timeout=120
            )
            first = app.chat.chat_log.replies()[-1].stats
            await pilot.press("ctrl+r")
            await wait_until(
                pilot,
                lambda: (
                    app.chat.chat_log.replies()[-1].stats not in (None, first) and not app.chat.generating
                ),
                timeout=120,
            )
            stats = app.chat.chat_log.replies()[-1].stats
            assert stats.accepted_by.get("history", 0) > 0, stats.drafted_by  # history drafted, and was taken
            await pilot.press("ctrl+s")
            await wait_until(
                pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.stats is not None
            )
            totals, shown = inspector_counts(plain(app.screen.query_one("#inspector-fields")))
            await pilot.press("escape")
        stored = session.recorder.store.messages(session.chat_id)[-1].stats
        logged = session.metrics_rows()[-1]
        # Added up: each place's sources sum to the reply's totals.
        for record in (stored, logged):
            assert sum(record["drafted_by"].values()) == record["drafted_tokens"]
            assert sum(record["accepted_by"].values()) == record["accepted_tokens"]
        assert tuple(map(sum, zip(*shown.values(), strict=True))) == totals
        # And the three places say the same numbers.
        assert labelled(stored) == labelled(logged) == shown
        assert (stored["drafted_tokens"], stored["accepted_tokens"]) == totals
        assert (logged["drafted_tokens"], logged["accepted_tokens"]) == totals
    finally:
        backend.close()
