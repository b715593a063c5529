"""ChatSession: the conversation, the preset choice, the context window, and one reply at a time.

Usable without any UI: `send()` blocks (run it in a thread) and reports everything through `on_event`.
The TUI polls the plain attributes (`live`, `active`, `last_stats`) for its status bar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.backends.base import Backend
from engine.config import Settings, data_dir, env_name, presets_dir
from engine.decoding.acceptance import AcceptanceAccounting
from engine.decoding.verdict import DraftVerdict, draft_verdict, verdict_k_max, verify_costs_of
from engine.errors import SpecchatError, UserError
from engine.events import (
    BackendInfo,
    Chunk,
    ContextTrimmed,
    Done,
    LiveStats,
    MessageStats,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
)
from engine.origins import OriginRun, encode_runs, merge_runs, split_chunk_by_origin
from engine.presets import Preset, PresetError, load_presets, with_overrides
from engine.reasoning import split_reasoning, thinking_end
from engine.request import GenerationRequest
from engine.router import RECENT_TURNS, route
from engine.session.editing import SessionEditing
from engine.session.history import SessionHistory
from engine.session.turn import Turn
from engine.storage import metrics
from engine.storage.metrics import Regression
from engine.storage.recording import ChatRecorder

EventCallback = Callable[[object], None]
ProgressCallback = Callable[[str, float | None], None]

# Preset fields the command line may override for every message (`--k`, `--temperature`, ...).
OVERRIDABLE = (
    "k",
    "k_mode",
    "temperature",
    "max_new_tokens",
    "drafting",
    "ramp_tokens",
    "ramp_start",
    "top_p",
)


def without_reasoning(text: str) -> str:
    """A reply as it goes back into the context: a finished reasoning block is left out (as chat templates do)."""
    split = split_reasoning(text)
    return split.answer if split.has_thinking and split.closed else text


def without_partial_claim(message: str) -> str:
    """A backend's error without its promise that "the partial reply is kept", for a reply that kept nothing."""
    return message.replace("the partial reply is kept; ", "").replace("; the partial reply is kept", "")


def with_thinking_counts(
    stats: MessageStats, reply_text: str, marks: list[tuple[int, int, int, int]]
) -> MessageStats:
    """`stats` with the reasoning's tokens, drafts and accepted drafts counted apart (chunks that start in it)."""
    end = thinking_end(reply_text)
    if not end:
        return stats
    inside = [m for m in marks if m[0] < end]
    return dataclasses.replace(
        stats,
        thinking_tokens=sum(m[1] for m in inside),
        thinking_drafted_tokens=sum(m[2] for m in inside),
        thinking_accepted_tokens=sum(m[3] for m in inside),
    )


