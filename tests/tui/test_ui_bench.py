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
    assert row["paired"] is None  # one run of each: no generate run after the chat's


def test_the_paired_ratio_takes_each_chat_run_over_the_generate_runs_either_side() -> None:
    """A host that slows down between runs: the medians' ratio reads it as the chat's cost, the pairs do not."""
    gen = [{"tok_s": t} for t in (40.0, 36.0, 32.0, 28.0)]
    chat = [{"tok_s": t} for t in (38.0, 34.0, 27.0)]
    # 38 / 38, 34 / 34, 27 / 30
    assert ui_bench.paired_ratio(gen, chat) == 1.0
    assert ui_bench.paired_ratio(gen[:3], chat) is None
    assert ui_bench.paired_ratio([{"tok_s": 0.0}, {"tok_s": None}], [{"tok_s": 5.0}]) is None
