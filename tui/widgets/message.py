"""Chat messages: the user's (plain Markdown) and the assistant's (streamed Markdown + stats line).

A reply streams through `MarkdownStream` (it re-parses only the last block per append). When it ends, the
stream is flushed and the final text is rendered in full with `Markdown.update()` unless the streamed document
already is that render: same source and the same top-level blocks as a full parse (checked by parsing, which is
cheap; re-mounting every block of a long reply is what is slow). Streamed and full renders were compared block by
block, fences included, on random chunkings with Textual 8: equal.

Draft highlighting (F6) keeps the Markdown: each rendered block's text is aligned with its source lines (the
rendered text is a subsequence of the source: markup and fence markers are what it leaves out), and the characters
that came from accepted drafts get DRAFT_STYLE on top of the block's own styles (code highlighting included);
those accepted from history drafts (what the chat already wrote: engine/decoding/drafters/history.py) get
HISTORY_STYLE instead.
"""

from __future__ import annotations

import asyncio
import functools
import re
import weakref
from typing import TYPE_CHECKING

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.content import Content, Span
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownBlock

from engine.events import MessageStats
from engine.origins import OriginRun, merge_runs
from engine.reasoning import split_reasoning
from tui.formatting import stats_line
from tui.keymap import MESSAGE_KEYS, bindings, bound_keys

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

DRAFT_STYLE = "bold #7ee787 on #12361f"
HISTORY_STYLE = (
    "bold #79c0ff on #0d2a4a"  # accepted from a history draft: copied from what the chat wrote before
)
TARGET_STYLE = ""

_CODE_BLOCK_RE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _soft_breaks_to_hard(state: StateCore) -> None:
    for token in state.tokens:
        if token.type == "inline" and token.children:
            for child in token.children:
                if child.type == "softbreak":
                    child.type = "hardbreak"


@functools.cache
def chat_markdown_parser() -> MarkdownIt:
    """GitHub-flavoured Markdown where a single newline is a line break, as in every chat UI (poems, lists of
    lines, addresses keep their shape). Code blocks are unaffected: their text never had soft breaks.

    Raw HTML is off: a terminal cannot show it, and Textual's Markdown drops HTML tokens, so a model's
    `<<Chapter One>>` or `a <b> c` would lose its text; as plain text it shows as written.
    One parser for the whole app (the widget asks for one per streamed append; building it costs more than a
    short parse): parsing keeps no state between calls, and it only runs on the UI thread."""
    parser = MarkdownIt("gfm-like", {"html": False})
    parser.core.ruler.push("chat_hard_breaks", _soft_breaks_to_hard)
    return parser


def thinking_title(thinking: str, stats: MessageStats | None) -> str:
    """The one line a folded reasoning shows: its size and, where it drafted, its own acceptance."""
    if stats is None or not stats.thinking_tokens:
        return f"thinking · {len(thinking.split())} words"
    accept = stats.thinking_acceptance_rate
    rate = f" · accept {accept * 100:.0f}%" if accept is not None else ""
    return f"thinking · {stats.thinking_tokens} tok{rate}"


def code_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced code blocks, in order (an unclosed fence at the end counts)."""
    return [block.rstrip("\n") for block in _CODE_BLOCK_RE.findall(markdown)]


def last_code_block(markdown: str) -> str | None:
    """The body of the last fenced code block (an unclosed fence at the end counts), or None."""
    blocks = code_blocks(markdown)
    return blocks[-1] if blocks else None


def origin_style(origin: bool | str) -> str:
    """The colour of text by its origin (engine.origins): none for the target's own, HISTORY_STYLE for a history
    draft's, DRAFT_STYLE for any other accepted draft (its source said or not)."""
    if not origin:
        return TARGET_STYLE
    return HISTORY_STYLE if origin == "history" else DRAFT_STYLE


def drafted_mask(runs: list[OriginRun]) -> list[str]:
    """One style per character of the reply: its origin's (`origin_style`); "" where the target wrote it."""
    mask: list[str] = []
    for text, origin in runs:
        mask.extend([origin_style(origin)] * len(text))
    return mask


