"""The scrolling conversation, anchored to the bottom while new text arrives: its messages, the banner above them
(loading, a failed load, a config problem), and what is done to them as a whole (a stored chat shown, the last exchange taken
back, a reply selected, draft colours on or off). The app decides when; this widget knows how.

Turns trimmed out of the model's context stay on screen, dimmed (class `out-of-context`), with one
rule above the first message the model still sees (`mark_context`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from tui.formatting import interrupted_line
from tui.reply_header import stored_header
from tui.widgets.message import ReplyMessage, UserMessage


class ChatLog(VerticalScroll, can_focus=False):
    def compose(self):
        yield Static("", id="banner")

    def on_mount(self) -> None:
        self.anchor()

    @property
    def banner(self) -> Static:
        return self.query_one("#banner", Static)

    def set_banner(self, text: Text | None, error: bool = False) -> None:
        banner = self.banner
        banner.display = text is not None
        banner.set_class(error, "error")
        if text is not None:
            banner.update(text)

    def show_loading(self, model: str | None = None, draft: str | None = None) -> None:
        """The banner while a model loads: the first one, or (`draft` given) another one for this chat."""
        if draft is None:
            self.set_banner(
                Text.assemble(("◌ Loading the model…", "bold"), ("  you can type already", "dim"))
            )
            return
        name = Path(model).name if model else "the embedded model"
        self.set_banner(
            Text.assemble(
                ("◌ Loading ", "bold"),
                (name, "bold"),
                (f" (draft {Path(draft).name})", "bold"),
                ("  the chat stays; you can type already", "dim"),
            )
        )

    def show_load_progress(self, stage: str) -> None:
        self.set_banner(Text.assemble(("◌ Loading the model: ", "bold"), stage))

    def show_load_failure(self, message: str, title: str = "The model did not load") -> None:
        self.set_banner(Text.assemble((f"✖ {title}: ", "bold red"), message), error=True)

    def show_problems(self, config_error: str | None, skipped_presets: Iterable[str]) -> None:
        """What stays above the chat once the model is loaded: a config problem, and each preset file that was
        skipped (no banner where there is neither)."""
        lines: list[Text] = []
        if config_error:
            lines.append(Text.assemble(("✖ The configuration has a problem: ", "bold red"), config_error))
        for problem in skipped_presets:
            lines.append(Text.assemble(("⚠ Preset file skipped: ", "bold yellow"), problem))
        self.set_banner(Text("\n").join(lines) if lines else None, error=bool(lines))

    async def add_notice(self, text: str) -> ChatNotice:
        """A line from specchat at the end of the chat (kept when the messages change: it is about the model)."""
        notice = ChatNotice(text)
        await self.mount(notice)
        return notice

    def replies(self) -> list[ReplyMessage]:
        return list(self.query(ReplyMessage))

    def messages(self) -> list[UserMessage | ReplyMessage]:
        return [child for child in self.children if isinstance(child, UserMessage | ReplyMessage)]

    async def clear_messages(self) -> None:
        await self.remove_children(
            [*self.query(UserMessage), *self.query(ReplyMessage), *self.query(ContextRule)]
        )

    async def show_turns(self, turns: list[Any], highlight: bool) -> None:
        """A stored chat in place of what is on screen, stats lines included."""
        await self.clear_messages()
        for turn in turns:
            if turn.role == "user":
                await self.mount(UserMessage(turn.content))
            else:
                await self.mount_stored_reply(turn, highlight)
        self.anchor()

    async def mount_stored_reply(self, turn: Any, highlight: bool) -> ReplyMessage:
        """A stored reply as it looked when it ended: draft colours, stats line (or why it has none), header."""
        reply = ReplyMessage(highlight=highlight)
        await self.mount(reply)
        note = ""
        if turn.interrupted:
            preset, k, temperature = turn.started or (None, None, None)
            note = interrupted_line(preset, k, temperature, turn.content)
            reply.set_header(f"{preset or ''} · interrupted".lstrip(" ·"))
        await reply.finish(
            turn.content,
            turn.stats,
            cancelled=turn.cancelled,
            error=turn.error,
            runs=turn.runs,
            note=note,
        )
        if reply.stats is not None:
            reply.set_header(stored_header(reply.stats))
        return reply

    async def remove_last_exchange(self) -> None:
        """Remove the last user message and everything after it."""
        messages = self.messages()
        last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=None)
        if last_user is not None:
            await self.remove_children(messages[last_user:])

    def selected_reply(self, focused: Widget | None) -> ReplyMessage | None:
        """The reply with focus, else the last finished one."""
        if isinstance(focused, ReplyMessage):
            return focused
        replies = [r for r in self.replies() if not r.streaming]
        return replies[-1] if replies else None

    def select_reply(self, step: int, focused: Widget | None) -> None:
        """Move the selection `step` messages (replies and the user's own: to edit or page them) from the focused
        one (from either end when none has focus)."""
        replies = [m for m in self.messages() if m.display and not getattr(m, "waiting", False)]
        if not replies:
            return
        if isinstance(focused, ReplyMessage | UserMessage) and focused in replies:
            index = max(0, min(len(replies) - 1, replies.index(focused) + step))
        else:
            index = len(replies) - 1 if step < 0 else 0
        replies[index].focus()
        replies[index].scroll_visible()

    def set_highlight(self, on: bool) -> None:
        """Draft colours on every reply."""
        for reply in self.replies():
            reply.set_highlight(on)

    def mark_context(self, hidden_user_turns: int) -> None:
        """Dim the messages before the first user turn the model still sees, and put the rule right above it.

        Messages on screen follow the session's turns, one UserMessage per user turn: the first turn the model sees
        is found by counting user messages, so a failed reply without a turn of its own does not shift it."""
        messages = self.messages()
        boundary = len(messages) if hidden_user_turns else 0
        users = 0
        for index, message in enumerate(messages):
            if isinstance(message, UserMessage):
                if users == hidden_user_turns:
                    boundary = index
                    break
                users += 1
        for index, message in enumerate(messages):
            message.set_class(index < boundary, "out-of-context")
        rules = list(self.query(ContextRule))
        if not 0 < boundary < len(messages):
            for rule in rules:
                rule.remove()
            return
        first_seen = messages[boundary]
        rule = rules[0] if rules else ContextRule()
        if rule.parent is None:
            self.mount(rule, before=first_seen)
        else:
            children = list(self.children)
            if children.index(rule) + 1 != children.index(first_seen):
                self.move_child(rule, before=first_seen)


class ChatNotice(Static):
    """A line from specchat itself between the messages (whether the draft pays, said at load): not a turn."""

    def __init__(self, text: str) -> None:
        super().__init__(Text(text, style="dim italic"), classes="chat-notice")
        self.plain = text


class ContextRule(Static):
    """`── above: not in the model's context ──`: where the trimmed turns end."""

    def __init__(self) -> None:
        super().__init__(
            Text("── above: not in the model's context (trimmed to fit) ──", style="dim italic"),
            classes="context-rule",
        )
