"""Chat messages: the user's (plain Markdown) and the assistant's (streamed Markdown + stats line).

A reply streams through `MarkdownStream` (it re-parses only the last block per append). When it ends, the
stream is flushed and the final text is rendered in full with `Markdown.update()` unless the streamed document
already is that render: same source and the same top-level blocks as a full parse (checked by parsing, which is
cheap; re-mounting every block of a long reply is what is slow). Streamed and full renders were compared block by
block, fences included, on random chunkings with Textual 8: equal. While draft
highlighting is on, the reply shows a Rich `Text` built from (text, from_draft) runs instead of Markdown.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from markdown_it import MarkdownIt
from rich.text import Text
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownBlock

from engine.events import MessageStats
from tui.formatting import stats_line
from tui.keymap import MESSAGE_KEYS, bindings
from tui.streaming import OriginRun, merge_runs

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

DRAFT_STYLE = "bold #7ee787 on #12361f"
TARGET_STYLE = ""

_CODE_BLOCK_RE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def last_code_block(markdown: str) -> str | None:
    """The body of the last fenced code block (an unclosed fence at the end counts), or None."""
    blocks = _CODE_BLOCK_RE.findall(markdown)
    return blocks[-1].rstrip("\n") if blocks else None


def highlighted_text(runs: list[OriginRun]) -> Text:
    text = Text()
    for chunk, from_draft in runs:
        text.append(chunk, DRAFT_STYLE if from_draft else TARGET_STYLE)
    return text


class UserMessage(Vertical):
    def __init__(self, text: str) -> None:
        super().__init__(classes="message user")
        self.text = text

    def compose(self):
        yield Static("you", classes="role")
        yield Markdown(self.text, classes="body")


class ReplyMessage(Vertical, can_focus=True):
    """One assistant reply. Focus it (click, alt+up/down) and press `i` for its statistics."""

    BINDINGS = bindings(MESSAGE_KEYS)

    class InspectRequested(Message):
        def __init__(self, reply: ReplyMessage) -> None:
            super().__init__()
            self.reply = reply

    class CopyRequested(Message):
        def __init__(self, reply: ReplyMessage, code_only: bool) -> None:
            super().__init__()
            self.reply = reply
            self.code_only = code_only

    def __init__(self, highlight: bool = False) -> None:
        super().__init__(classes="message reply")
        self.text = ""
        self.runs: list[OriginRun] = []
        self.stats: MessageStats | None = None
        self.cancelled = False
        self.failed = False
        self.streaming = True
        self.header = ""
        self.highlight = highlight
        self._stream: MarkdownStream | None = None
        # Text that arrived while the coloured view was shown has not been written to the Markdown view.
        self._markdown_stale = False

    def compose(self):
        yield Static("assistant", classes="role")
        yield Markdown("", classes="body")
        yield Static("", classes="highlighted")
        yield Static("…", classes="stats")

    def on_mount(self) -> None:
        self.query_one(".highlighted", Static).display = self.highlight
        self.query_one(Markdown).display = not self.highlight

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    def set_header(self, header: str) -> None:
        self.header = header
        self.query_one(".role", Static).update(Text.assemble("assistant", ("  " + header, "dim")))

    async def append_runs(self, runs: list[OriginRun]) -> None:
        """Add streamed text (UI thread, once per drained batch)."""
        if not runs:
            return
        merge_runs(self.runs, runs)
        fragment = "".join(text for text, _ in runs)
        self.text += fragment
        if self.highlight:
            self._markdown_stale = True
            self.query_one(".highlighted", Static).update(highlighted_text(self.runs))
        else:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.markdown)
            await self._stream.write(fragment)

    async def finish(
        self, text: str, stats: MessageStats | None, *, cancelled: bool = False, error: str = ""
    ) -> None:
        """The reply ended: stop streaming and render the final text once in full."""
        self.streaming = False
        if self._stream is not None:
            await self._stream.stop()  # appends whatever is still queued
            self._stream = None
        if text != self.text:
            # The final text wins (e.g. a failed reply's partial text); keep colours for what we saw.
            if text.startswith(self.text):
                merge_runs(self.runs, [(text[len(self.text) :], False)])
            else:
                self.runs = [(text, False)]
            self.text = text
        self.stats = stats
        self.cancelled = cancelled
        self.failed = bool(error)
        if self._markdown_stale or not self._streamed_render_is_final():
            await self.markdown.update(self.text)
        self._markdown_stale = False
        if self.highlight:
            self.query_one(".highlighted", Static).update(highlighted_text(self.runs))
        line = stats_line(stats, cancelled) if stats is not None else ""
        if error:
            line = Text.assemble(("✖ " + error, "bold red"), ("  " + line if line else "", "dim"))
            self.add_class("failed")
        elif cancelled:
            self.add_class("cancelled")
        self.query_one(".stats", Static).update(line)

    def _streamed_render_is_final(self) -> bool:
        """True when the streamed Markdown shows exactly what a full render of the final text would."""
        markdown = self.markdown
        if markdown.source != self.text:
            return False
        tokens = MarkdownIt("gfm-like").parse(self.text)
        top_level = sum(1 for t in tokens if t.level == 0 and t.nesting >= 0)
        blocks = sum(1 for child in markdown.children if isinstance(child, MarkdownBlock))
        return top_level == blocks

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        highlighted = self.query_one(".highlighted", Static)
        if on:
            highlighted.update(highlighted_text(self.runs))
        highlighted.display = on
        self.markdown.display = not on
        if not on and self._markdown_stale:
            self.run_worker(self._resync_markdown(), group="markdown-resync", exclusive=True)

    async def _resync_markdown(self) -> None:
        """Back to Markdown mid-reply: render everything so far once, then stream on from there."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._markdown_stale = False
        await self.markdown.update(self.text)

    def action_inspect(self) -> None:
        self.post_message(self.InspectRequested(self))

    def action_copy(self) -> None:
        self.post_message(self.CopyRequested(self, code_only=False))

    def action_copy_code(self) -> None:
        self.post_message(self.CopyRequested(self, code_only=True))
