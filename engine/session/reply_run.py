"""One reply in one pass, from request to recorded reply: `ReplyRun`, which `ChatSession` runs for send, regenerate,
edit and continue. Its steps, in order:

- plan: the preset chosen, the conversation fitted into the context, how it drafts decided once (`DraftChoice`:
  the K the request sends, the started event says, the stored row and the stats keep), the request built;
- begin: the live figures reset, the started event, the reply's row in the store;
- stream: the backend's chunks counted, shown and written as they come, until its Done;
- finish: how it ended and its stats, with the machine's draft verdict judged again from the costs measured now;
- record: the reply in the turns, the store and the metrics log, the context recounted, the finished event.

A reply that produced nothing is taken back (`Undo`): a new message goes back to the user, a regenerated reply's
old one stays, an edited message's old branch comes back. The parts these steps use are `reply`'s functions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import engine.session.editing as editing
from engine.decoding.acceptance import AcceptanceAccounting
from engine.errors import SpecchatError, UserError
from engine.events import Chunk, Done, MessageStats, ReplyFailed, ReplyFinished, ReplyStarted
from engine.origins import encode_runs
from engine.presets import Preset
from engine.request import GenerationRequest, HistoryCorpus
from engine.session.context_window import reply_room
from engine.session.reply import (
    DraftChoice,
    ReplyText,
    draft_choice,
    reply_done,
    reply_request,
    reply_stats,
    without_partial_claim,
)
from engine.session.turn import Turn

if TYPE_CHECKING:
    from engine.session.chat_session import ChatSession

EventCallback = Callable[[object], None]


@dataclasses.dataclass
class Undo:
    """What a reply that produced nothing puts back: `replaced`, the turns a regenerate (or continue) took away;
    `edited`, the old branch an edited message replaced. With no `replaced`, the new message at the end of the turns
    goes back to the user (returned, so its row can go too)."""

    replaced: list[Turn] | None = None
    edited: list[Turn] | None = None

    def apply(self, turns: list[Turn]) -> Turn | None:
        if self.replaced is None:
            turn = turns.pop()
            turns.extend(self.edited or ())
            return turn
        turns.extend(self.replaced)
        return None


@dataclasses.dataclass
class ReplyPlan:
    """What the reply is, settled before the backend is asked."""

    preset: Preset
    auto: bool
    reason: str
    choice: DraftChoice  # how it drafts (K), decided once
    prompt_ids: list[int]
    request: GenerationRequest
    started: ReplyStarted


class ReplyRun:
    """One reply to `session`'s conversation as it stands (see the module's steps). `continuing`: the reply (taken off
    the turns) this one extends; its row grows instead of a new one."""

    def __init__(
        self,
        session: ChatSession,
        text: str,
        on_event: EventCallback,
        cancel: threading.Event,
        undo: Undo | None = None,
        continuing: Turn | None = None,
    ) -> None:
        self.session = session
        self.text = text
        self.on_event = on_event
        self.cancel = cancel
        self.undo = undo or Undo()
        self.continuing = continuing
        self.prefix = continuing.content if continuing is not None else ""
        self.reply_id: int | None = None  # the row the reply writes to
        self.own_row: int | None = None  # the row this reply created (a continued reply grows another's)

    def run(self) -> ReplyFinished | ReplyFailed:
        plan = self.plan()
        if isinstance(plan, ReplyFailed):
            return plan
        accounting = self.begin(plan)
        streamed = ReplyText()
        done = self.stream(plan, accounting, streamed)
        if isinstance(done, ReplyFailed):
            return done
        stats = self.finish(plan, accounting, done, streamed)
        return self.record(stats, done, streamed)

    # --- the steps -------------------------------------------------------------------------------------------

    def plan(self) -> ReplyPlan | ReplyFailed:
        """The preset, the prompt that fits, how the reply drafts (once), the request."""
        session = self.session
        info = session.info
        if session.backend is None or info is None:
            raise SpecchatError("the model is not loaded yet")
        preset, auto, reason = session.preset_choice.choose(self.text, session.turns)
        prompt_ids = self.fit(preset)
        if isinstance(prompt_ids, ReplyFailed):
            return prompt_ids
        choice = draft_choice(preset, info)
        request, started = reply_request(
            preset,
            choice,
            prompt_ids,
            session.messages(session.context_turns),
            max_context=session.max_context,
            seed=session.settings.seed,
            acceptance_seed=lambda name: session.history.acceptance_seed(name, info, session.settings),
            auto=auto,
            reason=reason,
            history=self.drafting_corpus,
        )
        return ReplyPlan(preset, auto, reason, choice, prompt_ids, request, started)

    def fit(self, preset: Preset) -> list[int] | ReplyFailed:
        """The conversation rendered, the oldest exchanges left out until prompt + reply room fits (a continued
        reply: its prompt ends where it stopped); too long even so, the reply is taken back."""
        session = self.session
        max_context = session.max_context
        try:
            prompt_ids = session.context_window.fit_reply(
                session.turns, session.encode, max_context, reply_room(preset, max_context), self.on_event
            )
        except UserError as exc:
            return self.taken_back(str(exc))
        if prompt_ids is not None and self.continuing is not None:
            try:
                prompt_ids = editing.continued_prompt(
                    session.backend, session.messages(session.context_turns), self.prefix
                )
            except UserError:
                self.undo.apply(session.turns)
                raise
            if len(prompt_ids) + 16 > max_context:
                prompt_ids = None
        if prompt_ids is None:
            return self.taken_back(
                f"message too long for the context ({max_context} tokens): shorten it or raise max_context"
            )
        return prompt_ids

    def begin(self, plan: ReplyPlan) -> AcceptanceAccounting:
        """The live figures start afresh, the UI hears the reply started, and its row is written."""
        session = self.session
        accounting = AcceptanceAccounting(t_start=session.clock())
        accounting.live.temperature = plan.started.temperature
        session.live = accounting.live
        session.active = plan.started
        session.last_prompt_ids = plan.request.prompt_ids
        # The prefill counts from now: the status bar shows the prompt being read, not the last reply's figure.
        session.context_window.used = len(plan.prompt_ids)
        self.on_event(plan.started)
        if self.continuing is not None:
            self.reply_id = self.continuing.message_id  # the same row grows; never discarded from here
        else:
            self.reply_id = session.history.record_reply_started(
                session.turns, plan.started, plan.preset.temperature
            )
            self.own_row = self.reply_id
        return accounting

    def stream(
        self, plan: ReplyPlan, accounting: AcceptanceAccounting, streamed: ReplyText
    ) -> Done | ReplyFailed:
        """The backend's chunks, counted, shown and written as they come; how it ended."""
        session = self.session
        backend = session.backend
        assert backend is not None
        done: Done | None = None
        try:
            # Stopped before it began (esc right after enter): the backend is not asked at all.
            events = backend.generate(plan.request, self.cancel) if not self.cancel.is_set() else iter(())
            for event in events:
                if isinstance(event, Chunk):
                    accounting.add(event)
                    streamed.add(event, backend.decode)
                    session.context_window.used = len(plan.prompt_ids) + accounting.live.new_tokens
                    self.on_event(event)
                    session.history.reply_progress(self.reply_id, lambda: self.prefix + streamed.text)
                else:
                    done = event
        except UserError as exc:
            if not streamed.pieces:
                # Nothing arrived (a server gone before its first token): as for a reply stopped before it
                # began, the message goes back to the user (a regenerated reply's old one stays).
                return self.taken_back(without_partial_claim(str(exc)), self.own_row)
            return self.failed(str(exc), self.prefix + streamed.text, self.reply_id)
        except MemoryError:
            return self.failed(
                "out of memory while generating: lower max_context or max_new_tokens",
                self.prefix + streamed.text,
                self.reply_id,
            )
        finally:
            session.active = None
        return reply_done(done, self.cancel.is_set(), plan.request, plan.preset)

    def finish(
        self, plan: ReplyPlan, accounting: AcceptanceAccounting, done: Done, streamed: ReplyText
    ) -> MessageStats:
        """The reply's stats, with the machine's verdict as the costs measured now say it."""
        session = self.session
        assert session.info is not None
        stats = reply_stats(
            accounting,
            done,
            session.clock(),
            preset=plan.preset,
            choice=plan.choice,
            info=session.info,
            auto=plan.auto,
            reason=plan.reason,
            text=streamed,
        )
        verdict = session.rejudge_drafting()
        if verdict is not None and verdict.pays is not None:
            stats = dataclasses.replace(
                stats, draft_verdict=verdict.short(), draft_verdict_status=verdict.status
            )
        session.last_stats = stats
        return stats

    def record(self, stats: MessageStats, done: Done, streamed: ReplyText) -> ReplyFinished:
        """The reply in the turns, the store and the metrics log (or, where nothing came, taken back); the context
        recounted; the finished event."""
        session = self.session
        reply_text, token_ids = streamed.text, streamed.token_ids
        origins, runs = streamed.origins, streamed.runs
        cancelled = done.stop_reason == "cancelled"
        if cancelled and not token_ids and not reply_text:
            # Nothing came: a new message goes back to the user untouched, a regenerated reply's old one stays.
            self.discard_user(self.undo.apply(session.turns))
            session.history.discard(self.own_row)
            reply_text = ""  # nothing new: a continued reply stays as it was
        else:
            if self.continuing is not None:
                reply_text, origins, runs = editing.grown(self.continuing, reply_text, origins, runs)
            session.turns.append(
                Turn(
                    "assistant", reply_text, stats, tuple(origins), cancelled, self.reply_id, runs=tuple(runs)
                )
            )
            session.history.record_reply_end(
                self.reply_id, reply_text, stats, encode_runs(runs), session.info, session.model_dir
            )
        finished = ReplyFinished(reply_text, tuple(token_ids), tuple(origins), stats, cancelled)
        session.recount_context(
            on_event=self.on_event
        )  # before the event: the UI reads the figure, the kept turns
        self.on_event(finished)
        return finished

    # --- what the steps share --------------------------------------------------------------------------------

    def drafting_corpus(self) -> HistoryCorpus | None:
        """The history drafter's corpus from the store (`ChatHistory.drafting_corpus`), unless turned off."""
        session = self.session
        return session.history.drafting_corpus(session.turns) if session.settings.history_drafting else None

    def discard_user(self, turn: Turn | None) -> None:
        """A message taken back from the conversation leaves the store too (it is in the prompt again)."""
        if turn is not None:
            self.session.history.discard(turn.message_id)

    def taken_back(self, message: str, reply_id: int | None = None) -> ReplyFailed:
        """Nothing came of the reply: what it took goes back (`Undo`), and the failure says why."""
        self.discard_user(self.undo.apply(self.session.turns))
        return self.failed(message, "", reply_id, undone=True)

    def failed(
        self, message: str, partial: str, reply_id: int | None = None, undone: bool = False
    ) -> ReplyFailed:
        """The reply failed: what it wrote stays (marked failed in the store), or its row goes."""
        session = self.session
        message = " ".join(message.split())
        if partial:
            session.turns.append(Turn("assistant", partial, cancelled=True, message_id=reply_id))
            session.history.reply_failed(reply_id, partial, message)
        else:
            session.history.discard(reply_id)
        failed = ReplyFailed(message, partial, undone=undone)
        session.recount_context(on_event=self.on_event)
        self.on_event(failed)
        return failed
