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


def test_the_ui_threads_target_is_printed_for_long_replies_only(capsys) -> None:
    """A short answer's UI share is its first layout over a ~0.2 s reply (0.3-0.4 of a core at 0.99x generate):
    it is printed in ms without the streaming target; a long reply's share is held to the target."""

    def row(tokens: int) -> dict:
        run = {"tok_s": 50.0, "text": "x", "tokens": tokens, "main": 0.36, "main_s": 0.072, "others": 1.9}
        return ui_bench._comparison_row("r", (80, 24), [run, run], [run])

    ui_bench._print_row(row(ui_bench.STEADY_TOKENS - 1))
    short = capsys.readouterr().out
    assert "UI thread 72 ms, 0.36 of a core" in short and "target < 0.25" not in short
    ui_bench._print_row(row(ui_bench.STEADY_TOKENS))
    long = capsys.readouterr().out
    assert "UI thread 0.36 of a core (target < 0.25)" in long
