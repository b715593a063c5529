"""A finished reply shows exactly what a full Markdown render of its text shows, whether or not it re-rendered."""

from __future__ import annotations

import pytest
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock

from engine.backends.scripted import ScriptedBackend
from tests.support.tui import SIZE, make_app, send, wait_ready

RICH_REPLY = (
    "# Plan\n\nFirst a paragraph with `inline code` and **bold**.\n\n"
    "```python\ndef area(r):\n    return 3.14159 * r * r\n```\n\n"
    "1. one\n2. two\n   continued\n\n- a\n- b\n\n"
    "| col | val |\n|-----|-----|\n| x   | 1   |\n\n"
    "> quoted\n\n---\n\nThe end:\n\n```\nplain fence\n```\n"
)


def block_signature(markdown: Markdown) -> list[tuple[str, str]]:
    signature = []
    for block in markdown.query(MarkdownBlock):
        code = getattr(block, "code", None)
        signature.append(
            (type(block).__name__, code if code is not None else str(getattr(block, "_content", "")))
        )
    return signature


@pytest.mark.parametrize("accept_pattern", [(0,), (3, 1, 4, 0, 2, 4), (6,)])
async def test_streamed_reply_matches_a_full_render(accept_pattern):
    backend = ScriptedBackend(RICH_REPLY, accept_pattern=accept_pattern)
    app = make_app(backend, preset="code")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "show me")
        reply = app.chat.chat_log.replies()[-1]
        assert reply.markdown.source == RICH_REPLY
        streamed = block_signature(reply.markdown)
        assert reply._streamed_render_is_final()
        await reply.markdown.update(RICH_REPLY)
        await pilot.pause()
        assert block_signature(reply.markdown) == streamed
        kinds = {kind for kind, _ in streamed}
        assert {"MarkdownH1", "MarkdownFence", "MarkdownOrderedList", "MarkdownTable"} <= kinds


async def test_a_reply_whose_final_text_differs_is_rendered_in_full():
    app = make_app(ScriptedBackend("partial text"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        reply = app.chat.chat_log.replies()[-1]
        await reply.finish("partial text, then more\n\n```\ncode\n```\n", reply.stats)
        await pilot.pause()
        assert reply.markdown.source.endswith("```\ncode\n```\n")
        assert any(type(b).__name__ == "MarkdownFence" for b in reply.markdown.query(MarkdownBlock))
