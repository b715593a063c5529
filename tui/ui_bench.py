"""UI benchmark: does the chat cost the model speed, can the chat log keep up, does the app stay responsive?

Two parts, both through the real app (headless, under Pilot):
  - the real model (the configured one, or the embedded one): the same prompt, preset and seed answered by the
    session alone (what `specchat generate` does) and by the chat, alternating (generate, chat, generate, ...,
    generate: each chat run between two of generate) at 80x24 and 160x48; printed: each side's median tok/s and
    their ratio, the paired ratio (each chat run over the mean of the generate runs either side of it, the median
    of those; target >= 0.95), whether both produced the same text, and the share of a core the UI (main) thread
    and the model's threads used while the reply streamed (target: main thread < 0.25 of a core over a reply of
    STEADY_TOKENS or more; a shorter one's share is mostly the new exchange's first layout, printed in ms with no
    target). Headless: the app renders every frame but writes no escape codes, so a real terminal costs a little
    more (measure it in tmux: docs/usage.md, "The chat").
  - a scripted backend streams 4,000 tokens at 2,000 tokens/s: render lag from the last token to the final text on
    screen (< 0.5 s) and the delay of keys typed while it streams (p95 < 100 ms).
This is a benchmark, not a test: it prints numbers measured in one run and asserts nothing.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from textual import events

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.config import Settings
from tui.formatting import number

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
        app.chat.prompt.set_text("stream please")
        driver = app._driver
        assert driver is not None
        # Send with a raw key event: Pilot.press would wait for the app to go idle, i.e. for the whole reply.
        enter = events.Key("enter", None)
        enter.set_sender(app)
        driver.send_message(enter)
        while not app.chat.generating:
            await asyncio.sleep(0.001)
        # Type into the prompt while the reply streams; each key's delay is send -> prompt text changed.
        while app.chat.generating:
            before = len(app.chat.prompt.text)
            key = events.Key("x", "x")
            key.set_sender(app)
            sent = time.perf_counter()
            driver.send_message(key)
            while len(app.chat.prompt.text) == before:
                await asyncio.sleep(0.0005)
            key_delays.append(time.perf_counter() - sent)
            await asyncio.sleep(KEY_INTERVAL_S)
        while app.chat.lifecycle.rendered_at is None:
            await asyncio.sleep(0.001)
        reply_widget = app.chat.chat_log.replies()[-1]
        shown_all = reply_widget.markdown.source == reply
        lag = app.chat.lifecycle.rendered_at - (
            app.chat.lifecycle.last_chunk_t or app.chat.lifecycle.rendered_at
        )
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


# --- the real model: the chat against the session alone -----------------------------------------------------

# (label, prompt, preset, runs per repeat): a short answer and a long story (500+ tokens), as a user would send
# them. The short answer's rate is over ~6 decode intervals of ~12 ms, where one scheduling hiccup moves a run by
# 10-20%: its runs are cheap (~1 s each), so it takes 4 per repeat and its median reads steadier.
REAL_PROMPTS = (
    ("short qa", "What is the capital of France? Answer in one sentence.", "qa", 4),
    (
        "long story",
        "Write a long story about a lighthouse keeper who finds a map in a bottle.",
        "creative",
        1,
    ),
)
SIZES = ((80, 24), (160, 48))
SEED = 3
# A reply this long streams for seconds: the UI thread's share is the streaming's. Below it, laying out the new
# exchange (80-100 ms of the UI thread on the Zen 1) over a ~0.2 s reply reads 0.3-0.4 of a core while the chat
# keeps 0.99x generate: the share says nothing about streaming there, so it is printed in ms without a target.
STEADY_TOKENS = 200
UI_SHARE_TARGET = 0.25


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by native thread id (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def _cpu_shares(before: dict[int, float], after: dict[int, float], wall: float) -> tuple[float, float]:
    """(main thread's share of a core, all other threads' together) between two snapshots."""
    main = threading.main_thread().native_id
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    main_share = used.pop(main, 0.0) / wall if wall > 0 else 0.0
    return main_share, sum(used.values()) / wall if wall > 0 else 0.0


def _loaded_session(settings: Any, backend: Any) -> Any:
    """A ChatSession on an already loaded backend: both sides share one model (and its thread choice)."""
    from engine.session import ChatSession

    session = ChatSession(settings, backend=backend)
    session._info = backend.info  # loaded once for the whole bench; loading again would measure threads again
    return session


def _generate_once(settings: Any, backend: Any, prompt: str, preset: str) -> dict:
    session = _loaded_session(settings, backend)
    session.set_mode(preset)
    before, start = thread_cpu_seconds(), time.perf_counter()
    result = session.send(prompt, on_event=lambda _event: None, cancel=threading.Event())
    wall = time.perf_counter() - start
    main, others = _cpu_shares(before, thread_cpu_seconds(), wall)
    stats = getattr(result, "stats", None)
    return {
        "text": getattr(result, "text", ""),
        "tokens": stats.new_tokens if stats else 0,
        "tok_s": stats.decode_tokens_per_s if stats else 0.0,
        "main": main,
        "main_s": main * wall,  # the UI thread's CPU seconds (to the kernel's 10 ms tick)
        "others": others,
    }


async def _chat_once(settings: Any, backend: Any, prompt: str, preset: str, size: tuple[int, int]) -> dict:
    from tui.app import SpecchatApp

    session = _loaded_session(settings, backend)
    session.set_mode(preset)
    app = SpecchatApp(settings, session=session, load_on_mount=False)
    async with app.run_test(size=size) as pilot:
        app.model_ready(backend.info)
        await pilot.pause(0.5)  # the first layout and the load toast settle before the clock starts
        app.chat.prompt.set_text(prompt)
        driver = app._driver
        assert driver is not None
        enter = events.Key("enter", None)
        enter.set_sender(app)
        before, start = thread_cpu_seconds(), time.perf_counter()
        driver.send_message(enter)
        # The reply's thread is awaited, not polled: a poll's wake-ups run on the UI thread too (a 20 Hz poll
        # took 3.5 ms of it a second, charged to the chat).
        while not (workers := [w for w in app.workers if w.name == "generate"]):
            await asyncio.sleep(0.005)
        await workers[0].wait()
        while app.chat.generating:
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - start
        main, others = _cpu_shares(before, thread_cpu_seconds(), wall)
        turn = session.turns[-1] if session.turns else None
        stats = turn.stats if turn is not None else None
    return {
        "text": turn.content if turn is not None else "",
        "tokens": stats.new_tokens if stats else 0,
        "tok_s": stats.decode_tokens_per_s if stats else 0.0,
        "main": main,
        "main_s": main * wall,  # the UI thread's CPU seconds (to the kernel's 10 ms tick)
        "others": others,
    }


def _alternating_runs(
    settings: Any, backend: Any, prompt: str, preset: str, size: tuple[int, int], repeats: int, threads: Any
) -> tuple[list[dict], list[dict]]:
    """`repeats` runs of the chat, each between two runs of generate (generate, chat, generate, ..., generate); the
    backend's threads put back if it dropped some."""
    gen: list[dict] = [_generate_once(settings, backend, prompt, preset)]
    chat: list[dict] = []
    for _ in range(repeats):
        chat.append(asyncio.run(_chat_once(settings, backend, prompt, preset, size)))
        gen.append(_generate_once(settings, backend, prompt, preset))
        if threads and getattr(backend, "threads", threads) != threads:
            print(f"  note: the backend dropped to {backend.threads} thread(s) during the run")
            backend.set_threads(threads)
    return gen, chat


