"""specchat's Textual app: the chat log, the prompt, the live status bar, presets on F-keys.

Threads: the model loads in a thread worker (group "load") and every reply runs in
`@work(thread=True, exclusive=True, exit_on_error=False, group="generate")`. The generation thread only
fills a `ReplyBuffer` and posts `ReplyTextArrived` at most every 0.1 s (longer while the UI thread is over its
budget: `tui.streaming.RenderPace`), plus one message per session event (`ReplyStarted`, `ContextTrimmed`,
`ReplyFinished`, `ReplyFailed`). The status bar reads the session's plain attributes on a 0.25 s timer. One `Worker.StateChanged` handler turns unexpected failures into an error modal.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.driver import Driver
from textual.screen import ModalScreen
from textual.worker import Worker, WorkerState

from engine.backends.base import Backend
from engine.config import ConfigError, Settings, save_setting
from engine.errors import SpecchatError
from engine.events import Chunk, ContextTrimmed, ReplyFailed, ReplyFinished, ReplyStarted
from engine.session import ChatSession
from tui.chat_flows import ChatFlows
from tui.clipboard import copy_text
from tui.commands import SpecchatCommands
from tui.formatting import verdict_line
from tui.keymap import APP_KEYS, bindings, check_keymap, key_for
from tui.messages import LoadProgressed, ReplyEventArrived, ReplyTextArrived
from tui.reply_header import started_header, variant_header
from tui.screens.error import ErrorScreen
from tui.screens.help import HelpScreen
from tui.screens.inspector import InspectorScreen, context_line
from tui.screens.presets import PresetPickerScreen
from tui.screens.settings import open_chat_settings, reopen_after_failed_load
from tui.streaming import RenderPace, ReplyBuffer
from tui.widgets.chat_log import ChatLog
from tui.widgets.footer import FittingFooter
from tui.widgets.message import ReplyMessage, UserMessage, code_blocks
from tui.widgets.prompt import PromptInput
from tui.widgets.status_bar import StatusBar, collect_status

# The status bar's figures (tok/s, acceptance, sparkline) at 4 Hz: each repaint is a compositor pass on the UI
# thread, and the eye does not read a figure that changes faster. Measured at 160x48 while a reply streamed: the
# bar was the most repainted widget (85 of 180 repaints in 11 s at 10 Hz).
STATUS_INTERVAL_S = 0.25


# --- the app ----------------------------------------------------------------------------------------------


class SpecchatApp(ChatFlows, App[None]):
    TITLE = "specchat"
    CSS_PATH = Path(__file__).with_name("app.tcss")
    BINDINGS = bindings(APP_KEYS)
    COMMANDS = App.COMMANDS | {SpecchatCommands}

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        session: ChatSession | None = None,
        load_on_mount: bool = True,
        startup_error: str | None = None,
        open_chat: int | None = None,
    ) -> None:
        super().__init__()
        self.open_chat_id = open_chat  # a stored chat to continue (--resume, --chat ID)
        self._action_targets.add("prompt")  # "prompt.clear_prompt" in the key table: the prompt's action
        self.settings = settings
        if session is None:
            # A bad preset file is skipped (the session says which), the others load.
            session = ChatSession(settings, backend=backend)
        self.session = session
        self.load_on_mount = load_on_mount
        self.startup_error = startup_error
        self.state = "loading"  # loading / failed / ready
        self.state_message = "starting"
        self.load_error: str | None = None
        self.highlight_drafts = False
        self.keymap_problems = check_keymap(settings.keymap)
        # A keymap with errors (a stolen key, a key name that is no key) is not applied at all: defaults instead.
        self.keymap = (
            {} if any(p.severity == "error" for p in self.keymap_problems) else dict(settings.keymap)
        )
        self._cancel: threading.Event | None = None
        self._buffer: ReplyBuffer | None = None
        self._pace = RenderPace()
        self._reply: ReplyMessage | None = None
        self._pending_prompt = ""
        # A message sent while the model loads: shown as waiting and sent once the model is ready.
        self._queued: tuple[str, UserMessage] | None = None
        # The reply a regenerate is replacing: hidden while the new one streams, shown again if that one ends empty.
        self._replaced: ReplyMessage | None = None
        self._state_before_reload = "ready"  # what a failed reload of the model returns to
        self._footer_state: tuple[bool, bool, bool] | None = None
        # Timestamps for the UI benchmark: when the final text of the last reply was on screen.
        self.last_reply_rendered_at: float | None = None
        self.last_reply_last_chunk_t: float | None = None

    def get_driver_class(self) -> type[Driver]:
        # A paste with escape sequences in it must arrive whole (tui/terminal.py): our parser on Linux and macOS.
        driver = super().get_driver_class()
        if driver.__module__ == "textual.drivers.linux_driver":
            from tui.terminal import PasteSafeLinuxDriver

            return PasteSafeLinuxDriver
        return driver

    # --- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield ChatLog(id="chat-log")
        help_key = key_for("help.show", self.keymap)
        yield PromptInput(
            id="prompt", placeholder=f"Ask anything · enter sends · ctrl+j new line · {help_key} help"
        )
        yield StatusBar(id="status-bar")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.set_keymap(dict(self.keymap))
        self._apply_saved_theme()
        for problem in self.keymap_problems:
            self.notify(problem.message, severity=problem.severity, timeout=12)
        self.query_one(PromptInput).focus()
        self.set_interval(STATUS_INTERVAL_S, self._tick)
        # A dialog shows the chat dimmed behind it: the chat's scrollbar beside the dialog's read as a second one.
        self.watch(self.screen_stack[0], "stack_updates", self._chat_covered, init=False)
        self.refresh_status()
        for problem in self.session.skipped_presets.values():
            self.notify(
                f"{problem} (the file is skipped)", title="Preset skipped", severity="warning", timeout=15
            )
        if self.startup_error:
            # A broken config file: say so, and load the model all the same (the bad part left out).
            self.push_screen(ErrorScreen("The configuration has a problem", self.startup_error))
        if self.load_on_mount:
            self.start_loading()
        elif self._startup_banner() is not None:
            self.chat_log.set_banner(self._startup_banner(), error=True)
        if self.open_chat_id is not None:
            self.call_later(self.show_chat, self.open_chat_id)

    def _chat_covered(self) -> None:
        self.chat_log.set_class(self.screen is not self.screen_stack[0], "covered")

    def on_unmount(self) -> None:
        # Quitting mid-reply: stop the generation thread, or the process would wait for the whole reply.
        if self._cancel is not None:
            self._cancel.set()

    # The main screen's widgets, found once: `query_one` on the app searches the screen on top (a modal).
    @property
    def chat_log(self) -> ChatLog:
        return self.screen_stack[0].query_one(ChatLog)

    @property
    def prompt(self) -> PromptInput:
        return self.screen_stack[0].query_one(PromptInput)

    @property
    def status_bar(self) -> StatusBar:
        return self.screen_stack[0].query_one(StatusBar)

    @property
    def generating(self) -> bool:
        return self._reply is not None

    # --- periodic: status bar + draining a quiet buffer ------------------------------------------------------

    async def _tick(self) -> None:
        # A reply that stalls right after a chunk that was not posted (the 50 ms rule) still shows up here.
        if self._buffer is not None and self._reply is not None and self._buffer.overdue:
            await self._drain(self._buffer)
        for notice in self.session.take_notices():  # storage trouble (damaged db, full disk): told once
            self.notify(notice, title="History", severity="warning", timeout=12)
        self.check_open_elsewhere()
        self.refresh_status()

    def refresh_status(self) -> None:
        if not self.screen_stack or not self.is_running:
            return
        state = {"loading": "loading", "failed": "failed"}.get(self.state, "ready")
        self.status_bar.show(collect_status(self.session, state, self.state_message))
        # What check_action answers for the footer's keys: refresh them only when it changes.
        footer_state = (
            self.generating,
            self._queued is not None,
            any(t.role == "assistant" for t in self.session.turns),
        )
        if footer_state != self._footer_state:
            self._footer_state = footer_state
            self.refresh_bindings()

    # --- loading ---------------------------------------------------------------------------------------------

    def start_loading(self) -> None:
        self.state = "loading"
        self.state_message = "starting"
        self.chat_log.set_banner(
            Text.assemble(("◌ Loading the model…", "bold"), ("  you can type already", "dim"))
        )
        self.load_model()

    @work(thread=True, exclusive=True, exit_on_error=False, group="load")
    def load_model(self) -> None:
        def progress(stage: str, fraction: float | None) -> None:
            self.post_message(LoadProgressed(stage, fraction))

        try:
            info = self.session.load(progress)
        except SpecchatError as exc:
            self.call_from_thread(self._load_failed, str(exc))
            return
        self.call_from_thread(self._loaded, info)

    # --- another model or draft for this chat (the settings dialog); the conversation stays -----------------

    def start_reload(self, model: str | None, draft: str) -> None:
        """Load `model` (None: the embedded one) with `draft` in the background; the chat stays on screen and
        in the session, and messages sent meanwhile wait for the new model. A failure keeps the loaded one."""
        self._state_before_reload = self.state
        self.state = "loading"
        self.state_message = "starting"
        name = Path(model).name if model else "the embedded model"
        self.chat_log.set_banner(
            Text.assemble(
                ("◌ Loading ", "bold"),
                (name, "bold"),
                (f" (draft {Path(draft).name})", "bold"),
                ("  the chat stays; you can type already", "dim"),
            )
        )
        self.refresh_status()
        self.reload_model(model, draft)

    @work(thread=True, exclusive=True, exit_on_error=False, group="reload")
    def reload_model(self, model: str | None, draft: str) -> None:
        def progress(stage: str, fraction: float | None) -> None:
            self.post_message(LoadProgressed(stage, fraction))

        try:
            info = self.session.reload(model, draft, progress)
        except SpecchatError as exc:
            self.call_from_thread(self._reload_failed, str(exc))
            return
        self.call_from_thread(self._loaded, info, True)

    def _reload_failed(self, message: str) -> None:
        """The new model did not load: the old one (if any) stays, and so does everything typed."""
        self.state = self._state_before_reload
        self.state_message = (self.load_error or "") if self.state == "failed" else ""
        if self.state == "failed":
            self.chat_log.set_banner(
                Text.assemble(("✖ The model did not load: ", "bold red"), message), error=True
            )
        else:
            self.chat_log.set_banner(self._startup_banner(), error=self._startup_banner() is not None)
        loaded = self.session.info.model if self.session.info is not None else None
        still = f" · still on {loaded}" if loaded and self.state != "failed" else ""
        # The settings dialog comes back with the typed path and the reason in it; a toast where none applied it.
        if not reopen_after_failed_load(self, f"{message}{still}"):
            self.notify(f"{message}{still}", title="The model was not changed", severity="error", timeout=15)
        self.refresh_status()
        if self._queued is not None:  # a message typed meanwhile goes back to the prompt: nothing is lost
            text, waiting = self._queued
            self._queued = None
            waiting.remove()
            self._give_back(text)

    def on_load_progressed(self, message: LoadProgressed) -> None:
        if self.state != "loading":
            return
        share = f" {message.fraction * 100:.0f}%" if message.fraction is not None else ""
        self.state_message = f"{message.stage}{share}"
        self.chat_log.set_banner(Text.assemble(("◌ Loading the model: ", "bold"), self.state_message))
        self.refresh_status()

    def _startup_banner(self) -> Text | None:
        """What stays above the chat after loading: a config problem, and each preset file that was skipped."""
        lines: list[Text] = []
        if self.startup_error:
            lines.append(
                Text.assemble(("✖ The configuration has a problem: ", "bold red"), self.startup_error)
            )
        for problem in self.session.skipped_presets.values():
            lines.append(Text.assemble(("⚠ Preset file skipped: ", "bold yellow"), problem))
        return Text("\n").join(lines) if lines else None

    async def _loaded(self, info: Any, reloaded: bool = False) -> None:
        self.state = "ready"
        self.state_message = ""
        self.chat_log.set_banner(self._startup_banner(), error=self._startup_banner() is not None)
        notes = f" ({'; '.join(info.notes)})" if getattr(info, "notes", ()) else ""
        if reloaded:  # short: the chat is on screen under the toast
            draft = info.draft_model or info.draft_mode
            self.notify(
                f"{info.model} · draft {draft} on {info.backend}·{info.device}{notes}; the chat goes on with it",
                title="Model loaded",
            )
        else:
            reason = (
                f" · {self.session.backend_reason}"
                if self.session.backend_reason not in ("", "given")
                else ""
            )
            self.notify(f"{info.model} on {info.backend}·{info.device}{reason}{notes}", title="Model loaded")
        await self._say_verdict()
        self.refresh_status()
        if self._queued is not None:
            text, message = self._queued
            self._queued = None
            message.set_waiting(False)
            await self._start_reply(text)

    async def _say_verdict(self, changed: bool = False) -> None:
        """Whether drafting pays on this machine, as a line in the chat: at load, and when a reply's
        measurements turn the verdict (the doctor's words: engine.decoding.verdict)."""
        self.session.verdict_changed = False
        line = verdict_line(self.session.verdict, self.session.info, changed)
        if line:
            await self.chat_log.add_notice(line)

    def _load_failed(self, message: str, title: str = "The model did not load") -> None:
        self.state = "failed"
        self.state_message = message
        self.load_error = message
        self.chat_log.set_banner(Text.assemble((f"✖ {title}: ", "bold red"), message), error=True)
        self.push_screen(ErrorScreen(title, message))
        self.refresh_status()
        if self._queued is not None:  # the waiting message goes back to the prompt: nothing typed is lost
            text, waiting = self._queued
            self._queued = None
            waiting.remove()
            self._give_back(text)

    def _give_back(self, text: str) -> None:
        """Put a message that was not answered back in the prompt, before anything typed since."""
        typed = self.prompt.text.strip()
        self.prompt.set_text(text if not typed else f"{text}\n{typed}")
        self.prompt.focus()

    # --- sending ---------------------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _prompt_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if text and self.attach_command(text):
            return
        if self.generating:
            # Said even for an empty prompt: enter seemed to do nothing. What was typed stays in the prompt.
            self.notify(
                f"A reply is being generated: {self._keys('reply.cancel')} stops it.", severity="warning"
            )
            return
        if not text:
            return
        if self.state == "loading":
            if self._queued is not None:
                self.notify("A message is already waiting for the model.", severity="warning")
                return
            self.prompt.clear()
            waiting = UserMessage(text, waiting=True)
            await self.chat_log.mount(waiting)
            self.chat_log.anchor()
            self._queued = (text, waiting)
            return
        if self.state != "ready":
            why = self.load_error or "it is still loading"
            self.notify(f"The model is not ready: {why}", severity="error")
            return
        if self.editing is not None and await self.send_edit(text):
            return
        self.prompt.clear()
        await self.chat_log.mount(UserMessage(text))
        await self._start_reply(text)

    async def _start_reply(self, text: str | None, flow: Any = None, prefix: Any = None) -> None:
        """Mount an empty reply and run the session in a thread. `text` None regenerates the last reply; `flow`
        (a session call taking on_event and cancel: an edit, a continue) runs instead; `prefix` is the text
        (origin runs) a continued reply starts with."""
        reply = ReplyMessage(highlight=self.highlight_drafts)
        await self.chat_log.mount(reply)
        if prefix:
            await reply.append_runs(prefix)
        self.chat_log.anchor()
        backend = self.session.backend
        self._buffer = ReplyBuffer(decode=backend.decode if backend is not None else None)
        self._pace = RenderPace()
        self._reply = reply
        self._cancel = threading.Event()
        self._pending_prompt = text or ""
        # A blinking cursor repaints the prompt twice a second: while a reply streams it stays lit instead.
        self.prompt.cursor_blink = False
        self.generate(text, self._buffer, self._cancel, flow)
        self.refresh_status()

    @work(thread=True, exclusive=True, exit_on_error=False, group="generate")
    def generate(
        self, text: str | None, buffer: ReplyBuffer, cancel: threading.Event, flow: Any = None
    ) -> None:
        def on_event(event: object) -> None:
            if isinstance(event, Chunk):
                if buffer.add(event):
                    self.post_message(ReplyTextArrived(buffer))
            else:
                if isinstance(event, ReplyFinished | ReplyFailed):
                    buffer.finished = True
                self.post_message(ReplyEventArrived(event, buffer))

        if flow is not None:
            result = flow(on_event, cancel)
        elif text is None:
            result = self.session.regenerate(on_event, cancel)
        else:
            result = self.session.send(text, on_event, cancel)
        if not buffer.finished:  # a session that returned without emitting its last event
            on_event(result)

    async def _drain(self, buffer: ReplyBuffer) -> None:
        runs = buffer.take()
        if runs and self._reply is not None and buffer is self._buffer:
            # The next redraw waits longer while the UI thread is over its share of a core (tui/streaming.py).
            buffer.interval_s = self._pace.observe()
            await self._reply.append_runs(runs)

    async def on_reply_text_arrived(self, message: ReplyTextArrived) -> None:
        await self._drain(message.buffer)

    async def on_reply_event_arrived(self, message: ReplyEventArrived) -> None:
        if message.buffer is not self._buffer or self._reply is None:
            return
        event = message.event
        reply = self._reply
        if isinstance(event, ReplyStarted):
            by_server = bool(self.session.info and self.session.info.k_by_server)
            reply.set_header(started_header(event, by_server))
            self.refresh_status()
        elif isinstance(event, ContextTrimmed):
            self._mark_context()
            self.notify(
                f"The {event.dropped_turns} oldest turns no longer fit the context: the model does not see them "
                f"(dimmed, above the rule). Next prompt {event.prompt_tokens}/{event.max_context} tokens.",
                title="Context trimmed",
                severity="warning",
            )
        elif isinstance(event, ReplyFinished):
            await self._drain(message.buffer)
            self.last_reply_last_chunk_t = message.buffer.last_chunk_t
            if event.cancelled and not event.text:
                await self._restore_prompt(reply)
            else:
                await reply.finish(event.text, event.stats, cancelled=event.cancelled)
                await self._drop_replaced()
                self.call_after_refresh(self._mark_rendered)
                self._label_variant(reply)
                self.offer_continue()
            self._end_reply()
            if self.session.verdict_changed:
                await self._say_verdict(changed=True)
        elif isinstance(event, ReplyFailed):
            await self._drain(message.buffer)
            if event.undone:
                await self._restore_prompt(reply)
            else:
                await reply.finish(event.partial_text, None, error=event.message)
                await self._drop_replaced()
            self._end_reply()
            self.notify(event.message, title="Reply failed", severity="error", timeout=10)

    def _mark_rendered(self) -> None:
        self.last_reply_rendered_at = time.perf_counter()

    async def _restore_prompt(self, reply: ReplyMessage) -> None:
        """Nothing came (stopped before the first token): undo on screen what the session undid.

        A new message leaves the log and goes back to the prompt; a regenerate shows the old reply again.
        """
        messages = self.chat_log.messages()
        to_remove: list[Any] = [reply]
        index = messages.index(reply) if reply in messages else -1
        if index > 0 and isinstance(messages[index - 1], UserMessage) and self._pending_prompt:
            to_remove.append(messages[index - 1])
        await self.chat_log.remove_children(to_remove)
        if self._replaced is not None:
            self._replaced.display = True
            self._replaced = None
        self.show_hidden_branch()
        if self._pending_prompt:
            self._give_back(self._pending_prompt)
        self.prompt.focus()

    async def _drop_replaced(self) -> None:
        await self.drop_hidden_branch()
        if self._replaced is not None:
            replaced, self._replaced = self._replaced, None
            await replaced.remove()

    def _end_reply(self) -> None:
        self._reply = None
        self._cancel = None
        self.prompt.cursor_blink = True
        self._mark_context()
        self.refresh_status()

    def _mark_context(self) -> None:
        """Dim the turns the model no longer sees (trimmed to fit the context), under one rule that says so."""
        session = self.session
        self.chat_log.mark_context(sum(1 for t in session.turns[: session.context_start] if t.role == "user"))
        self.label_branches()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Failures nobody caught become a modal with the message; the app stays open."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        message = str(error) if isinstance(error, SpecchatError) else f"{type(error).__name__}: {error}"
        if event.worker.group == "generate" and self._reply is not None:
            reply = self._reply
            self.run_worker(self._drop_replaced(), exclusive=False)
            self._end_reply()
            self.run_worker(reply.finish(reply.text, None, error=message), exclusive=False)
        elif event.worker.group == "load":
            self._load_failed(message)
            return
        elif event.worker.group == "reload":
            self._reload_failed(message)
            return
        self.push_screen(ErrorScreen("Something went wrong", message))

    # --- actions ---------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # App bindings are priority bindings; on a modal they must give way to the modal's own keys. Tab and
        # shift+tab (the screen's bindings to the app's focus actions) still move between a dialog's fields.
        if action in ("focus_next", "focus_previous"):
            return True
        if action != "quit" and isinstance(self.screen, ModalScreen):
            return False
        # The footer shows what a key does now: stop while a reply streams (or a message waits), regenerate
        # once there is a reply and none is streaming.
        if action == "cancel_reply":
            return self.generating or self._queued is not None or self.editing is not None
        if action == "regenerate":
            return not self.generating and any(t.role == "assistant" for t in self.session.turns)
        # On a selected reply its own ^b takes the key, and shows in the footer where it has a code block (this
        # one is a priority binding without a footer entry: it would hide that one).
        return not (action == "copy_code" and isinstance(self.focused, ReplyMessage))

    def action_use_preset(self, name: str) -> None:
        try:
            self.session.set_mode(name)
        except SpecchatError as exc:
            self.notify(str(exc), severity="error")
            return
        # The status bar shows the switch at once; a toast only where it does not take effect at once.
        if self.generating:
            self.notify(f"Preset {name} applies from the next reply.", timeout=2)
        self.refresh_status()

    def action_pick_preset(self) -> None:
        def chosen(name: str | None) -> None:
            if name:
                self.action_use_preset(name)

        self.push_screen(PresetPickerScreen(self.session.presets, self.session.mode), chosen)

    # --- settings for this chat (tui/screens/settings.py) and the remembered theme ------------------------------

    def action_show_settings(self) -> None:
        open_chat_settings(self)

    def _apply_saved_theme(self) -> None:
        theme = self.settings.theme
        if theme:
            if theme in self.available_themes:
                self.theme = theme
            else:
                self.notify(f"config: theme: unknown theme {theme!r}; using {self.theme}", severity="warning")
        self.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, theme: Any) -> None:
        name = getattr(theme, "name", str(theme))
        if name == self.settings.theme:
            return
        try:
            save_setting("theme", name)
        except ConfigError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.settings = self.settings.model_copy(update={"theme": name})

    def action_show_help(self) -> None:
        self.push_screen(HelpScreen(dict(self.keymap)))

    def action_cancel_reply(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.show_stopping()
        elif self.cancel_edit():
            pass
        elif self._queued is not None:  # a message waiting for the model: back to the prompt
            text, waiting = self._queued
            self._queued = None
            waiting.remove()
            self._give_back(text)

    async def action_regenerate(self) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
            return
        if self.state != "ready":
            return
        if not self.session.turns:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        messages = self.chat_log.messages()
        if messages and isinstance(messages[-1], ReplyMessage):
            # Hidden, not removed: if the new reply is stopped before its first token, this one comes back.
            self._replaced = messages[-1]
            self._replaced.display = False
        await self._start_reply(None)

    def action_copy_reply(self) -> None:
        self._copy(self.chat_log.selected_reply(self.focused), code_only=False)

    def action_copy_code(self) -> None:
        self._copy(self.chat_log.selected_reply(self.focused), code_only=True)

    @on(ReplyMessage.CopyRequested)
    def _copy_requested(self, event: ReplyMessage.CopyRequested) -> None:
        self._copy(event.reply, event.code_only)

    def _copy(self, reply: ReplyMessage | None, code_only: bool) -> None:
        if reply is None or not reply.text:
            self.notify("No reply to copy yet.", severity="warning")
            return
        text = reply.answer_text  # a thinking reply's reasoning stays out of the clipboard
        if not code_only:
            self.notify(copy_text(self, text, f"the reply ({len(text)} characters)"), timeout=4)
            return
        blocks = code_blocks(text)
        if not blocks:
            self.notify("That reply has no code block.", severity="warning")
            return
        # One block per press, in reading order: the function first, then its usage example, and round again.
        index = reply.next_code_block % len(blocks)
        reply.next_code_block = index + 1
        code = blocks[index]
        what = f"the code block ({len(code.splitlines())} lines)"
        if len(blocks) > 1:
            what = f"code block {index + 1} of {len(blocks)} ({len(code.splitlines())} lines; ctrl+b again: the next)"
        self.notify(copy_text(self, code, what), timeout=4)

    def action_inspect_reply(self) -> None:
        self._inspect(self.chat_log.selected_reply(self.focused))

    @on(ReplyMessage.InspectRequested)
    def _inspect_requested(self, event: ReplyMessage.InspectRequested) -> None:
        self._inspect(event.reply)

    def _inspect(self, reply: ReplyMessage | None) -> None:
        streaming = self._reply
        if streaming is not None and reply in (None, streaming) and getattr(reply, "stats", None) is None:
            # Asked before the reply's last token (a short reply looks done early): open now, fill in at the end.
            self.push_screen(
                InspectorScreen(
                    pending=streaming,
                    recent_for=self.session.recent_average,
                    context=context_line(self.session),
                    backend_notes=self.session.info.notes if self.session.info is not None else (),
                )
            )
            return
        if reply is None or reply.stats is None:
            self.notify("No finished reply to inspect yet.", severity="warning")
            return
        stats = reply.stats
        recent = self.session.recent_average(stats.preset, model=stats.model, backend=stats.backend)
        replies = self.chat_log.replies()
        self.push_screen(
            InspectorScreen(
                reply.stats,
                reply.cancelled,
                recent,
                context=context_line(self.session),
                backend_notes=self.session.info.notes if self.session.info is not None else (),
                # The newest reply is in the metrics log's recent average; an older one may have left it.
                includes_this=bool(replies) and reply is replies[-1],
            )
        )

    def action_select_reply(self, step: int) -> None:
        self.chat_log.select_reply(step, self.focused)

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    @on(ReplyMessage.TypedAhead)
    def _typed_ahead(self, event: ReplyMessage.TypedAhead) -> None:
        """A key typed on a selected reply: into the prompt, which takes over from there."""
        prompt = self.prompt
        prompt.focus()
        prompt.insert(event.character)

    def action_scroll_chat(self, step: int) -> None:
        """Page the conversation from wherever focus is (the prompt pages its own lines otherwise)."""
        if step < 0:
            self.chat_log.scroll_page_up(animate=False)
        else:
            self.chat_log.scroll_page_down(animate=False)

    def action_toggle_highlight(self) -> None:
        self.highlight_drafts = not self.highlight_drafts
        self.chat_log.set_highlight(self.highlight_drafts)
        if self.highlight_drafts:
            self.notify("Draft colours on: green text was proposed by the draft and accepted.", timeout=3)
        else:
            self.notify("Draft colours off.", timeout=2)

    async def action_new_chat(self) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
            return
        self.session.new_chat()
        await self.chat_log.clear_messages()
        self.prompt.focus()
        self.refresh_status()

    # --- history (tui/screens/history.py) ---------------------------------------------------------------------

    async def show_chat(self, chat_id: int) -> None:
        """Put a stored chat on screen, stats lines included; the conversation continues from it."""
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
            return
        try:
            turns = self.session.open_chat(chat_id)
        except SpecchatError as exc:
            self.notify(str(exc), severity="error")
            return
        await self.chat_log.show_turns(turns, self.highlight_drafts)
        self._mark_context()
        self.prompt.focus()
        self.refresh_status()

    def _label_variant(self, reply: ReplyMessage) -> None:
        """A regenerated reply says which variant it is, and how to page."""
        position, count = self.session.variants()
        if count > 1:
            older, newer = (
                key_for("reply.older_variant", self.keymap),
                key_for("reply.newer_variant", self.keymap),
            )
            reply.set_header(variant_header(reply.header, position, count, older, newer))

    def action_show_trend(self) -> None:
        from tui.screens.trend import TrendScreen

        self.push_screen(TrendScreen(self.session.metrics_rows(), list(self.session.regressions)))

    @on(StatusBar.TrendRequested)
    def _trend_requested(self) -> None:
        self.action_show_trend()

    def action_show_history(self) -> None:
        from tui.screens.history import HistoryScreen

        def chosen(chat_id: int | None) -> None:
            if chat_id is not None:
                self.run_worker(self.show_chat(chat_id), group="history", exclusive=True)

        self.push_screen(HistoryScreen(self.session), chosen)


def run_app(
    settings: Settings,
    startup_error: str | None = None,
    session: ChatSession | None = None,
    open_chat: int | None = None,
) -> None:
    """Entry point used by `specchat` (tui.cli): open the chat on the configured (or embedded) model.

    With `startup_error` (a broken config file, say) the app opens on default settings and shows the message.
    `open_chat` continues a stored chat (`--resume`, `--chat ID`).
    """
    SpecchatApp(settings, session=session, startup_error=startup_error, open_chat=open_chat).run()
