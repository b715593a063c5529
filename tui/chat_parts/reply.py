"""A reply's life on the chat screen, from the prompt to its stats line: the chat screen's `ReplyLifecycle`.

Starting a reply (or keeping a message waiting while the model loads), the generation thread (a `generate` worker
on the screen, group "generate": its failure reaches the app's one handler), the `ReplyBuffer` drained into the
reply on screen (`tui.streaming`), the session's events (started, context trimmed, finished, failed), the reply a
regenerate or continue replaces (hidden while the new one streams: dropped once it has text, shown again if it
ends empty), and the reply's end.

Where the model's threads take every core (`tui.streaming.contended`: llama.cpp on a small CPU), the UI keeps its
work out of the model's way: the reply's first frame is drawn before the model starts, the first text waits one
redraw interval, the start's header comes with it, and the status bar follows the text's redraws
(docs/performance.md, "A short answer where the model's threads take every core").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from engine.events import Chunk, ContextTrimmed, ReplyFailed, ReplyFinished, ReplyStarted
from tui.messages import ReplyEventArrived, ReplyTextArrived
from tui.reply_header import started_header
from tui.streaming import LockHandoff, RenderPace, ReplyBuffer, contended, model_threads, ui_budget
from tui.widgets.message import ReplyMessage, UserMessage

# The longest a reply's model start waits for the screen to lay the reply out (`ReplyLifecycle._run_after_layout`).
LAYOUT_WAIT_S = 0.1
# While a reply streams, the status bar follows its text redraws; on its own only after this long without one,
# or this long after the reply started without a first text (its prefill).
STATUS_WITH_TEXT_S = 1.5
FIRST_TEXT_WAIT_S = 0.5

if TYPE_CHECKING:
    from textual.screen import Screen
    from textual.signal import Signal
    from textual.timer import Timer

    from engine.session import ChatSession
    from tui.chat_parts.branches import BranchEditor, ReplyFlow
    from tui.widgets.chat_log import ChatLog
    from tui.widgets.prompt import PromptInput


class ReplyScreen(Protocol):
    """What the part uses of the chat screen: its widgets and parts, and what the screen does around a reply."""

    chat_log: ChatLog
    prompt: PromptInput
    branches: BranchEditor
    highlight_drafts: bool
    screen_layout_refresh_signal: Signal[Screen]

    @property
    def session(self) -> ChatSession: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def post_message(self, message: Any) -> bool: ...

    def run_worker(self, work: Any, **kwargs: Any) -> Any: ...

    def call_after_refresh(self, callback: Any, *args: Any) -> bool: ...

    def set_timer(self, delay: float, callback: Any) -> Timer: ...

    def refresh_status(self) -> None: ...

    async def keys_settled(self) -> None: ...

    def mark_context(self) -> None: ...

    def reply_shown(self, reply: ReplyMessage) -> None: ...

    async def say_verdict(self, changed: bool = False) -> None: ...


class ReplyLifecycle:
    """The reply under way (its widget, buffer and stop flag), the message waiting for the model, and the reply
    being replaced. `screen` is the chat screen, seen as a `ReplyScreen`."""

    def __init__(self, screen: ReplyScreen) -> None:
        self.screen = screen
        self.streaming: ReplyMessage | None = None  # the reply on screen while it streams
        self.buffer: ReplyBuffer | None = None
        self._cancel: threading.Event | None = None
        self._pace = RenderPace()
        self._handoff = LockHandoff()
        self._pending_prompt = ""
        # Where the model's threads take every core (tui/streaming.py `contended`): the reply's first frames are
        # drawn before the model starts, and the header its start event gives waits for the first text.
        self._quiet = False
        self._started: ReplyStarted | None = None
        # A message sent while the model loads: shown as waiting and sent once the model is ready.
        self.queued: tuple[str, UserMessage] | None = None
        # The reply a regenerate is replacing: hidden while the new one streams, shown again if that one ends empty.
        self._replaced: ReplyMessage | None = None
        # Timestamps for the UI benchmark: when the final text of the last reply was on screen.
        self.rendered_at: float | None = None
        self.drawn_at = 0.0  # when the streaming reply's text was last drawn (`drain`)
        self.started_at = 0.0  # when it started (`start`)
        self.last_chunk_t: float | None = None

    @property
    def generating(self) -> bool:
        return self.streaming is not None

    def status_due(self) -> bool:
        """Whether the status bar's periodic refresh is due. While a reply streams its text redraws refresh the
        status bar too, so the timer does only where none came within `STATUS_WITH_TEXT_S` (a stall), or where
        the first text has not come `FIRST_TEXT_WAIT_S` after the reply started (a long prefill). A refresh of its
        own is a frame, and where the model's threads fill the cores a frame's UI work costs the model twice its
        share of a core."""
        if not self.generating:
            return True
        if self.drawn_at:
            return time.monotonic() - self.drawn_at >= STATUS_WITH_TEXT_S
        return time.monotonic() - self.started_at >= FIRST_TEXT_WAIT_S

    def show_pending_start(self) -> None:
        """The header of the reply's start, where it still waits for the first text (a long prefill)."""
        if self._started is not None and self.streaming is not None:
            self._show_started(self._started)

    # --- starting a reply -------------------------------------------------------------------------------------

    async def send(self, text: str, flow: ReplyFlow | None = None) -> None:
        """Send `text` (an edit's `flow` has mounted its message already; a plain message is mounted here)."""
        if flow is None:
            self.screen.prompt.clear()
            await self.screen.chat_log.mount(UserMessage(text))
        await self.start(text, flow=flow)

    async def regenerate(self) -> None:
        """A new reply in place of the last one, which is hidden (not removed) until the new one has text."""
        messages = self.screen.chat_log.messages()
        if messages and isinstance(messages[-1], ReplyMessage):
            self.replace(messages[-1])
        await self.start(None)

    def replace(self, reply: ReplyMessage) -> None:
        """Hide `reply` while the next one streams: it comes back if that one is stopped before its first token."""
        self._replaced = reply
        reply.display = False

    async def start(self, text: str | None, flow: Any = None, prefix: Any = None) -> None:
        """Mount an empty reply and run the session in a thread. `text` None regenerates the last reply; `flow`
        (a session call taking on_event and cancel: an edit, a continue) runs instead; `prefix` is the text
        (origin runs) a continued reply starts with."""
        screen = self.screen
        reply = ReplyMessage(highlight=screen.highlight_drafts)
        self.buffer = None  # nothing of an earlier reply's buffer reaches this one while it mounts
        self.streaming = reply
        screen.refresh_status()  # the footer's keys change (stop) while the reply mounts, not after
        await screen.chat_log.mount(reply)
        if prefix:
            await reply.append_runs(prefix)
        screen.chat_log.anchor()
        backend = screen.session.backend
        threads = model_threads(backend)
        self._quiet = contended(threads)
        self._started = None
        self.drawn_at, self.started_at = 0.0, time.monotonic()
        self.buffer = ReplyBuffer(
            decode=backend.decode if backend is not None else None, first_waits=self._quiet
        )
        self._pace = RenderPace(budget=ui_budget(threads))
        self._handoff.begin()  # the generation thread gets the interpreter lock back quickly (tui/streaming.py)
        self._cancel = threading.Event()
        self._pending_prompt = text or ""
        # A blinking cursor repaints the prompt twice a second: while a reply streams it stays lit instead.
        screen.prompt.cursor_blink = False
        work = partial(self._generate, text, self.buffer, self._cancel, flow)
        if self._quiet:
            # The reply's mount is laid out and drawn before the model starts: on cores the model's threads fill,
            # that frame (~10-25 ms of the UI thread at 160x48) would stall the first tokens instead. A key the
            # footer mounted (stop, in a chat's first reply) is in that frame too, not one of its own after it.
            await screen.keys_settled()
            self._run_after_layout(reply, partial(self._run, work, text))
        else:
            self._run(work, text)

    def _run_after_layout(self, reply: ReplyMessage, run: Callable[[], None]) -> None:
        """`run` once the screen has laid out and drawn `reply` (Textual's layout-refresh signal), or after
        `LAYOUT_WAIT_S` where no layout comes."""
        signal = self.screen.screen_layout_refresh_signal
        started = False

        def go(*_: object) -> None:
            nonlocal started
            if not started:
                started = True
                signal.unsubscribe(reply)
                timer.stop()
                run()

        signal.subscribe(reply, go, immediate=True)
        timer = self.screen.set_timer(LAYOUT_WAIT_S, go)

    def _run(self, work: Any, text: str | None) -> None:
        self.screen.run_worker(
            work,
            name="generate",
            group="generate",
            description=f"generate({text!r})",
            exclusive=True,
            exit_on_error=False,
            thread=True,
        )

    def _generate(self, text: str | None, buffer: ReplyBuffer, cancel: threading.Event, flow: Any) -> None:
        """The generation thread: it only fills the buffer and posts messages to the screen."""
        post = self.screen.post_message

        def on_event(event: object) -> None:
            if isinstance(event, Chunk):
                if buffer.add(event):
                    post(ReplyTextArrived(buffer))
            else:
                if isinstance(event, ReplyFinished | ReplyFailed):
                    buffer.finished = True
                post(ReplyEventArrived(event, buffer))

        session = self.screen.session
        if flow is not None:
            result = flow(on_event, cancel)
        elif text is None:
            result = session.regenerate(on_event, cancel)
        else:
            result = session.send(text, on_event, cancel)
        if not buffer.finished:  # a session that returned without emitting its last event
            on_event(result)

    # --- a message waiting for the model ----------------------------------------------------------------------

    async def queue(self, text: str) -> None:
        """Sent while the model loads: shown as waiting, sent once it is ready (`send_queued`)."""
        if self.queued is not None:
            self.screen.notify("A message is already waiting for the model.", severity="warning")
            return
        self.screen.prompt.clear()
        waiting = UserMessage(text, waiting=True)
        await self.screen.chat_log.mount(waiting)
        self.screen.chat_log.anchor()
        self.queued = (text, waiting)

    async def send_queued(self) -> None:
        if self.queued is not None:
            text, message = self.queued
            self.queued = None
            message.set_waiting(False)
            await self.start(text)

    def unqueue(self) -> None:
        if self.queued is not None:  # the waiting message goes back to the prompt: nothing typed is lost
            text, waiting = self.queued
            self.queued = None
            waiting.remove()
            self._give_back(text)

    def _give_back(self, text: str) -> None:
        """Put a message that was not answered back in the prompt, before anything typed since."""
        prompt = self.screen.prompt
        typed = prompt.text.strip()
        prompt.set_text(text if not typed else f"{text}\n{typed}")
        prompt.focus()

    # --- streaming --------------------------------------------------------------------------------------------

    async def drain(self, buffer: ReplyBuffer) -> None:
        runs = buffer.take()
        if self.streaming is None or buffer is not self.buffer:
            return  # an earlier reply's text
        self.show_pending_start()
        if runs:
            # The next redraw waits longer while the UI thread is over its share of a core (tui/streaming.py).
            buffer.interval_s = self._pace.observe()
            await self.streaming.append_runs(runs)
            # The status bar's live figures in the frame that draws the text (`status_due`), not one of their own.
            self.drawn_at = time.monotonic()
            self.screen.refresh_status()

    async def drain_overdue(self) -> None:
        # A reply that stalls right after a chunk that was not posted (the 50 ms rule) still shows up here.
        if self.buffer is not None and self.streaming is not None and self.buffer.overdue:
            await self.drain(self.buffer)

    async def event_arrived(self, event: object, buffer: ReplyBuffer) -> None:
        if buffer is not self.buffer or self.streaming is None:
            return
        screen = self.screen
        if isinstance(event, ReplyStarted):
            if self._quiet:
                self._started = event  # shown with the first text (`drain`), in the frame that draws it
            else:
                self._show_started(event)
        elif isinstance(event, ContextTrimmed):
            screen.mark_context()
            screen.notify(
                f"The {event.dropped_turns} oldest turns no longer fit the context: the model does not see them "
                f"(dimmed, above the rule). Next prompt {event.prompt_tokens}/{event.max_context} tokens.",
                title="Context trimmed",
                severity="warning",
            )
        elif isinstance(event, ReplyFinished):
            await self._finished(event, buffer)
        elif isinstance(event, ReplyFailed):
            await self._failed(event, buffer)

    def _show_started(self, event: ReplyStarted) -> None:
        assert self.streaming is not None
        self._started = None
        by_server = bool(self.screen.session.info and self.screen.session.info.k_by_server)
        self.streaming.set_header(started_header(event, by_server))
        self.screen.refresh_status()

    async def _finished(self, event: ReplyFinished, buffer: ReplyBuffer) -> None:
        reply = self.streaming
        assert reply is not None
        await self.drain(buffer)
        self.last_chunk_t = buffer.last_chunk_t
        if event.cancelled and not event.text:
            await self._restore_prompt(reply)
        else:
            await reply.finish(event.text, event.stats, cancelled=event.cancelled)
            await self._drop_replaced()
            self.screen.call_after_refresh(self._mark_rendered)
            self.screen.reply_shown(reply)
        self._end()
        if self.screen.session.verdict_changed:
            await self.screen.say_verdict(changed=True)

    async def _failed(self, event: ReplyFailed, buffer: ReplyBuffer) -> None:
        reply = self.streaming
        assert reply is not None
        await self.drain(buffer)
        if event.undone:
            await self._restore_prompt(reply)
        else:
            await reply.finish(event.partial_text, None, error=event.message)
            await self._drop_replaced()
        self._end()
        self.screen.notify(event.message, title="Reply failed", severity="error", timeout=10)

    def crashed(self, message: str) -> None:
        """The generation thread raised what the session did not catch: the reply ends, marked failed."""
        reply = self.streaming
        if reply is None:
            return
        self.screen.run_worker(self._drop_replaced(), exclusive=False)
        self._end()
        self.screen.run_worker(reply.finish(reply.text, None, error=message), exclusive=False)

    def _mark_rendered(self) -> None:
        self.rendered_at = time.perf_counter()

    # --- stopping and ending ----------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Esc while a reply streams: the thread is told to stop, the reply says so. False when none streams."""
        if self._cancel is None:
            return False
        self._cancel.set()
        if self.streaming is not None:
            self.streaming.set_stopping()
        return True

    def close(self) -> str:
        """The screen goes (quitting): the generation thread stops; returns the message still waiting, if any."""
        if self._cancel is not None:
            self._cancel.set()
        self._handoff.end()
        return self.queued[0] if self.queued else ""

    async def _restore_prompt(self, reply: ReplyMessage) -> None:
        """Nothing came (stopped before the first token): undo on screen what the session undid.

        A new message leaves the log and goes back to the prompt; a regenerate shows the old reply again.
        """
        chat_log = self.screen.chat_log
        messages = chat_log.messages()
        to_remove: list[Any] = [reply]
        index = messages.index(reply) if reply in messages else -1
        if index > 0 and isinstance(messages[index - 1], UserMessage) and self._pending_prompt:
            to_remove.append(messages[index - 1])
        await chat_log.remove_children(to_remove)
        if self._replaced is not None:
            self._replaced.display = True
            self._replaced = None
        self.screen.branches.show_hidden()
        if self._pending_prompt:
            self._give_back(self._pending_prompt)
        self.screen.prompt.focus()

    async def _drop_replaced(self) -> None:
        await self.screen.branches.drop_hidden()
        if self._replaced is not None:
            replaced, self._replaced = self._replaced, None
            await replaced.remove()

    def _end(self) -> None:
        self._handoff.end()
        self.streaming = None
        self._cancel = None
        self.screen.prompt.cursor_blink = True
        self.screen.mark_context()
        self.screen.refresh_status()
