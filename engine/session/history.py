"""What a ChatSession keeps and reads back: saving to the store and the metrics log, stored chats, regenerated
variants, and the metrics the UI shows. Mixed into `ChatSession` (one concept per file: this is its history).

Nothing here runs unless the session saves (`ChatSession(..., save=True)`, which builds `self.recorder`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.errors import SpecchatError
from engine.events import MessageStats, ReplyStarted
from engine.origins import decode_runs
from engine.session.turn import Turn
from engine.storage.metrics import Regression, Summary, find_regressions, recent_average
from engine.storage.recording import ChatRecorder, stats_from_dict
from engine.storage.store import MessageRecord

if TYPE_CHECKING:
    from engine.config import Settings
    from engine.events import BackendInfo


def _turn(record: MessageRecord) -> Turn:
    """A stored message as a turn of the conversation, with what the UI needs to show it as it was."""
    stop_reason = record.stop_reason
    assistant = record.role == "assistant"
    return Turn(
        record.role,
        record.text,
        stats_from_dict(record.stats),
        cancelled=assistant and stop_reason in (None, "cancelled", "error"),
        message_id=record.id,
        runs=tuple(decode_runs(record.text, record.origins) or ()) or None,
        interrupted=record.interrupted,
        error=record.error or "",
        started=(record.preset, record.k, record.temperature) if assistant else None,
    )


class SessionHistory:
    # Provided by ChatSession.
    recorder: ChatRecorder | None
    turns: list[Turn]
    settings: Settings
    mode: str
    model_dir: str | None
    _info: BackendInfo | None
    active: ReplyStarted | None
    last_stats: MessageStats | None
    regressions: list[Regression]

    def new_chat(self) -> None: ...  # ChatSession's: clears the turns, and the recorder's open chat

    def _recount_context(self, from_start: bool = False) -> None: ...  # ChatSession's: the context figure

    # --- saving (the store and the metrics log; nothing here when the session does not save) -----------------

    def _record_user(self, turn: Turn) -> None:
        if self.recorder is None:
            return
        parent = next((t.message_id for t in reversed(self.turns[:-1]) if t.message_id is not None), None)
        turn.message_id = self.recorder.user_message(
            turn.content,
            parent,
            model=self.model_dir or (self._info.model if self._info else None),
            draft=self.settings.draft,
            system_prompt=self.settings.system_prompt,
            mode=self.mode,
        )

    def _record_reply_started(self, started: ReplyStarted, temperature: float) -> int | None:
        """The reply's row, written as it starts. `temperature` is the preset's (a ramp's start is only where it
        begins): all a reply interrupted by a killed process will say of its sampling."""
        if self.recorder is None or not self.turns:
            return None
        return self.recorder.reply_started(
            self.turns[-1].message_id, started.preset, started.num_draft_tokens, temperature
        )

    def _record_reply_end(
        self, reply_id: int | None, text: str, stats: MessageStats, origins: list[int] | None = None
    ) -> None:
        if self.recorder is None:
            return
        self.recorder.reply_ended(reply_id, text, stats.stop_reason, stats, origins=origins)
        if stats.stop_reason != "cancelled" and self._info is not None:
            self.recorder.log_reply(stats, self._info, self.model_dir, reply_id)
            self.check_regressions()

    def take_notices(self) -> list[str]:
        """Storage problems to tell the user (a damaged database moved aside, a full disk ...), each once."""
        return self.recorder.take_notices() if self.recorder is not None else []

    def open_chat(self, chat_id: int) -> list[Turn]:
        """Continue a stored chat: its visible conversation becomes this session's turns."""
        if self.recorder is None:
            raise SpecchatError("this session does not keep a history")
        records = self.recorder.open_chat(chat_id)  # StoreError (no such chat), as it is
        self.new_chat()
        self.recorder.chat_id = chat_id
        self.turns = [_turn(r) for r in records if r.role in ("user", "assistant")]
        # The status bar shows the last reply's figures, as it did when the chat was left, and the context
        # this chat fills now (measured again at load when the model is not ready yet).
        self.last_stats = next((t.stats for t in reversed(self.turns) if t.stats is not None), None)
        self._recount_context()
        return self.turns

    @property
    def chat_id(self) -> int | None:
        return self.recorder.chat_id if self.recorder is not None else None

    def last_chat_id(self) -> int | None:
        return self.recorder.last_chat_id() if self.recorder is not None else None

    # --- the history, for the UI (the store is reached through the session) ---------------------------------

    def _store(self):
        if self.recorder is None:
            raise SpecchatError("this session does not keep a history")
        return self.recorder.store

    def chats(self, search: str = "") -> list:
        """Stored chats, most recent first; `search` matches titles and message text."""
        return self._store().chats(search) if self.recorder is not None else []

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._store().rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int) -> None:
        """Delete a stored chat; deleting the open one leaves its turns on screen, unsaved from here on."""
        self._store().delete_chat(chat_id)
        if self.recorder is not None and self.recorder.chat_id == chat_id:
            self.recorder.new_chat()
            for turn in self.turns:
                turn.message_id = None

    def export_chat(self, chat_id: int, fmt: str = "md", stats_line: Callable | None = None) -> bytes:
        from engine.storage.store import export_json, export_markdown

        store = self._store()
        chat = store.chat(chat_id)
        messages = store.conversation(chat_id)
        if fmt == "json":
            return export_json(chat, messages)
        return export_markdown(chat, messages, stats_line).encode("utf-8")

    # --- regenerated variants of the last reply -------------------------------------------------------------

    def variants(self) -> tuple[int, int]:
        """(position, count) of the last reply among its regenerated variants, oldest first; (0, 0) if none."""
        if self.recorder is None or not self.turns or self.turns[-1].role != "assistant":
            return (0, 0)
        message_id = self.turns[-1].message_id
        if message_id is None:
            return (0, 0)
        ids = [m.id for m in self.recorder.variants(message_id)]
        return (ids.index(message_id) + 1, len(ids)) if message_id in ids else (0, 0)

    def show_variant(self, step: int) -> Turn | None:
        """Page the last reply to an older (-1) or newer (+1) variant; the conversation goes on from it."""
        position, count = self.variants()
        target = position + step
        if not count or not 1 <= target <= count or self.active is not None:
            return None
        assert self.recorder is not None and self.turns[-1].message_id is not None
        record = self.recorder.variants(self.turns[-1].message_id)[target - 1]
        turn = _turn(record)
        self.turns[-1] = turn
        self.last_stats = turn.stats
        self._recount_context()
        return turn

    # --- branches: an edited message, a regenerated reply, another window's message (siblings in the store) -----

    def branches(self, index: int) -> tuple[int, int]:
        """(position, count) of turn `index` among its alternatives (same parent and role), oldest first."""
        if self.recorder is None or not 0 <= index < len(self.turns):
            return (0, 0)
        message_id = self.turns[index].message_id
        if message_id is None:
            return (0, 0)
        ids = [m.id for m in self.recorder.variants(message_id)]
        return (ids.index(message_id) + 1, len(ids)) if message_id in ids else (0, 0)

    def show_branch(self, index: int, step: int) -> list[Turn] | None:
        """Page turn `index` to an older (-1) or newer (+1) alternative: the turns from `index` on become that
        branch as it was last continued (returned); the conversation goes on from it."""
        position, count = self.branches(index)
        target = position + step
        if not count or not 1 <= target <= count or self.active is not None:
            return None
        assert self.recorder is not None and self.turns[index].message_id is not None
        record = self.recorder.variants(self.turns[index].message_id)[target - 1]
        branch = [
            _turn(r) for r in self.recorder.newest_path_from(record.id) if r.role in ("user", "assistant")
        ]
        if not branch:
            return None
        self.turns[index:] = branch
        self.last_stats = next((t.stats for t in reversed(self.turns) if t.stats is not None), None)
        self._recount_context(from_start=True)  # another branch: what fits is measured afresh
        return branch

    @property
    def memory_only(self) -> bool:
        """True while this chat is not being saved (the disk refused a write, the folder is not writable)."""
        return self.recorder is not None and self.recorder.memory_only

    def open_elsewhere(self) -> int:
        """How many other specchat windows have this chat open (their messages become sibling branches)."""
        return self.recorder.others_open() if self.recorder is not None else 0

    # --- the metrics log, for the UI -------------------------------------------------------------------------

    def check_regressions(self) -> list[Regression]:
        """Apply the regression rule to the metrics log (after each logged reply, and at load)."""
        if self.recorder is not None:
            self.regressions = find_regressions(self.recorder.recent_metrics())
        return self.regressions

    def recent_average(
        self, preset: str, model: str | None = None, backend: str | None = None
    ) -> Summary | None:
        """The preset's last 20 logged replies (on `model` and `backend` where given), summarized: the inspector
        shows a reply beside it, so the average must come from the same model and engine."""
        if self.recorder is None:
            return None
        return recent_average(self.recorder.recent_metrics(), preset, model=model, backend=backend)

    def metrics_rows(self) -> list[dict[str, Any]]:
        return self.recorder.recent_metrics() if self.recorder is not None else []
