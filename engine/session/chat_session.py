"""ChatSession: the conversation, the preset choice, the context window, and one reply at a time.

Usable without any UI: `send()` blocks (run it in a thread) and reports everything through `on_event`.
The TUI polls the plain attributes (`live`, `active`, `last_stats`) for its status bar.

The session holds the state; the parts apart from it, as objects it holds: which preset
(`preset_choice.PresetChoice`, `session.preset_choice`), the context figures (`context_window.ContextWindow`,
`session.context_window`), what is saved and read back (`history.ChatHistory`, `session.history`); a reply runs in
one pass from request to recorded reply (`reply_run.ReplyRun`, its parts in `reply`); as functions: loading a model
(`loading`), an edited or continued conversation (`editing`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import engine.session.editing as editing
from engine.backends.base import Backend
from engine.config import Settings, data_dir, presets_dir
from engine.decoding.verdict import DraftVerdict, machine_verdict
from engine.errors import SpecchatError
from engine.events import (
    BackendInfo,
    LiveStats,
    MessageStats,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
)
from engine.presets import Preset, load_presets
from engine.session.context_window import ContextWindow, context_messages, reply_room
from engine.session.history import ChatHistory
from engine.session.loading import fetch_model_files, load_errors, load_replacement
from engine.session.preset_choice import PresetChoice
from engine.session.reply_run import ReplyRun, Undo
from engine.session.turn import Turn
from engine.storage.metrics import Regression
from engine.storage.recording import ChatRecorder, NoRecorder

EventCallback = Callable[[object], None]
ProgressCallback = Callable[[str, float | None], None]


class ChatSession:
    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        presets: dict[str, Preset] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        save: bool = False,
        recorder: ChatRecorder | None = None,
    ) -> None:
        # `clock` must be the one the backend stamps Chunk.t with (tests freeze both for snapshots).
        self.clock = clock
        self.settings = settings
        self.backend = backend
        self.backend_reason = "given" if backend is not None else ""
        # A bad user preset file is left out (name -> its one-line problem), the others load: the UI says so.
        skipped: dict[str, str] = {}
        loaded = presets if presets is not None else load_presets(presets_dir(), skipped=skipped)
        self.preset_choice = PresetChoice(loaded, skipped)
        self.set_mode(settings.preset)
        self.turns: list[Turn] = []
        self.live = LiveStats()
        self.active: ReplyStarted | None = None
        self.last_stats: MessageStats | None = None
        self.last_prompt_ids: tuple[int, ...] = ()
        self.context_window = ContextWindow()  # the tokens the next reply sees, the first turn it sees
        self._info: BackendInfo | None = None
        # The model folder's path as resolved at load (the embedded model's cache folder when none was set).
        self.model_dir: str | None = str(settings.model) if settings.model is not None else None
        # Saving (chats to the store, replies to the metrics log) is asked for: the chat app, `generate --save`.
        if recorder is None and save:
            recorder = ChatRecorder(data_dir(settings))
        self.history = ChatHistory(recorder)
        # Whether drafting can pay on this machine (the doctor's verdict), judged at load and after every reply;
        # `verdict_changed` is set when a reply's measurements turned it (the UI says so once, then clears it).
        self.verdict: DraftVerdict | None = None
        self.verdict_changed = False

    # --- setup ---------------------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo | None:
        return self._info

    @property
    def max_context(self) -> int:
        return self._info.max_context if self._info else self.settings.max_context

    def load(self, progress: ProgressCallback | None = None) -> BackendInfo:
        with load_errors(self.settings):
            if self.backend is None:
                from engine.backends.select import create_backend

                settings = fetch_model_files(self.settings, progress)
                self.model_dir = str(settings.model) if settings.model is not None else None
                self.backend, self.backend_reason = create_backend(settings, progress)
            self.backend.load(progress)
            self._info = self.backend.info
            self.verdict, self.verdict_changed = self.judge_drafting(), False
            self.history.check_regressions()
            self.recount_context()  # a chat opened before the model was ready (--resume)
        return self._info

    def reload(
        self,
        model: str | Path | None,
        draft: str,
        progress: ProgressCallback | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> BackendInfo:
        """Switch this chat to another model and/or draft; the conversation stays and goes on with the new one.

        `model` is a model folder or .gguf file (None: the embedded model), `draft` 'ngram', 'none' or a draft
        model; `options` any other engine option's new value (the settings dialog's text, by setting name: another
        context length, say). The new backend loads while the old one stays loaded: on any failure (no such path,
        not a model, a draft that cannot draft for it, out of memory) a UserError says why in one line and nothing
        changed. Call it between replies (from a thread: loading takes a while).
        """
        if self.active is not None:
            raise SpecchatError("a reply is being generated: stop it or let it finish, then reload")
        # The old backend stays loaded meanwhile, and stays where the new one fails.
        new = load_replacement(self.settings, model, draft, progress, options)
        old, self.backend = self.backend, new.backend
        self.settings, self.backend_reason, self._info = new.settings, new.reason, new.info
        self.verdict, self.verdict_changed = self.judge_drafting(), False
        self.model_dir = new.model_dir
        if old is not None:
            # The new model is in: a failure in the old one's cleanup cannot undo that.
            with contextlib.suppress(Exception):
                old.close()
        self.recount_context(from_start=True)  # another context size: what fits is measured afresh
        self.history.chat_settings_changed(model=self.model_dir, draft=new.settings.draft)
        return new.info

    def judge_drafting(self) -> DraftVerdict | None:
        """Whether drafting can pay with the loaded backend's measured costs (as `specchat doctor` says)."""
        if self.backend is None or self._info is None:
            return None
        return machine_verdict(
            self.backend, self._info.draft_mode, self.presets, self.settings.history_drafting
        )

    def set_history_drafting(self, on: bool) -> None:
        """Turn history drafting on or off for this session (F12; not written to the config file). The verdict is
        judged again as at load (history is one of the free drafts it counts beside a draft model or MTP head);
        `verdict_changed` where its words changed, so the chat says the new line."""
        if on == self.settings.history_drafting:
            return
        self.settings = self.settings.model_copy(update={"history_drafting": on})
        old, self.verdict = self.verdict, self.judge_drafting()
        new = self.verdict
        if new is not None and new.pays is not None and (old is None or old.body() != new.body()):
            self.verdict_changed = True

    def rejudge_drafting(self) -> DraftVerdict | None:
        """After a reply: the verdict from the costs as measured now; flag it when it turned."""
        new = self.judge_drafting()
        old = self.verdict
        if new is not None and (old is None or old.pays != new.pays) and new.pays is not None:
            self.verdict_changed = True
        self.verdict = new
        return new

    # --- the preset: named entry points; the rest is `session.preset_choice`'s (engine.session.preset_choice) --

    @property
    def presets(self) -> dict[str, Preset]:
        return self.preset_choice.presets

    @property
    def mode(self) -> str:
        return self.preset_choice.mode

    def set_mode(self, name: str) -> None:
        self.preset_choice.set_mode(name)

    def set_overrides(self, **values: Any) -> None:
        """Override preset fields for every following message; None leaves a field to the preset."""
        self.preset_choice.set_overrides(**values)

    def effective_preset(self, name: str) -> Preset:
        """Preset `name` as the next reply would use it: with this chat's overrides."""
        return self.preset_choice.effective(name)

    def set_system_prompt(self, text: str | None) -> None:
        """The system prompt of this chat's next requests (empty: none); the stored chat records it."""
        text = (text or "").strip() or None
        if text == self.settings.system_prompt:
            return
        self.settings = self.settings.model_copy(update={"system_prompt": text})
        self.history.chat_settings_changed(system_prompt=text)

    # --- conversation ----------------------------------------------------------------------------------------

    def new_chat(self) -> None:
        self.turns.clear()
        self.context_window.clear()
        self.last_stats = None  # a new chat's status bar starts blank, not with the old chat's figures
        self.live = LiveStats()
        self.history.new_chat()

    def pop_last_exchange(self) -> str | None:
        """Remove the last user message and its reply; return the user's text (edit and resend)."""
        while self.turns and self.turns[-1].role != "user":
            self.turns.pop()
        if not self.turns:
            return None
        text = self.turns.pop().content
        self.recount_context()  # starts at the last kept user turn at the latest
        return text

    @property
    def context_used(self) -> int:
        """The tokens the next reply will see (during a reply, its prompt plus what it has generated so far)."""
        return self.context_window.used

    @property
    def context_start(self) -> int:
        """The first turn the next reply sees: the ones before it stay in the chat but no longer fit."""
        return self.context_window.start

    @property
    def context_turns(self) -> list[Turn]:
        """The turns the model sees (the oldest ones that no longer fit are left out)."""
        return self.turns[self.context_window.start :]

    def recount_context(self, from_start: bool = False, on_event: EventCallback | None = None) -> None:
        """The context figures for the conversation as it stands now, with room kept for the next reply (after a
        reply, reopening a chat, paging, editing, another model): the truth before the next message is typed.
        After a reply (`on_event`), turns that no longer fit are said now, when they leave the context."""
        if not self.turns or self.backend is None or self._info is None:
            self.context_window.clear()
            return
        window = self.context_window
        window.recount(self.turns, self.encode, self.max_context, self._next_reserve(), from_start, on_event)

    def messages(self, turns: list[Turn]) -> list[dict[str, str]]:
        """`turns` as the chat messages the model is sent (with this chat's system prompt)."""
        return context_messages(turns, self.settings.system_prompt)

    def encode(self, turns: list[Turn]) -> list[int]:
        assert self.backend is not None
        return self.backend.encode_chat(self.messages(turns))

    def _next_reserve(self) -> int:
        """The room the next reply will keep: its preset's, or (auto: the router picks per message) the largest any
        routed preset keeps, so that the turns shown as seen stay seen whichever preset the router picks."""
        return max((reply_room(p, self.max_context) for p in self.preset_choice.next_presets()), default=0)

    def send(
        self, text: str, on_event: EventCallback, cancel: threading.Event
    ) -> ReplyFinished | ReplyFailed:
        if not text.strip():
            raise SpecchatError("empty message: type something to send")
        self.turns.append(Turn("user", text))
        self._record_user()
        return ReplyRun(self, text, on_event, cancel).run()

    def regenerate(self, on_event: EventCallback, cancel: threading.Event) -> ReplyFinished | ReplyFailed:
        """Generate the last reply again. Stopped (or failed) before its first token, the old reply stays."""
        replaced: list[Turn] = []
        while self.turns and self.turns[-1].role == "assistant":
            replaced.insert(0, self.turns.pop())
        if not self.turns:
            self.turns.extend(replaced)
            raise SpecchatError("nothing to regenerate yet")
        return ReplyRun(self, self.turns[-1].content, on_event, cancel, Undo(replaced=replaced)).run()

    # --- editing and continuing (engine.session.editing) -------------------------------------------------------

    def edit(
        self, index: int, text: str, on_event: EventCallback, cancel: threading.Event
    ) -> ReplyFinished | ReplyFailed:
        """Send `text` in place of user turn `index` (any of them, not only the last): a new branch from the turn
        before it. The old message and everything after it stay in the store, a sibling branch (`branches`,
        `show_branch`); stopped before the first token, the old branch comes back."""
        edited = editing.cut_for_edit(self.turns, index, text)
        self._record_user()
        return ReplyRun(self, text, on_event, cancel, Undo(edited=edited)).run()

    def can_continue(self) -> bool:
        """True when the last reply stopped at its token limit (max_new_tokens) and can be continued."""
        return editing.can_continue(self.turns)

    def continue_reply(self, on_event: EventCallback, cancel: threading.Event) -> ReplyFinished | ReplyFailed:
        """Extend the last reply where it stopped at its token limit: the model goes on from its last token (the
        same reply, in the store too). Stopped before anything new, the reply stays as it was."""
        last, user_text = editing.take_continued(self.turns, self._info)
        return ReplyRun(self, user_text, on_event, cancel, Undo(replaced=[last]), continuing=last).run()

    # --- the history: what changes the turns, and named entry points; the rest is `session.history`'s ------------

    @property
    def recorder(self) -> ChatRecorder | NoRecorder:
        """What writes the store and the metrics log (a `NoRecorder` where this session saves nothing)."""
        return self.history.recorder

    @property
    def regressions(self) -> list[Regression]:
        """From the metrics log; the status bar warns while non-empty."""
        return self.history.regressions

    def _record_user(self) -> None:
        """Save the message that now ends the turns."""
        self.history.record_user(
            self.turns,
            model=self.model_dir or (self._info.model if self._info else None),
            draft=self.settings.draft,
            system_prompt=self.settings.system_prompt,
            mode=self.mode,
        )

    def take_notices(self) -> list[str]:
        return self.history.take_notices()

    def open_chat(self, chat_id: int) -> list[Turn]:
        """Continue a stored chat: its visible conversation becomes this session's turns."""
        self.turns[:] = self.history.open_chat(chat_id, clear=self.new_chat)
        # The status bar shows the last reply's figures, as it did when the chat was left, and the context
        # this chat fills now (measured again at load when the model is not ready yet).
        self.last_stats = next((t.stats for t in reversed(self.turns) if t.stats is not None), None)
        self.recount_context()
        return self.turns

    @property
    def chat_id(self) -> int | None:
        return self.history.chat_id

    def delete_chat(self, chat_id: int) -> None:
        """Delete a stored chat; deleting the open one leaves its turns on screen, unsaved from here on."""
        self.history.delete_chat(chat_id, self.turns)

    def variants(self) -> tuple[int, int]:
        return self.history.variants(self.turns)

    def show_variant(self, step: int) -> Turn | None:
        """Page the last reply to an older (-1) or newer (+1) variant; the conversation goes on from it."""
        turn = self.history.variant(self.turns, step) if self.active is None else None
        if turn is not None:
            self.turns[-1] = turn
            self.last_stats = turn.stats
            self.recount_context()
        return turn

    def branches(self, index: int) -> tuple[int, int]:
        return self.history.branches(self.turns, index)

    def show_branch(self, index: int, step: int) -> list[Turn] | None:
        """Page turn `index` to an older (-1) or newer (+1) alternative: the turns from `index` on become that
        branch as it was last continued (returned); the conversation goes on from it."""
        branch = self.history.branch(self.turns, index, step) if self.active is None else None
        if not branch:
            return None
        self.turns[index:] = branch
        self.last_stats = next((t.stats for t in reversed(self.turns) if t.stats is not None), None)
        self.recount_context(from_start=True)  # another branch: what fits is measured afresh
        return branch

    @property
    def memory_only(self) -> bool:
        return self.history.memory_only

    def metrics_rows(self) -> list[dict[str, Any]]:
        return self.history.metrics_rows()
