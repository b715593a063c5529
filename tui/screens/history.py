"""Saved chats: search as you type, open one to continue it, rename, delete (asks first), export, mark private
(a private chat is never drafted from by history drafting; the list says "private").

Everything goes through the session's history (`session.history.chats()`, `rename_chat`, `export_chat`; `session.delete_chat`); the
screen returns the id of the chat to open, or None.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from engine.errors import UserError
from tui.formatting import stored_stats_line
from tui.keymap import HISTORY_KEYS, bindings

TITLE_CELLS = 40  # with the date and count the line fits the dialog at 80 columns: every entry one line high
PRIVATE_MARK = " · private"  # a chat never drafted from by history drafting (ctrl+k)


def chat_option_text(chat) -> Text:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated_at))
    title = Text(
        " ".join((chat.title or "Untitled chat").split()), style="bold"
    )  # a pasted title's newlines too
    private = getattr(chat, "private", False)
    # A private chat's mark takes its room from the title: the entry stays one line at 80 columns.
    title.truncate(TITLE_CELLS - (len(PRIVATE_MARK) if private else 0), overflow="ellipsis")
    line = Text.assemble(title, ("  " + when + f" · {chat.message_count} msgs", "dim"))
    if private:
        line.append(PRIVATE_MARK, "bold magenta")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


class HistoryScreen(ModalScreen[int | None]):
    BINDINGS = bindings(HISTORY_KEYS)

    def __init__(self, session) -> None:
        super().__init__()
        self.session = session
        self.chats: list = []
        self.mode = "search"  # search / rename / confirm-delete
        self._target: int | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="history", classes="dialog"):
            yield Static(Text("Saved chats", style="bold"), classes="title")
            yield Input(placeholder="search titles and text", id="history-search")
            yield OptionList(id="history-list")
            yield Static("", id="history-status")
            yield Static(
                "enter open · ctrl+t rename · ctrl+d delete · ctrl+x export · ctrl+k private · esc close",
                classes="hint",
            )

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(Input).focus()

    @property
    def search(self) -> Input:
        return self.query_one("#history-search", Input)

    @property
    def options(self) -> OptionList:
        return self.query_one("#history-list", OptionList)

    def say(self, text: str) -> None:
        self.query_one("#history-status", Static).update(text)

    def refresh_list(self, query: str = "", keep: int | None = None) -> None:
        """List the chats matching `query`; the highlight stays on chat `keep` (default: the highlighted one)
        where it is listed, else goes to the first."""
        if keep is None:
            keep = self.selected()
        self.chats = self.session.history.chats(query)
        options = self.options
        options.clear_options()
        options.add_options([Option(chat_option_text(c), id=str(c.id)) for c in self.chats])
        if self.chats:
            ids = [c.id for c in self.chats]
            options.highlighted = ids.index(keep) if keep in ids else 0
        self.say("" if self.chats else ("no chat matches" if query else "no saved chats yet"))

    def selected(self) -> int | None:
        index = self.options.highlighted
        if index is None or not self.chats:
            return None
        return self.chats[index].id

    @on(Input.Changed, "#history-search")
    def _search_changed(self, event: Input.Changed) -> None:
        if self.mode == "search":
            self.refresh_list(event.value)

    @on(Input.Submitted, "#history-search")
    def _submitted(self, event: Input.Submitted) -> None:
        if self.mode == "rename" and self._target is not None:
            try:
                self.session.history.rename_chat(self._target, event.value)
            except UserError as exc:
                self.say(str(exc))
                return
            # The renamed chat stays highlighted: ctrl+x next exports that one, not the first row.
            self._back_to_search(f"renamed to {' '.join(event.value.split())!r}", keep=self._target)
        elif self.mode == "confirm-delete":
            self._back_to_search("")
        else:
            chat_id = self.selected()
            if chat_id is not None:
                self.dismiss(chat_id)

    @on(OptionList.OptionSelected)
    def _option_selected(self, event: OptionList.OptionSelected) -> None:
        if self.mode == "search" and event.option.id is not None:
            self.dismiss(int(event.option.id))

    def on_key(self, event) -> None:
        if self.mode == "confirm-delete" and event.key in ("y", "n"):
            event.stop()
            event.prevent_default()
            if event.key == "y" and self._target is not None:
                try:
                    self.session.delete_chat(self._target)
                except UserError as exc:
                    self._back_to_search(str(exc))
                    return
                self._back_to_search("deleted")
            else:
                self._back_to_search("kept")

    def _back_to_search(self, message: str, keep: int | None = None) -> None:
        self.mode = "search"
        self._target = None
        self.search.placeholder = "search titles and text"
        self.search.value = ""
        self.refresh_list(keep=keep)
        self.search.focus()
        self.say(message)

    def action_move(self, step: int) -> None:
        if self.chats and self.mode == "search":
            current = self.options.highlighted or 0
            self.options.highlighted = max(0, min(len(self.chats) - 1, current + step))

    def action_close(self) -> None:
        if self.mode != "search":
            self._back_to_search("")
        else:
            self.dismiss(None)

    def action_rename(self) -> None:
        chat_id = self.selected()
        if chat_id is None:
            return
        self.mode, self._target = "rename", chat_id
        title = next(c.title for c in self.chats if c.id == chat_id)
        self.search.value = title
        self.search.cursor_position = len(title)  # typing goes on from the end of the old title
        self.search.placeholder = "new title"
        self.say("type the new title, enter saves, esc cancels")

    def action_delete(self) -> None:
        chat_id = self.selected()
        if chat_id is None:
            return
        self.mode, self._target = "confirm-delete", chat_id
        self.options.focus()  # y / n reach the screen (the search box would type them)
        title = next(c.title for c in self.chats if c.id == chat_id)
        self.say(f"delete {title!r} and all its messages? y deletes, n keeps")

    def action_toggle_private(self) -> None:
        """Mark the highlighted chat private (history drafting never copies from it) or not, and say so."""
        chat_id = self.selected()
        if chat_id is None or self.mode != "search":
            return
        chat = next(c for c in self.chats if c.id == chat_id)
        private = not getattr(chat, "private", False)
        try:
            self.session.history.set_private(chat_id, private)
        except UserError as exc:
            self.say(str(exc))
            return
        self.refresh_list(self.search.value, keep=chat_id)
        self.say(
            f"{chat.title!r} is private: history drafting never copies from it"
            if private
            else f"{chat.title!r} is no longer private: history drafting may copy from it"
        )

    def action_export(self) -> None:
        """Markdown into the data folder's exports/ (the CLI's `history export` writes anywhere, JSON too)."""
        chat_id = self.selected()
        if chat_id is None:
            return
        recorder = self.session.recorder
        folder = recorder.data_dir / "exports"
        try:
            data = self.session.history.export_chat(chat_id, "md", stored_stats_line)
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"chat-{chat_id}.md"
            target.write_bytes(data)
        except (OSError, UserError) as exc:
            self.say(f"export failed: {exc}")
            return
        self.say(f"exported to {target}")