ALIGN_WINDOW = (
    256  # how far ahead in the source a rendered character is looked for (link targets are skipped)
)


def align_to_source(rendered: str, source: str) -> list[int | None]:
    """For each rendered character, the index of the source character it shows (None where none is found).

    Greedy subsequence match: Markdown rendering drops markup and collapses whitespace, it does not reorder, so
    walking both left to right finds each rendered character at or after the previous one.
    """
    positions: list[int | None] = []
    cursor = 0
    for char in rendered:
        end = min(len(source), cursor + ALIGN_WINDOW)
        found = None
        for index in range(cursor, end):
            candidate = source[index]
            if candidate == char or (char.isspace() and candidate.isspace()):
                found = index
                break
        positions.append(found)
        if found is not None:
            cursor = found + 1
    return positions


def draft_spans(rendered: str, source: str, mask: list[str], offset: int) -> list[Span]:
    """Spans of `rendered` whose source characters (at `offset` in the reply) came from accepted drafts, each in
    its origin's style (`drafted_mask`)."""
    spans: list[Span] = []
    start, style = None, ""
    for index, position in enumerate(align_to_source(rendered, source)):
        here = mask[offset + position] if position is not None and offset + position < len(mask) else ""
        if here != style:
            if style and start is not None:
                spans.append(Span(start, index, style))
            start, style = (index, here) if here else (None, "")
    if style and start is not None:
        spans.append(Span(start, len(rendered), style))
    return spans


class UserMessage(Vertical, can_focus=True):
    """One message of the user's. Selectable (alt+up/down) to edit it (a new branch) or page its branches."""

    def __init__(self, text: str, waiting: bool = False) -> None:
        super().__init__(classes="message user")
        self.text = text
        self.waiting = waiting
        self.header = ""  # "branch 2/3 (alt+left / alt+right)", "editing …"

    def compose(self):
        yield Static(self._role(), classes="role")
        yield Markdown(self.text, classes="body", parser_factory=chat_markdown_parser)

    def _role(self) -> Text:
        note = (
            "  ◌ waiting for the model to load" if self.waiting else f"  {self.header}" if self.header else ""
        )
        return Text.assemble("you", (note, "dim"))

    def set_header(self, header: str) -> None:
        self.header = header
        if self.is_mounted:
            self.query_one(".role", Static).update(self._role())

    def on_key(self, event: events.Key) -> None:
        # As on a selected reply: typing is for the prompt.
        if event.is_printable and event.character:
            event.stop()
            event.prevent_default()
            self.post_message(ReplyMessage.TypedAhead(self, event.character))  # type: ignore[arg-type]

    def set_waiting(self, waiting: bool) -> None:
        """A message sent while the model loads is shown as waiting until it is sent."""
        self.waiting = waiting
        self.set_class(waiting, "waiting")
        self.query_one(".role", Static).update(self._role())


async def stop_stream(stream: MarkdownStream) -> None:
    """`MarkdownStream.stop()`, safe for a stream whose task has not taken its first step yet.

    stop() cancels the stream's task and awaits it. A task cancelled before its first step never enters its own
    `except CancelledError`, so the await raises CancelledError in the caller: the app's message handler, which
    ends the app's message loop (the UI froze). It happens when a reply's last events are handled back to back
    with no turn of the event loop between them (the reasoning opened, then the reply ended: seen under CPU
    load). One yield lets the task start first.
    """
    await asyncio.sleep(0)
    await stream.stop()


