"""Editing any earlier message into a new branch, and paging the branches and variants of a message: the chat
screen's `BranchEditor`.

Messages on screen follow the session's turns: the k-th UserMessage is the k-th user turn, and a reply right
after it is the turn after that one (a failed reply without a turn of its own maps to none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tui.reply_header import variant_header
from tui.widgets.message import ReplyMessage, UserMessage

if TYPE_CHECKING:
    from textual.widget import Widget

    from engine.session import ChatSession
    from tui.widgets.chat_log import ChatLog
    from tui.widgets.prompt import PromptInput

# A session call that runs a reply (the edit's): on_event, cancel -> the session's last event.
ReplyFlow = Callable[[Any, Any], Any]


class BranchEditor:
    """The edit under way (its message marked, the prompt as it was before), the old branch hidden while an
    edit's reply starts, and the branch/variant labels. `keys(binding_id)` says a key as the user reads it;
    `notify` is the screen's."""

    def __init__(
        self,
        session: Callable[[], ChatSession],
        chat_log: ChatLog,
        prompt: PromptInput,
        keys: Callable[[str], str],
        notify: Callable[..., None],
    ) -> None:
        self._session = session
        self.chat_log = chat_log
        self.prompt = prompt
        self.keys = keys
        self.notify = notify
        # The user turn being edited (its message marked on screen), and the prompt as it was before (Esc restores).
        self.editing: int | None = None
        self._saved_prompt = ""
        # An edit being sent: (turn index, the old branch's widgets, hidden until the new reply has its first token).
        self._hidden: tuple[int, list[Any]] | None = None

    @property
    def session(self) -> ChatSession:
        return self._session()

    # --- messages on screen <-> turns ----------------------------------------------------------------------

    def on_screen(self) -> list[UserMessage | ReplyMessage]:
        """The messages shown, in order: not a waiting one, nor one hidden while its replacement streams."""
        return [m for m in self.chat_log.messages() if m.display and not getattr(m, "waiting", False)]

    def turn_index(self, widget: Any) -> int | None:
        """The session turn a message on screen shows (None: none, e.g. a failed reply that kept nothing)."""
        messages = self.on_screen()
        if widget not in messages:
            return None
        users_before = sum(1 for m in messages[: messages.index(widget)] if isinstance(m, UserMessage))
        user_turns = [i for i, t in enumerate(self.session.turns) if t.role == "user"]
        if isinstance(widget, UserMessage):
            return user_turns[users_before] if users_before < len(user_turns) else None
        if not 0 < users_before <= len(user_turns):
            return None
        index = user_turns[users_before - 1] + 1
        turns = self.session.turns
        return index if index < len(turns) and turns[index].role == "assistant" else None

    def widget_for(self, index: int) -> UserMessage | ReplyMessage | None:
        return next((m for m in self.on_screen() if self.turn_index(m) == index), None)

    def label(self, older: str, newer: str) -> None:
        """Every message with alternatives says which one it is and how to page them (`older` / `newer`: keys)."""
        if not self.session.history.saves:
            return
        for widget in self.on_screen():
            index = self.turn_index(widget)
            if index is None:
                continue
            position, count = self.session.branches(index)
            if isinstance(widget, UserMessage):
                if widget.has_class("editing"):
                    continue
                widget.set_header(f"branch {position}/{count} ({older} / {newer})" if count > 1 else "")
            elif count > 1:
                widget.set_header(variant_header(widget.header, position, count, older, newer))

    # --- editing any message: a new branch, the old one kept -----------------------------------------------

    def _target(self, focused: Widget | None) -> int | None:
        """The selected message (a selected reply: the message it answers), else the last message."""
        turns = self.session.turns
        if isinstance(focused, UserMessage | ReplyMessage):
            index = self.turn_index(focused)
            if index is not None and turns[index].role == "assistant":
                index -= 1
            if index is not None and index >= 0 and turns[index].role == "user":
                return index
        users = [i for i, t in enumerate(turns) if t.role == "user"]
        return users[-1] if users else None

    def start(self, focused: Widget | None) -> None:
        """Edit the selected (or last) message: its text in the prompt, the message marked."""
        index = self._target(focused)
        widget = self.widget_for(index) if index is not None else None
        if index is None or not isinstance(widget, UserMessage):
            self.notify("No message to edit yet.", severity="warning")
            return
        if self.editing is None:
            self._saved_prompt = self.prompt.text
        self._end_mark()
        self._mark(index, widget)
        self.prompt.set_text(self.session.turns[index].content)
        self.prompt.focus()
        widget.scroll_visible(animate=False)

    def _mark(self, index: int, widget: UserMessage) -> None:
        self.editing = index
        widget.add_class("editing")
        widget.set_header(f"editing · enter sends it as a new branch · {self.keys('reply.cancel')} cancels")

    def _end_mark(self) -> None:
        for widget in self.chat_log.query(UserMessage):
            if widget.has_class("editing"):
                widget.remove_class("editing")
                widget.set_header("")
        self.editing = None

    def _edited_widget(self) -> UserMessage | None:
        """The message under edit, still marked on screen; else the edit ends (the chat changed under it)."""
        index = self.editing
        widget = self.widget_for(index) if index is not None else None
        if not isinstance(widget, UserMessage) or not widget.has_class("editing"):
            self._end_mark()
            return None
        self._end_mark()
        return widget

    def cancel(self) -> bool:
        """Esc while editing: the message stays as it was and the prompt gets back what it held before (the
        edited text is one ctrl+z away: nothing typed is lost). False when no edit is under way."""
        if self._edited_widget() is None:
            return False
        prompt = self.prompt
        prompt.replace(self._saved_prompt, (0, 0), prompt.document.end)  # an edit: ctrl+z undoes it
        prompt.move_cursor(prompt.document.end)
        self._saved_prompt = ""
        prompt.focus()
        return True

    async def send(self, text: str) -> ReplyFlow | None:
        """Enter while editing: the old branch leaves the screen (hidden until the new reply begins), the edited
        message is mounted, and the session call that sends it comes back (None: no edit is under way)."""
        index = self.editing
        widget = self._edited_widget()
        if index is None or widget is None:
            return None
        messages = self.on_screen()
        hidden = messages[messages.index(widget) :]
        for old in hidden:
            old.display = False
        self._hidden = (index, hidden)
        self.prompt.clear()
        await self.chat_log.mount(UserMessage(text))
        session = self.session
        return lambda on_event, cancel: session.edit(index, text, on_event, cancel)

    async def drop_hidden(self) -> None:
        """The edited message's reply came: the old branch leaves the screen (it stays a branch to page to)."""
        if self._hidden is not None:
            _, hidden = self._hidden
            self._hidden = None
            await self.chat_log.remove_children(hidden)

    def show_hidden(self) -> None:
        """The edited message's reply was stopped before it began: the old branch is back, the edit goes on."""
        if self._hidden is None:
            return
        index, hidden = self._hidden
        self._hidden = None
        for old in hidden:
            old.display = True
        if isinstance(hidden[0], UserMessage) and hidden[0].is_mounted:
            self._mark(index, hidden[0])

    # --- paging branches (an edited message) and variants (a regenerated reply) ----------------------------

    async def page(
        self, step: int, focused: Widget | None, highlight: bool, mark_context: Callable[[], None]
    ) -> bool:
        """Show the older (`step` -1) or newer branch of the selected message, else of the last reply
        (`mark_context` once it is mounted); False (and a toast that says why) where there is none."""
        selected = focused if isinstance(focused, UserMessage | ReplyMessage) else None
        index = self.turn_index(selected) if selected is not None else len(self.session.turns) - 1
        if index is None or index < 0:
            self.notify("No other variant of this reply.", severity="warning", timeout=2)
            return False
        widget = selected or self.widget_for(index)
        messages = self.on_screen()
        position = messages.index(widget) if widget in messages else None
        branch = self.session.show_branch(index, step) if position is not None else None
        if branch is None or position is None:
            self._say_no_branch(index, step)
            return False
        await self.chat_log.remove_children(messages[position:])
        for turn in branch:
            if turn.role == "user":
                await self.chat_log.mount(UserMessage(turn.content))
            else:
                await self.chat_log.mount_stored_reply(turn, highlight)
        mark_context()
        shown = self.on_screen()
        if selected is not None and position < len(shown):
            shown[position].focus()  # the selection stays: the next key pages on
            shown[position].scroll_visible(animate=False)
        else:
            self.chat_log.anchor()
        return True

    def _say_no_branch(self, index: int, step: int) -> None:
        _, count = self.session.branches(index)
        kind = "branch" if self.session.turns[index].role == "user" else "variant"
        what = "message" if kind == "branch" else "reply"
        why = (
            f"no other {kind} of this {what}"
            if count < 2
            else f"no older {kind}"
            if step < 0
            else f"no newer {kind}"
        )
        self.notify(why.capitalize() + ".", severity="warning", timeout=2)
