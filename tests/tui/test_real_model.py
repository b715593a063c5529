"""The real app on the real transformers backend and the embedded SmolLM2 (slow: loads a model)."""

from __future__ import annotations

import re

import pytest

from engine.config import Settings
from tests.support.isolation import isolated_config_and_data  # noqa: F401
from tests.support.tui import SIZE, wait_until
from tui.app import SpecchatApp


@pytest.mark.slow
async def test_real_reply_on_embedded_model(smol_dir):
    settings = Settings(model=smol_dir, backend="transformers", seed=7, max_context=1024)
    app = SpecchatApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state != "loading", timeout=300)
        assert app.state == "ready", app.load_error
        assert app.session.info.backend == "transformers"
        app.session.set_overrides(max_new_tokens=24)
        await pilot.press("f3")
        app.chat.prompt.set_text("What is the capital of France?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.chat_log.replies() and not app.chat.generating, timeout=300)
        reply = app.chat.chat_log.replies()[-1]
        assert reply.text.strip() and not reply.failed
        assert reply.markdown.source == reply.text == app.session.turns[-1].content
        assert reply.stats is not None and reply.stats.new_tokens > 0
        assert re.search(
            r"\d+ tok · [\d.–]+ tok/s · ttft [\d.]+ m?s · (accept \d+%|draft off|no drafts)",
            str(reply.query_one(".stats").content),
        )
        bar = app.chat.status_bar.plain
        assert bar.startswith("○ qa │ K 5 │ T 0.50") and "transformers·cpu" in bar
        # Origins line up with the tokens: the reply's characters and its origin runs have the same length.
        assert sum(len(text) for text, _ in reply.runs) == len(reply.text)
        await pilot.press("f6")
        assert reply.markdown.display and reply.highlight