def paired_ratio(gen: list[dict], chat: list[dict]) -> float | None:
    """The median over the chat's runs of each one's tok/s over the mean of the generate runs either side of it
    (`gen` one longer than `chat`, alternating): on a host whose speed drifts between runs, steadier than the
    medians' ratio. None where the runs do not alternate so."""
    if len(gen) != len(chat) + 1:
        return None
    pairs = []
    for i, run in enumerate(chat):
        around = ((gen[i]["tok_s"] or 0.0) + (gen[i + 1]["tok_s"] or 0.0)) / 2
        if around > 0:
            pairs.append((run["tok_s"] or 0.0) / around)
    return statistics.median(pairs) if pairs else None


def _comparison_row(label: str, size: tuple[int, int], gen: list[dict], chat: list[dict]) -> dict:
    """One prompt and size's figures: the medians of each side, the ratio, whether the texts agree."""
    gen_tps = statistics.median(r["tok_s"] or 0.0 for r in gen)
    chat_tps = statistics.median(r["tok_s"] or 0.0 for r in chat)
    return {
        "label": label,
        "size": f"{size[0]}x{size[1]}",
        "tokens": chat[-1]["tokens"],
        "same_text": all(r["text"] == gen[0]["text"] for r in gen + chat),
        "generate_tok_s": gen_tps,
        "chat_tok_s": chat_tps,
        "ratio": chat_tps / gen_tps if gen_tps else 0.0,
        "paired": paired_ratio(gen, chat),
        "chat_main_thread": statistics.median(r["main"] for r in chat),
        "chat_main_ms": statistics.median(r["main_s"] for r in chat) * 1000,
        "generate_main_thread": statistics.median(r["main"] for r in gen),
        # The chat generates on a worker thread: every thread but the UI's is the model's. `generate` runs
        # the model on the main thread (with one llama.cpp thread, all of it): its whole process counts.
        "chat_model_threads": statistics.median(r["others"] for r in chat),
        "generate_process": statistics.median(r["main"] + r["others"] for r in gen),
    }