class ReplyHandle:
    """A reply generating in its own thread: `cancel()` it, `wait()` for its ReplyFinished / ReplyFailed."""

    def __init__(self, run: Callable[[threading.Event], ReplyFinished | ReplyFailed]) -> None:
        self.cancel_event = threading.Event()
        self.result: ReplyFinished | ReplyFailed | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), name="specchat-reply", daemon=True)
        self._thread.start()

    def _run(self, run: Callable[[threading.Event], ReplyFinished | ReplyFailed]) -> None:
        try:
            self.result = run(self.cancel_event)
        except BaseException as exc:  # handed to wait(): a thread has no one else to tell
            self.error = exc

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> ReplyFinished | ReplyFailed | None:
        """The result (None if still running after `timeout`); re-raises what the thread raised."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result


class ChatSession(SessionHistory, SessionEditing):
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
        self.skipped_presets: dict[str, str] = {}
        self.presets = (
            presets if presets is not None else load_presets(presets_dir(), skipped=self.skipped_presets)
        )
        self.mode = "auto"
        self.set_mode(settings.preset)
        self.overrides: dict[str, Any] = {}
        self.turns: list[Turn] = []
        self.live = LiveStats()
        self.active: ReplyStarted | None = None
        self.last_stats: MessageStats | None = None
        self.last_prompt_ids: tuple[int, ...] = ()
        # The tokens the next reply will see (the kept turns as its prompt renders them; during a reply, its prompt
        # plus what it has generated so far), and the first turn it sees: `turns[:context_start]` stay in the chat
        # (on screen, in the store) but no longer fit the context.
        self.context_used = 0
        self.context_start = 0
        self._info: BackendInfo | None = None
        # The model folder's path as resolved at load (the embedded model's cache folder when none was set).
        self.model_dir: str | None = str(settings.model) if settings.model is not None else None
        # Saving (chats to the store, replies to the metrics log) is asked for: the chat app, `generate --save`.
        if recorder is None and save:
            recorder = ChatRecorder(data_dir(settings))
        self.recorder = recorder
        self.regressions: list[Regression] = []  # from the metrics log; the status bar warns while non-empty
        self._acceptance_seeds: dict[str, tuple[float, ...]] = {}  # per preset, from the metrics log
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
        try:
            if self.backend is None:
                from engine.backends.select import create_backend, uses_remote

                settings = self.settings
                # Fetch here, so the download and conversion show progress (a remote server needs no model).
                if settings.model is None and not uses_remote(settings):
                    from engine.models import ensure_embedded_model

                    settings = settings.model_copy(update={"model": ensure_embedded_model(progress)})
                if not uses_remote(settings):  # a named model (qwen2.5-coder-1.5b) not fetched yet
                    from engine.models.named import ensure_named_files

                    ensure_named_files(settings, progress)
                self.model_dir = str(settings.model) if settings.model is not None else None
                self.backend, self.backend_reason = create_backend(settings, progress)
            self.backend.load(progress)
            self._info = self.backend.info
            self.verdict, self.verdict_changed = self.judge_drafting(), False
            self.check_regressions()
            self._recount_context()  # a chat opened before the model was ready (--resume)
        except UserError as exc:
            raise SpecchatError(self._where_model_came_from() + str(exc)) from exc
        except MemoryError as exc:
            raise SpecchatError(
                "out of memory loading the model: lower max_context or use a smaller model"
            ) from exc
        return self._info

    @staticmethod
    def check_model_choice(model: str | Path | None = None, draft: str | None = None) -> None:
        """SpecchatError (one line) unless `model` (None: not checked) holds a model and `draft` (None: not
        checked) is 'ngram', 'none' or a draft model. Reads file headers only: fit to run as a path is typed."""
        from engine.models import ModelError, check_draft_choice, check_model_path

        try:
            if model is not None:
                check_model_path(model)
            if draft is not None:
                check_draft_choice(draft)
        except ModelError as exc:
            raise SpecchatError(str(exc)) from exc

    def reload(
        self, model: str | Path | None, draft: str, progress: ProgressCallback | None = None
    ) -> BackendInfo:
        """Switch this chat to another model and/or draft; the conversation stays and goes on with the new one.

        `model` is a model folder or .gguf file (None: the embedded model), `draft` 'ngram', 'none' or a draft
        model. The new backend loads while the old one stays loaded: on any failure (no such path, not a model,
        a draft that cannot draft for it, out of memory) SpecchatError says why in one line and nothing changed.
        Call it between replies (from a thread: loading takes a while).
        """
        from engine.backends.select import create_backend
        from engine.models import ModelError, check_draft_choice, check_model_path

        if self.active is not None:
            raise SpecchatError("a reply is being generated: stop it (esc) or let it finish, then reload")
        try:
            model_path = check_model_path(model) if model not in (None, "") else None
            draft = check_draft_choice(draft)
        except ModelError as exc:
            raise SpecchatError(str(exc)) from exc
        settings = self.settings.model_copy(update={"model": model_path, "draft": draft})
        backend: Backend | None = None
        try:
            loading = settings
            if model_path is None:  # the embedded model (fetched and converted on its first use)
                from engine.models import ensure_embedded_model

                loading = settings.model_copy(update={"model": ensure_embedded_model(progress)})
            from engine.models.named import ensure_named_files

            ensure_named_files(loading, progress)  # a named model or draft not fetched yet
            backend, reason = create_backend(loading, progress)
            backend.load(progress)
            info = backend.info
        except (UserError, MemoryError) as exc:
            if backend is not None:
                with contextlib.suppress(Exception):  # half-loaded: free what it holds, keep the old one
                    backend.close()
            if isinstance(exc, MemoryError):
                raise SpecchatError(
                    "out of memory loading the new model: the current one stays loaded; "
                    "try a smaller model or lower max_context"
                ) from exc
            raise SpecchatError(str(exc)) from exc
        old, self.backend = self.backend, backend
        self.settings, self.backend_reason, self._info = settings, reason, info
        self.verdict, self.verdict_changed = self.judge_drafting(), False
        self.model_dir = str(loading.model)
        if old is not None:
            # The new model is in: a failure in the old one's cleanup cannot undo that.
            with contextlib.suppress(Exception):
                old.close()
        self._recount_context(from_start=True)  # another context size: what fits is measured afresh
        if self.recorder is not None:
            self.recorder.chat_settings_changed(model=self.model_dir, draft=draft)
        return info

    def judge_drafting(self) -> DraftVerdict | None:
        """Whether drafting can pay with the loaded backend's measured costs (as `specchat doctor` says)."""
        if self.backend is None or self._info is None:
            return None
        presets = [p for n, p in self.presets.items() if n in ("code", "qa", "creative")] or list(
            self.presets.values()
        )
        return draft_verdict(verify_costs_of(self.backend), self._info.draft_mode, verdict_k_max(presets))

    def _rejudge_drafting(self) -> None:
        """After a reply: the verdict from the costs as measured now; flag it when it turned."""
        new = self.judge_drafting()
        old = self.verdict
        if new is not None and (old is None or old.pays != new.pays) and new.pays is not None:
            self.verdict_changed = True
        self.verdict = new

    def _where_model_came_from(self) -> str:
        """'SPECCHAT_MODEL: ' when the model folder was set through that variable, so a bad path names its source."""
        value = os.environ.get(env_name("model"))
        model = self.settings.model
        if value and model is not None and Path(value).expanduser() == Path(model):
            return f"{env_name('model')}: "
        return ""

    def set_mode(self, name: str) -> None:
        if name != "auto" and name not in self.presets:
            if name in self.skipped_presets:
                raise SpecchatError(f"preset {name!r} was skipped: {self.skipped_presets[name]}")
            known = ", ".join(["auto", *self.presets])
            raise SpecchatError(f"unknown preset {name!r} (known: {known})")
        self.mode = name

    def set_overrides(self, **values: Any) -> None:
        """Override preset fields for every following message; None leaves a field to the preset."""
        unknown = set(values) - set(OVERRIDABLE)
        if unknown:
            raise SpecchatError(f"cannot override {', '.join(sorted(unknown))}")
        self.overrides = {k: v for k, v in values.items() if v is not None}

    def check_overrides(self, **values: Any) -> None:
        """Raise SpecchatError (one line) unless `values` make a valid preset of every preset they may apply to."""
        unknown = set(values) - set(OVERRIDABLE)
        if unknown:
            raise SpecchatError(f"cannot override {', '.join(sorted(unknown))}")
        values = {k: v for k, v in values.items() if v is not None}
        if self.mode == "auto":
            bases = [self.presets[n] for n in ("code", "qa", "creative") if n in self.presets]
        else:
            bases = [self.presets[self.mode]]
        for base in bases:
            try:
                with_overrides(base, values)
            except PresetError as exc:
                raise SpecchatError(str(exc)) from None

    def effective_preset(self, name: str) -> Preset:
        """Preset `name` as the next reply would use it: with this chat's overrides."""
        preset = self.presets[name]
        if not self.overrides:
            return preset
        update = dict(self.overrides)
        if "temperature" in update and "ramp_tokens" not in update:
            update["ramp_tokens"] = 0  # an explicit temperature means exactly that temperature
        return preset.model_copy(update=update)

    def set_system_prompt(self, text: str | None) -> None:
        """The system prompt of this chat's next requests (empty: none); the stored chat records it."""
        text = (text or "").strip() or None
        if text == self.settings.system_prompt:
            return
        self.settings = self.settings.model_copy(update={"system_prompt": text})
        if self.recorder is not None:
            self.recorder.chat_settings_changed(system_prompt=text)

    def choose_preset(self, text: str) -> tuple[Preset, bool, str]:
        """The preset for a message: (preset, chosen automatically, why)."""
        if self.mode == "auto":
            # The conversation counts: a follow-up ("show that function again") stays with the code before it.
            earlier = self.turns[:-1] if self.turns and self.turns[-1].role == "user" else self.turns
            decision = route(
                text,
                available=[n for n in ("code", "qa", "creative") if n in self.presets],
                recent=[(turn.role, turn.content) for turn in earlier[-RECENT_TURNS:]],
            )
            preset, auto, reason = self.presets[decision.preset], True, decision.reason
        else:
            preset, auto, reason = self.presets[self.mode], False, "chosen by hand"
        if self.overrides:
            preset = self.effective_preset(preset.name)
        return preset, auto, reason

    # --- conversation ----------------------------------------------------------------------------------------

    def new_chat(self) -> None:
        self.turns.clear()
        self.context_used = 0
        self.context_start = 0
        self.last_stats = None  # a new chat's status bar starts blank, not with the old chat's figures
        self.live = LiveStats()
        if self.recorder is not None:
            self.recorder.new_chat()

    def pop_last_exchange(self) -> str | None:
        """Remove the last user message and its reply; return the user's text (edit and resend)."""
        while self.turns and self.turns[-1].role != "user":
            self.turns.pop()
        if not self.turns:
            return None
        text = self.turns.pop().content
        self._recount_context()  # starts at the last kept user turn at the latest
        return text

    @property
    def context_turns(self) -> list[Turn]:
        """The turns the model sees (the oldest ones that no longer fit are left out)."""
        return self.turns[self.context_start :]

    def _recount_context(self, from_start: bool = False) -> None:
        """`context_used` and `context_start` for the conversation as it stands now: the turns the next reply will
        see, with room kept for that reply (after a reply, reopening a chat, paging, editing, another model).

        The oldest turns that no longer fit are left out here already, so the figure is the truth before the next
        message is typed; trimming only moves forward (`from_start` begins again at the first turn: another model).
        """
        if not self.turns or self.backend is None or self._info is None:
            self.context_used = 0
            self.context_start = 0
            return
        users = [i for i, t in enumerate(self.turns) if t.role == "user"]
        last_user = users[-1] if users else 0
        start = 0 if from_start else min(self.context_start, last_user)
        try:
            self.context_start, ids = self._fit(start, self._next_reserve(), last_user)
        except UserError:
            return  # the figure stays as it was; the next reply measures it again
        self.context_used = len(ids)

    def _recount_after_reply(self, on_event: EventCallback) -> None:
        """Recount once a reply ended; turns that no longer leave the next reply its room are said (ContextTrimmed)
        now, when they leave the context, not at the next message."""
        before = self.context_start
        self._recount_context()
        if self.context_start > before:
            on_event(
                ContextTrimmed(
                    dropped_turns=self.context_start - before,
                    prompt_tokens=self.context_used,
                    max_context=self.max_context,
                )
            )

    def _reserve(self, preset: Preset) -> int:
        """Room a reply with `preset` keeps free in the context for its answer."""
        return min(preset.max_new_tokens, self.max_context // 2)

    def _next_reserve(self) -> int:
        """The room the next reply will keep: its preset's, or (auto: the router picks per message) the largest any
        routed preset keeps, so that the turns shown as seen stay seen whichever preset the router picks."""
        if self.mode != "auto":
            return self._reserve(self.effective_preset(self.mode))
        names = [n for n in ("code", "qa", "creative") if n in self.presets] or list(self.presets)
        return max((self._reserve(self.effective_preset(n)) for n in names), default=0)

    def _fit(self, start: int, reserve: int, keep_from: int) -> tuple[int, list[int]]:
        """(first turn kept, prompt ids): from turn `start` on, the oldest exchanges are dropped until the prompt
        plus `reserve` fits, never past turn `keep_from` (the message being answered)."""
        assert self.backend is not None
        max_context = self.max_context
        ids = self.backend.encode_chat(self._messages(self.turns[start:]))
        while len(ids) + reserve > max_context and start < keep_from:
            start += 1
            while start < keep_from and self.turns[start].role != "user":
                start += 1
            ids = self.backend.encode_chat(self._messages(self.turns[start:]))
        return start, ids

    def send(
        self, text: str, on_event: EventCallback, cancel: threading.Event
    ) -> ReplyFinished | ReplyFailed:
        if not text.strip():
            raise SpecchatError("empty message: type something to send")
        turn = Turn("user", text)
        self.turns.append(turn)
        self._record_user(turn)
        return self._reply(text, on_event, cancel)

    def start(self, text: str, on_event: EventCallback) -> ReplyHandle:
        """`send()` in a thread of its own; events arrive on that thread, through `on_event`."""
        if not text.strip():
            raise SpecchatError("empty message: type something to send")
        return ReplyHandle(lambda cancel: self.send(text, on_event, cancel))

    def regenerate(self, on_event: EventCallback, cancel: threading.Event) -> ReplyFinished | ReplyFailed:
        """Generate the last reply again. Stopped (or failed) before its first token, the old reply stays."""
        replaced: list[Turn] = []
        while self.turns and self.turns[-1].role == "assistant":
            replaced.insert(0, self.turns.pop())
        if not self.turns:
            self.turns.extend(replaced)
            raise SpecchatError("nothing to regenerate yet")
        return self._reply(self.turns[-1].content, on_event, cancel, replaced=replaced)

    def _discard_user(self, turn: Turn | None) -> None:
        """A message taken back from the conversation leaves the store too (it is in the prompt again)."""
        if turn is not None and self.recorder is not None:
            self.recorder.discard(turn.message_id)

    def _undo_turn(self, replaced: list[Turn] | None, edited: list[Turn] | None = None) -> Turn | None:
        """A reply that produced nothing: a new message goes back to the user (returned, so its record can go too),
        a regenerated reply comes back; an edited message's old branch comes back."""
        if replaced is None:
            turn = self.turns.pop()
            self.turns.extend(edited or ())
            return turn
        self.turns.extend(replaced)
        return None

    # --- one reply -------------------------------------------------------------------------------------------

    def _messages(self, turns: list[Turn]) -> list[dict[str, str]]:
        messages = (
            [{"role": "system", "content": self.settings.system_prompt}]
            if self.settings.system_prompt
            else []
        )
        messages += [
            {"role": t.role, "content": t.content if t.role == "user" else without_reasoning(t.content)}
            for t in turns
            if t.content or t.role == "user"
        ]
        return messages

    def _fit_context(self, preset: Preset, on_event: EventCallback) -> list[int] | None:
        """Render the conversation, leaving out the oldest exchanges until prompt + reply room fits."""
        assert self.backend is not None
        max_context = self.max_context
        before = min(self.context_start, len(self.turns) - 1)
        start, ids = self._fit(before, self._reserve(preset), len(self.turns) - 1)
        if len(ids) + min(self._reserve(preset), 16) > max_context:
            return None
        self.context_start = start
        if start > before:
            on_event(
                ContextTrimmed(dropped_turns=start - before, prompt_tokens=len(ids), max_context=max_context)
            )
        return ids

    def _reply(
        self,
        text: str,
        on_event: EventCallback,
        cancel: threading.Event,
        replaced: list[Turn] | None = None,
        edited: list[Turn] | None = None,
        continuing: Turn | None = None,
    ) -> ReplyFinished | ReplyFailed:
        """One reply to the conversation as it stands. `replaced`: the turns a regenerate took away; `edited`:
        the old branch an edited message replaced; `continuing`: the reply (taken off the turns) this one
        extends."""
        if self.backend is None or self._info is None:
            raise SpecchatError("the model is not loaded yet")
        info = self._info
        preset, auto, reason = self.choose_preset(text)
        try:
            prompt_ids = self._fit_context(preset, on_event)
        except UserError as exc:
            self._discard_user(self._undo_turn(replaced, edited))
            return self._failed(str(exc), "", on_event, undone=True)
        prefix = continuing.content if continuing is not None else ""
        if prompt_ids is not None and continuing is not None:
            try:
                prompt_ids = self._continued_prompt(prefix)
            except SpecchatError:
                self._undo_turn(replaced)
                raise
            if len(prompt_ids) + 16 > self.max_context:
                prompt_ids = None
        if prompt_ids is None:
            self._discard_user(self._undo_turn(replaced, edited))
            return self._failed(
                f"message too long for the context ({self.max_context} tokens): shorten it or raise max_context",
                "",
                on_event,
                undone=True,
            )
        drafting = preset.drafting and preset.k > 0 and info.draft_mode != "none"
        if info.k_by_server:
            # The server drafts by its own settings: the preset's K is neither sent nor claimed.
            drafting = info.draft_mode != "none"
        request = GenerationRequest(
            prompt_ids=tuple(prompt_ids),
            sampler=preset.sampler(),
            max_new_tokens=max(1, min(preset.max_new_tokens, self.max_context - len(prompt_ids))),
            num_draft_tokens=preset.k if drafting and not info.k_by_server else 0,
            drafting=drafting,
            seed=self.settings.seed,
            k_mode=preset.k_mode,
            tuning_key=preset.name,
            acceptance_prior=self.acceptance_seed(preset.name)
            if drafting and preset.k_mode == "adaptive"
            else (),
            messages=tuple(self._messages(self.context_turns)),
        )
        started = ReplyStarted(
            preset=preset.name,
            auto=auto,
            router_reason=reason,
            num_draft_tokens=request.num_draft_tokens,
            temperature=request.sampler.temperature_at(0),
            drafting=drafting,
            prompt_tokens=len(prompt_ids),
            k_mode=request.k_mode if drafting else "fixed",
        )
        accounting = AcceptanceAccounting(t_start=self.clock())
        accounting.live.temperature = started.temperature
        self.live = accounting.live
        self.active = started
        self.last_prompt_ids = request.prompt_ids
        # The prefill counts from now: the status bar shows the prompt being read, not the last reply's figure.
        self.context_used = len(prompt_ids)
        on_event(started)
        if continuing is not None:
            reply_id = continuing.message_id  # the same row grows; never discarded from here
            own_row = None
        else:
            reply_id = self._record_reply_started(started, preset.temperature)
            own_row = reply_id
        token_ids: list[int] = []
        origins: list[bool] = []
        runs: list[OriginRun] = []
        pieces: list[str] = []
        # Per chunk: (where its text starts in the reply, tokens, drafted, accepted), to count reasoning apart.
        marks: list[tuple[int, int, int, int]] = []
        chars = 0
        done: Done | None = None
        try:
            # Stopped before it began (esc right after enter): the backend is not asked at all.
            events = self.backend.generate(request, cancel) if not cancel.is_set() else iter(())
            for event in events:
                if isinstance(event, Chunk):
                    accounting.add(event)
                    token_ids.extend(event.token_ids)
                    origins.extend(event.origins)
                    merge_runs(runs, split_chunk_by_origin(event, self.backend.decode))
                    pieces.append(event.text)
                    marks.append((chars, event.n_tokens, event.drafted, event.accepted))
                    chars += len(event.text)
                    self.context_used = len(prompt_ids) + accounting.live.new_tokens
                    on_event(event)
                    if self.recorder is not None:
                        self.recorder.reply_progress(reply_id, lambda: prefix + "".join(pieces))
                else:
                    done = event
        except UserError as exc:
            if not pieces:
                # Nothing arrived (a server gone before its first token): as for a reply stopped before it
                # began, the message goes back to the user (a regenerated reply's old one stays).
                self._discard_user(self._undo_turn(replaced, edited))
                return self._failed(without_partial_claim(str(exc)), "", on_event, own_row, undone=True)
            return self._failed(str(exc), prefix + "".join(pieces), on_event, reply_id)
        except MemoryError:
            return self._failed(
                "out of memory while generating: lower max_context or max_new_tokens",
                prefix + "".join(pieces),
                on_event,
                reply_id,
            )
        finally:
            self.active = None
        if done is None:  # a backend that ended without its Done: treat what came as complete
            done = Done("cancelled" if cancel.is_set() else "eos", prompt_tokens=len(prompt_ids))
        if done.stop_reason == "max_new_tokens" and request.max_new_tokens < preset.max_new_tokens:
            # The limit it ran into was the room left in the context, not the preset's reply length.
            done = dataclasses.replace(done, stop_reason="context")
        reply_text = "".join(pieces)
        stats = accounting.finish(
            done,
            self.clock(),
            preset=preset.name,
            num_draft_tokens=request.num_draft_tokens,
            temperature=preset.temperature,
            draft_mode=info.draft_mode if drafting else "none",
            backend=info.backend,
            model=info.model,
            router_reason=reason if auto else "",
            cache_mode=info.cache_mode,
            k_mode=request.k_mode if drafting else "fixed",
        )
        if info.k_by_server:
            stats = dataclasses.replace(stats, k_by_server=True)
        stats = with_thinking_counts(stats, reply_text, marks)
        self._rejudge_drafting()
        if self.verdict is not None and self.verdict.pays is not None:
            stats = dataclasses.replace(
                stats, draft_verdict=self.verdict.short(), draft_verdict_status=self.verdict.status
            )
        cancelled = done.stop_reason == "cancelled"
        self.last_stats = stats
        if cancelled and not token_ids and not reply_text:
            # Nothing came: a new message goes back to the user untouched, a regenerated reply's old one stays.
            self._discard_user(self._undo_turn(replaced, edited))
            if self.recorder is not None:
                self.recorder.discard(own_row)
            reply_text = ""  # nothing new: a continued reply stays as it was
        else:
            if continuing is not None:
                # The continued reply is one reply: its text, origins and colouring grow by what came now.
                runs = [*(continuing.runs or ((prefix, False),)), *runs]
                origins = [*(continuing.origins or ()), *origins]
                reply_text = prefix + reply_text
            self.turns.append(
                Turn("assistant", reply_text, stats, tuple(origins), cancelled, reply_id, runs=tuple(runs))
            )
            self._record_reply_end(reply_id, reply_text, stats, encode_runs(runs))
        finished = ReplyFinished(reply_text, tuple(token_ids), tuple(origins), stats, cancelled)
        self._recount_after_reply(on_event)  # before the event: the UI reads the figure and the kept turns
        on_event(finished)
        return finished

    def acceptance_seed(self, preset: str) -> tuple[float, ...]:
        """Per-position acceptance of the preset's recent logged replies on this model (adaptive K's start)."""
        if preset not in self._acceptance_seeds:
            info = self._info
            rows: list[dict[str, Any]] = []
            if info is not None:
                if self.recorder is not None:
                    rows = self.recorder.recent_metrics()
                else:
                    try:
                        rows = metrics.read(data_dir(self.settings) / metrics.METRICS_NAME)
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

    def _failed(
        self,
        message: str,
        partial: str,
        on_event: EventCallback,
        reply_id: int | None = None,
        undone: bool = False,
    ) -> ReplyFailed:
        message = " ".join(message.split())
        if partial:
            self.turns.append(Turn("assistant", partial, cancelled=True, message_id=reply_id))
            if self.recorder is not None:
                self.recorder.reply_ended(reply_id, partial, "error", error=message)
        elif self.recorder is not None:
            self.recorder.discard(reply_id)
        failed = ReplyFailed(message, partial, undone=undone)
        self._recount_after_reply(on_event)
        on_event(failed)
        return failed
