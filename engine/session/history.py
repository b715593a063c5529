"""What a chat keeps and reads back: `ChatHistory`, which a `ChatSession` holds (`session.history`). It saves to the
store and the metrics log, reads stored chats and their branches back as turns, and reads the metrics the UI shows;
the session applies what it reads to the conversation (its turns, the status bar's figures, the context).

Nothing here is saved unless the session saves (`ChatSession(..., save=True)`, which builds the recorder); without
one the history holds a `NoRecorder`, whose reads come back empty and which says so where a store is needed: the
one place that decides, so nothing below asks whether there is a recorder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.config import data_dir
from engine.events import MessageStats, ReplyStarted
from engine.origins import decode_runs
from engine.request import CorpusPart, HistoryCorpus
from engine.session.turn import Turn
from engine.storage import metrics
from engine.storage.metrics import Regression, Summary, find_regressions
from engine.storage.recording import ChatRecorder, NoRecorder, stats_from_dict
from engine.storage.store import MessageRecord, StoreError

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


class ChatHistory:
    """The session's store and metrics log, through its recorder (None: nothing is saved, a `NoRecorder`)."""

    def __init__(self, recorder: ChatRecorder | None) -> None:
        self.recorder: ChatRecorder | NoRecorder = recorder if recorder is not None else NoRecorder()
        self.regressions: list[Regression] = []  # from the metrics log; the status bar warns while non-empty
        self._acceptance_seeds: dict[str, tuple[float, ...]] = {}  # per preset, from the metrics log

    # --- saving (the store and the metrics log; nothing here when the session does not save) -----------------

    def record_user(
        self, turns: list[Turn], *, model: str | None, draft: str, system_prompt: str | None, mode: str
    ) -> None:
        """Save the last of `turns`, a new user message, under the newest turn before it that has a row."""
        turn = turns[-1]
        parent = next((t.message_id for t in reversed(turns[:-1]) if t.message_id is not None), None)
        turn.message_id = self.recorder.user_message(
            turn.content, parent, model=model, draft=draft, system_prompt=system_prompt, mode=mode
        )

    def record_reply_started(
        self, turns: list[Turn], started: ReplyStarted, temperature: float
    ) -> int | None:
        """The reply's row, written as it starts (under the last of `turns`). `temperature` is the preset's (a
        ramp's start is only where it begins): all a reply interrupted by a killed process will say of its
        sampling."""
        if not turns:
            return None
        return self.recorder.reply_started(
            turns[-1].message_id, started.preset, started.num_draft_tokens, temperature
        )

    def record_reply_end(
        self,
        reply_id: int | None,
        text: str,
        stats: MessageStats,
        origins: list[int] | None,
        info: BackendInfo | None,
        model_dir: str | None,
    ) -> None:
        """The reply's row finished; a reply not cancelled goes to the metrics log too (then the regression rule)."""
        self.recorder.reply_ended(reply_id, text, stats.stop_reason, stats, origins=origins)
        if stats.stop_reason != "cancelled" and info is not None:
            self.recorder.log_reply(stats, info, model_dir, reply_id)
            self.check_regressions()

    def reply_progress(self, reply_id: int | None, text: Callable[[], str]) -> None:
        self.recorder.reply_progress(reply_id, text)

    def reply_failed(self, reply_id: int | None, partial: str, message: str) -> None:
        self.recorder.reply_ended(reply_id, partial, "error", error=message)

    def discard(self, message_id: int | None) -> None:
        """Remove a row that should not stay (a message taken back, a reply that produced nothing)."""
        self.recorder.discard(message_id)

    def chat_settings_changed(self, **values: str | None) -> None:
        self.recorder.chat_settings_changed(**values)

    def take_notices(self) -> list[str]:
        """Storage problems to tell the user (a damaged database moved aside, a full disk ...), each once."""
        return self.recorder.take_notices()

    def new_chat(self) -> None:
        self.recorder.new_chat()

    def open_chat(self, chat_id: int, clear: Callable[[], None]) -> list[Turn]:
        """A stored chat's visible conversation as turns; new messages go to it. `clear`: the session's new_chat,
        run once the chat is read (a chat that is not there leaves the conversation as it was)."""
        records = self.recorder.open_chat(chat_id)  # StoreError (no such chat), as it is
        clear()
        self.recorder.chat_id = chat_id
        return [_turn(r) for r in records if r.role in ("user", "assistant")]

    @property
    def chat_id(self) -> int | None:
        return self.recorder.chat_id

    @property
    def saves(self) -> bool:
        """Whether this session keeps a history (the store and the metrics log)."""
        return self.recorder.saves

    def last_chat_id(self) -> int | None:
        return self.recorder.last_chat_id()

    # --- stored chats, for the UI ------------------------------------------------------------------------------

    def _store(self):
        return self.recorder.store  # SpecchatError where nothing is saved

    def chats(self, search: str = "") -> list:
        """Stored chats, most recent first; `search` matches titles and message text."""
        return self.recorder.chats(search)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._store().rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int, turns: list[Turn]) -> None:
        """Delete a stored chat; deleting the open one leaves `turns` (its turns) unsaved from here on."""
        self._store().delete_chat(chat_id)
        if self.recorder.chat_id == chat_id:
            self.recorder.new_chat()
            for turn in turns:
                turn.message_id = None

    def export_chat(self, chat_id: int, fmt: str = "md", stats_line: Callable | None = None) -> bytes:
        from engine.storage.store import export_json, export_markdown

        store = self._store()
        chat = store.chat(chat_id)
        messages = store.conversation(chat_id)
        if fmt == "json":
            return export_json(chat, messages)
        return export_markdown(chat, messages, stats_line).encode("utf-8")

    @property
    def memory_only(self) -> bool:
        """True while this chat is not being saved (the disk refused a write, the folder is not writable)."""
        return self.recorder.memory_only

    def open_elsewhere(self) -> int:
        """How many other specchat windows have this chat open (their messages become sibling branches)."""
        return self.recorder.others_open()

    # --- alternatives: regenerated variants, edited messages, another window's message (siblings in the store) --

    def branches(self, turns: list[Turn], index: int) -> tuple[int, int]:
        """(position, count) of turn `index` among its alternatives (same parent and role), oldest first."""
        if not 0 <= index < len(turns):
            return (0, 0)
        message_id = turns[index].message_id
        if message_id is None:
            return (0, 0)
        ids = [m.id for m in self.recorder.variants(message_id)]
        return (ids.index(message_id) + 1, len(ids)) if message_id in ids else (0, 0)

    def variants(self, turns: list[Turn]) -> tuple[int, int]:
        """(position, count) of the last reply among its regenerated variants, oldest first; (0, 0) if none."""
        if not turns or turns[-1].role != "assistant":
            return (0, 0)
        return self.branches(turns, len(turns) - 1)

    def _alternative(self, turns: list[Turn], index: int, step: int) -> MessageRecord | None:
        position, count = self.branches(turns, index)
        target = position + step
        if not count or not 1 <= target <= count:
            return None
        assert turns[index].message_id is not None
        return self.recorder.variants(turns[index].message_id)[target - 1]

    def variant(self, turns: list[Turn], step: int) -> Turn | None:
        """The last reply's older (-1) or newer (+1) variant; None where there is none."""
        if not turns or turns[-1].role != "assistant":
            return None
        record = self._alternative(turns, len(turns) - 1, step)
        return _turn(record) if record is not None else None

    def branch(self, turns: list[Turn], index: int, step: int) -> list[Turn] | None:
        """Turn `index`'s older (-1) or newer (+1) alternative and what follows it as that branch was last
        continued; None where there is none."""
        record = self._alternative(turns, index, step)
        if record is None:
            return None
        return [
            _turn(r) for r in self.recorder.newest_path_from(record.id) if r.role in ("user", "assistant")
        ]

    # --- the history drafter's corpus ----------------------------------------------------------------------------

    def drafting_corpus(self, turns: list[Turn]) -> HistoryCorpus | None:
        """What the history drafter may copy from for the next reply, in priority order: this chat's messages that
        are not in `turns` (its other variants and branches, newest first), then past chats, most recent first.
        Chats marked private are never handed in. Past chats are read later, off the reply path, by the engine;
        their key is one query. None where nothing is saved."""
        recorder, chat_id = self.recorder, self.recorder.chat_id
        parts: list[CorpusPart] = []

        def read() -> None:
            store = recorder.store
            if chat_id is not None and not store.chat(chat_id).private:
                shown = {t.message_id for t in turns}
                others = [m for m in store.messages(chat_id) if m.id not in shown and m.text.strip()][::-1]
                if others:
                    texts = tuple(m.text for m in others)
                    marks = ",".join(f"{m.id}:{m.updated_at}" for m in others)
                    digest = hashlib.sha1(marks.encode()).hexdigest()[:16]
                    parts.append(CorpusPart(f"chat:{chat_id}:{digest}", lambda: texts))
            past = store.past_key(chat_id)
            if past is not None:
                parts.append(CorpusPart(past, lambda: store.past_texts(chat_id)))

        try:
            self.recorder.guarded(read)
        except StoreError:  # the chat is gone (deleted in another window): nothing of it is handed in
            return None
        return HistoryCorpus(tuple(parts)) if parts else None

    def set_private(self, chat_id: int, private: bool) -> None:
        """Mark a stored chat private (never indexed for the history drafter) or not."""
        self._store().set_private(chat_id, private)

    # --- the metrics log ---------------------------------------------------------------------------------------

    def check_regressions(self) -> list[Regression]:
        """Apply the regression rule to the metrics log (after each logged reply, and at load)."""
        self.regressions = find_regressions(self.recorder.recent_metrics())
        return self.regressions

    def recent_average(
        self, preset: str, model: str | None = None, backend: str | None = None
    ) -> Summary | None:
        """The preset's last 20 logged replies (on `model` and `backend` where given), summarized: the inspector
        shows a reply beside it, so the average must come from the same model and engine."""
        return metrics.recent_average(self.recorder.recent_metrics(), preset, model=model, backend=backend)

    def metrics_rows(self) -> list[dict[str, Any]]:
        return self.recorder.recent_metrics()

    def acceptance_seed(self, preset: str, info: BackendInfo | None, settings: Settings) -> tuple[float, ...]:
        """Per-position acceptance of the preset's recent logged replies on `info`'s model (adaptive K's start);
        read once per preset, from the metrics log in `settings`' data folder where nothing is saved."""
        if preset not in self._acceptance_seeds:
            rows: list[dict[str, Any]] = []
            if info is not None:
                if self.recorder.saves:
                    rows = self.recorder.recent_metrics()
                else:
                    try:
                        rows = metrics.read(data_dir(settings) / metrics.METRICS_NAME)
                    except OSError:
                        rows = []
            self._acceptance_seeds[preset] = (
                metrics.acceptance_seed(
                    rows,
                    preset,
                    model=info.model,
                    draft=info.draft_model or info.draft_mode,
                    backend=info.backend,
                )
                if info is not None
                else ()
            )
        return self._acceptance_seeds[preset]