def _print_row(row: dict) -> None:
    print(
        f"  {row['label']:<10} {row['size']:>6} {row['tokens']:>4} tok  generate {row['generate_tok_s']:5.1f} tok/s  "
        f"chat {row['chat_tok_s']:5.1f} tok/s  ratio {row['ratio']:.2f}  "
        f"paired {number(row['paired'], 2)} (target >= 0.95)  "
        f"same text: {row['same_text']}"
    )
    if row["tokens"] >= STEADY_TOKENS:
        ui = f"UI thread {row['chat_main_thread']:.2f} of a core (target < {UI_SHARE_TARGET})"
    else:
        ui = (
            f"UI thread {row['chat_main_ms']:.0f} ms, {row['chat_main_thread']:.2f} of a core (a reply under "
            f"{STEADY_TOKENS} tokens: mostly its first layout; the target is for long replies)"
        )
    print(
        f"  {'':<10} {'':>6}           {ui}"
        f" · the model {row['chat_model_threads']:.2f} cores in the chat, "
        f"{row['generate_process']:.2f} in generate"
    )


def run_chat_vs_generate(settings: Any = None, repeats: int = 2, quick: bool = False) -> list[dict]:
    """The chat's tok/s against the session alone, same prompt, preset and seed, alternating; prints a table."""
    from engine.backends.select import create_backend
    from engine.config import load_settings
    from engine.models import ensure_embedded_model

    settings = settings or load_settings()
    settings = settings.model_copy(update={"seed": SEED if settings.seed is None else settings.seed})
    if settings.model is None:
        settings = settings.model_copy(update={"model": ensure_embedded_model()})
    backend, _ = create_backend(settings)
    backend.load()
    threads = getattr(backend, "threads", None)
    prompts = REAL_PROMPTS[:1] if quick else REAL_PROMPTS
    print(
        f"chat vs generate: {backend.info.model} on {backend.info.backend}·{backend.info.device}"
        + (f", {threads} model threads" if threads else "")
        + f", seed {settings.seed}, {repeats} chat runs each ({repeats * REAL_PROMPTS[0][3]} of the short answer),"
        " each between two of generate; paired: each chat run over the generate runs either side of it, the median"
    )
    rows: list[dict] = []
    for label, prompt, preset, runs in prompts:
        for size in SIZES:
            gen, chat = _alternating_runs(settings, backend, prompt, preset, size, repeats * runs, threads)
            row = _comparison_row(label, size, gen, chat)
            rows.append(row)
            _print_row(row)
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    return rows


if __name__ == "__main__":
    run_chat_vs_generate()
    run_ui_bench()