class ReplyMessage(Vertical, can_focus=True):
    """One assistant reply. Focus it (click, alt+up/down) and press `i` for its statistics."""

    BINDINGS = bindings(MESSAGE_KEYS)

    class InspectRequested(Message):
        def __init__(self, reply: ReplyMessage) -> None:
            super().__init__()
            self.reply = reply

    class TypedAhead(Message):
        """A printable key pressed while this reply was selected: it belongs in the prompt."""

        def __init__(self, reply: ReplyMessage, character: str) -> None:
            super().__init__()
            self.reply = reply
            self.character = character

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
        self.next_code_block = 0  # which code block ctrl+b copies next (one per press, in reading order)
        self._stream: MarkdownStream | None = None
        # A thinking reply's reasoning streams into its own folded Markdown; `_written` is what each view has.
        self._thinking_stream: MarkdownStream | None = None
        self._written = {"answer": "", "thinking": ""}
        # Blocks coloured for draft highlighting: block -> (its own content, the coloured one we set).
        self._painted: weakref.WeakKeyDictionary[MarkdownBlock, tuple[Content, Content]] = (
            weakref.WeakKeyDictionary()
        )

    def compose(self):
        yield Static("assistant", classes="role")
        with Collapsible(title="thinking…", collapsed=True, classes="thinking"):
            yield Markdown("", classes="thinking-body", parser_factory=chat_markdown_parser)
        yield Markdown("", classes="body", parser_factory=chat_markdown_parser)
        yield Static("…", classes="stats")

    def on_mount(self) -> None:
        self.thinking.display = False

    @property
    def markdown(self) -> Markdown:
        """The answer (the whole reply when it has no reasoning)."""
        return self.query_one("Markdown.body", Markdown)

    @property
    def thinking(self) -> Collapsible:
        return self.query_one(".thinking", Collapsible)

    @property
    def thinking_markdown(self) -> Markdown:
        return self.query_one("Markdown.thinking-body", Markdown)

    @property
    def answer_text(self) -> str:
        return split_reasoning(self.text).answer

    def set_header(self, header: str) -> None:
        self.header = header
        self.query_one(".role", Static).update(Text.assemble("assistant", ("  " + header, "dim")))

    def set_stopping(self) -> None:
        """Esc was pressed: said at once, however long the model takes to notice (a long prefill slice)."""
        if self.streaming:
            self.query_one(".stats", Static).update(Text("■ stopping…", style="bold yellow"))

    async def append_runs(self, runs: list[OriginRun]) -> None:
        """Add streamed text (UI thread, once per drained batch)."""
        if not runs:
            return
        merge_runs(self.runs, runs)
        self.text += "".join(text for text, _ in runs)
        split = split_reasoning(self.text)
        if split.undecided:
            return  # "<thi…": reasoning or not, the next batch tells
        if split.has_thinking:
            self.thinking.display = True
            if self._thinking_stream is None:
                self._thinking_stream = Markdown.get_stream(self.thinking_markdown)
            await self._stream_into("thinking", self._thinking_stream, self.thinking_markdown, split.thinking)
            if not split.closed:
                self.thinking.title = f"thinking… {len(split.thinking.split())} words"
        if split.answer:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.markdown)
            await self._stream_into("answer", self._stream, self.markdown, split.answer)
        if self.highlight:
            # The stream renders in its own task: colour what it has rendered once this batch is on screen.
            self.call_after_refresh(self.paint_drafts)

    async def _stream_into(self, view: str, stream: MarkdownStream, markdown: Markdown, wanted: str) -> None:
        """Bring one view up to `wanted`: append the new tail, or (rarely: text taken back) render it afresh."""
        written = self._written[view]
        if wanted == written:
            return
        if wanted.startswith(written):
            await stream.write(wanted[len(written) :])
        else:
            await stop_stream(stream)
            await markdown.update(wanted)
            if view == "answer":
                self._stream = None
            else:
                self._thinking_stream = None
        self._written[view] = wanted

    async def finish(
        self,
        text: str,
        stats: MessageStats | None,
        *,
        cancelled: bool = False,
        error: str = "",
        runs: tuple[OriginRun, ...] | None = None,
        note: str = "",
    ) -> None:
        """The reply ended: stop streaming and render the final text once in full.

        `runs` (a stored reply's origins) colour it as it was coloured when it streamed; `note` is the line
        under a reply without stats (one interrupted mid-stream)."""
        self.streaming = False
        for stream in (self._stream, self._thinking_stream):
            if stream is not None:
                await stop_stream(stream)  # appends whatever is still queued
        self._stream = self._thinking_stream = None
        if runs and "".join(t for t, _ in runs) == text:
            self.runs, self.text = list(runs), text
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
        split = split_reasoning(self.text)
        if not self._streamed_render_is_final(split.answer):
            await self.markdown.update(split.answer)
        if split.has_thinking:
            self.thinking.display = True
            if self.thinking_markdown.source != split.thinking:
                await self.thinking_markdown.update(split.thinking)
            self.thinking.title = thinking_title(split.thinking, stats)
        self._written = {"answer": split.answer, "thinking": split.thinking}
        if self.highlight:
            self.paint_drafts()
        line = stats_line(stats, cancelled) if stats is not None else note
        if note and stats is None:
            self.add_class("interrupted")
        if error:
            line = Text.assemble(("✖ " + error, "bold red"), ("  " + line if line else "", "dim"))
            self.add_class("failed")
        elif cancelled:
            self.add_class("cancelled")
        self.query_one(".stats", Static).update(line)

    def _streamed_render_is_final(self, answer: str | None = None) -> bool:
        """True when the streamed Markdown shows exactly what a full render of the final answer would."""
        if answer is None:
            answer = self.answer_text
        markdown = self.markdown
        if markdown.source != answer:
            return False
        tokens = chat_markdown_parser().parse(answer)
        top_level = sum(1 for t in tokens if t.level == 0 and t.nesting >= 0)
        blocks = sum(1 for child in markdown.children if isinstance(child, MarkdownBlock))
        return top_level == blocks

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        self.paint_drafts()

    def paint_drafts(self) -> None:
        """Colour (or, with highlighting off, uncolour) the accepted draft text in every rendered block."""
        split = split_reasoning(self.text)
        mask = drafted_mask(self.runs) if self.highlight else []
        self._paint(self.markdown, split.answer_start if split.has_thinking else 0, mask)
        if split.has_thinking:
            self._paint(self.thinking_markdown, split.thinking_start, mask)

    def _paint(self, markdown: Markdown, base: int, mask: list[str]) -> None:
        """Paint one Markdown view whose source starts at `base` in the reply."""
        source = markdown.source
        line_starts = [0]
        for line in source.splitlines(keepends=True):
            line_starts.append(line_starts[-1] + len(line))
        for block in markdown.query(MarkdownBlock):
            current = block._content
            painted = self._painted.get(block)
            # A block the stream re-rendered since it was painted holds its own content again.
            original = painted[0] if painted is not None and painted[1] is current else current
            if not original.plain:
                continue
            if self.highlight and painted is not None and painted[1] is current:
                continue  # painted and unchanged since: earlier text keeps its origins
            if not self.highlight:
                if painted is not None and painted[1] is current:
                    block.set_content(original)
                self._painted.pop(block, None)
                continue
            first, last = block.source_range
            first, last = min(first, len(line_starts) - 1), min(last, len(line_starts) - 1)
            offset = line_starts[first]
            spans = draft_spans(original.plain, source[offset : line_starts[last]], mask, base + offset)
            coloured = original.add_spans(spans) if spans else original
            if coloured is not current:
                block.set_content(coloured)
            self._painted[block] = (original, coloured)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "copy_code":
            # In the footer (and on the key) only where there is a code block to copy.
            return not self.streaming and last_code_block(self.answer_text) is not None
        return True

    def on_key(self, event: events.Key) -> None:
        # Typing is for the prompt: a printable key (unless the user's keymap gave it to a reply) goes there,
        # before the reply's bindings could take it.
        if not event.is_printable or not event.character:
            return
        if event.key in bound_keys(MESSAGE_KEYS, getattr(self.app, "keymap", {})):
            return
        event.stop()
        event.prevent_default()
        self.post_message(self.TypedAhead(self, event.character))

    def action_inspect(self) -> None:
        self.post_message(self.InspectRequested(self))

    def action_copy(self) -> None:
        self.post_message(self.CopyRequested(self, code_only=False))

    def action_copy_code(self) -> None:
        self.post_message(self.CopyRequested(self, code_only=True))
