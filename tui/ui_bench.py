"""UI benchmark: can the chat log keep up with a fast model, and does the app stay responsive meanwhile?

A scripted backend streams 4,000 tokens at 2,000 tokens/s through the real app (headless, under Pilot).
Printed figures (targets in brackets):
  - render lag: seconds from the last token leaving the backend to the final text being on screen (< 0.5 s)
  - key delay p95: how long a keypress typed during streaming waits to be handled (< 100 ms)
This is a benchmark, not a test: it prints numbers measured in one run and asserts nothing.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from textual import events

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.config import Settings

TOKENS = 4000
TOKENS_PER_S = 2000.0
KEY_INTERVAL_S = 0.05


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


async def _measure(tokens: int, tokens_per_s: float, paragraphs: bool) -> dict:
    from tui.app import SpecchatApp

    # Prose in paragraphs of 6 lines with every 4th paragraph a code block, like a long LLM answer; or the
    # worst case for a Markdown view, one 4,000-word paragraph that must be re-wrapped on every repaint.
    source = scripted_words(
        tokens + 200, paragraph_lines=6 if paragraphs else 0, code_every=4 if paragraphs else 0
    )
    backend = ScriptedBackend(
        replies=[source], tokens_per_s=tokens_per_s, accept_pattern=(3, 1, 4, 0, 2, 4), max_context=16384
    )
    reply = backend.decode(backend.encode(source)[:tokens])
    presets_k = {"k": 4}
    app = SpecchatApp(Settings(preset="qa"), backend=backend)
    key_delays: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.state == "loading":
            await pilot.pause(0.01)
        app.session.set_overrides(max_new_tokens=tokens, **presets_k)
        app.prompt.set_text("stream please")
        driver = app._driver
        assert driver is not None
        # Send with a raw key event: Pilot.press would wait for the app to go idle, i.e. for the whole reply.
        enter = events.Key("enter", None)
        enter.set_sender(app)
        driver.send_message(enter)
        while not app.generating:
            await asyncio.sleep(0.001)
        # Type into the prompt while the reply streams; each key's delay is send -> prompt text changed.
        while app.generating:
            before = len(app.prompt.text)
            key = events.Key("x", "x")
            key.set_sender(app)
            sent = time.perf_counter()
            driver.send_message(key)
            while len(app.prompt.text) == before:
                await asyncio.sleep(0.0005)
            key_delays.append(time.perf_counter() - sent)
            await asyncio.sleep(KEY_INTERVAL_S)
        while app.last_reply_rendered_at is None:
            await asyncio.sleep(0.001)
        reply_widget = app.chat_log.replies()[-1]
        shown_all = reply_widget.markdown.source == reply
        lag = app.last_reply_rendered_at - (app.last_reply_last_chunk_t or app.last_reply_rendered_at)
        stats = reply_widget.stats
    return {
        "tokens": stats.new_tokens if stats else 0,
        "stream_tokens_per_s": stats.decode_tokens_per_s if stats else None,
        "render_lag_s": lag,
        "shown_all": shown_all,
        "keys_typed": len(key_delays),
        "key_delay_p50_ms": statistics.median(key_delays) * 1000 if key_delays else None,
        "key_delay_p95_ms": _p95(key_delays) * 1000 if key_delays else None,
        "key_delay_max_ms": max(key_delays) * 1000 if key_delays else None,
    }


def _report(label: str, result: dict) -> None:
    print(f"{label}: {result['tokens']} tokens streamed at {result['stream_tokens_per_s'] or 0:.0f} tok/s")
    print(
        f"  render lag after last token: {result['render_lag_s']:.3f} s   (target < 0.5 s; all text shown: "
        f"{result['shown_all']})"
    )
    print(
        f"  keypress delay while streaming: p50 {result['key_delay_p50_ms']:.1f} ms, "
        f"p95 {result['key_delay_p95_ms']:.1f} ms, max {result['key_delay_max_ms']:.1f} ms "
        f"over {result['keys_typed']} keys   (target p95 < 100 ms)"
    )


def run_ui_bench(tokens: int = TOKENS, tokens_per_s: float = TOKENS_PER_S, worst_case: bool = True) -> dict:
    """Stream a long answer through the real app and print the figures; returns them (worst case nested)."""
    result = asyncio.run(_measure(tokens, tokens_per_s, paragraphs=True))
    _report("ui bench (paragraphs + code blocks)", result)
    if worst_case:
        result["single_paragraph"] = asyncio.run(_measure(tokens, tokens_per_s, paragraphs=False))
        _report("ui bench worst case (one 4,000-word paragraph)", result["single_paragraph"])
    return result


if __name__ == "__main__":
    run_ui_bench()
