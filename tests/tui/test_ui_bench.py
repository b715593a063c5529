"""`specchat bench --ui` drives the real app: its chat run and its generate run answer the same prompt with the same
text, and each says how many tokens it timed (the chat run once broke silently when the app's API changed)."""

from __future__ import annotations

import asyncio

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from tui import ui_bench


def test_the_chat_run_and_the_generate_run_answer_alike() -> None:
    backend = ScriptedBackend(tokens_per_s=400)
    backend.load()
    settings = Settings(seed=ui_bench.SEED)
    generated = ui_bench._generate_once(settings, backend, "Hello there", "qa")
    chatted = asyncio.run(ui_bench._chat_once(settings, backend, "Hello there", "qa", (80, 24)))
    assert chatted["tokens"] > 0 and chatted["tok_s"] > 0
    assert chatted["text"] == generated["text"] and chatted["tokens"] == generated["tokens"]
    row = ui_bench._comparison_row("hello", (80, 24), [generated], [chatted])
    assert row["same_text"] and row["ratio"] > 0
