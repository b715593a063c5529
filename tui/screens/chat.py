"""The chat screen: the conversation, the prompt, the live status bar and the keys that send, stop and regenerate;
its parts in `tui.chat_parts`, one per concern (reply: the reply lifecycle; branches: edit, page; continuing,
find, attach, copying, inspecting, settings_flow: F12; presence: another window on this chat). The screen's
actions check the state and call the part that does the work.

Threads: every reply runs in a thread worker of this screen (group "generate", `tui.chat_parts.reply`). The
generation thread only fills a `ReplyBuffer` and posts `ReplyTextArrived` at most every 0.2 s (longer while the UI
thread is over its budget: `tui.streaming.RenderPace`), plus one message per session event (`ReplyStarted`,
`ContextTrimmed`, `ReplyFinished`, `ReplyFailed`). The status bar reads the session's plain attributes on a 0.25 s
timer. The model itself is loaded by the app (`tui.app`), which tells this screen how that went with the messages
of `tui.chat_host`; the screen sees the app only as that module's `ChatHost` (a worker that fails here is handed to
its one failure handler).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.screen import Screen
from textual.worker import Worker

from engine.errors import UserError
from tui import chat_host
from tui.chat_parts.attach import Attacher
from tui.chat_parts.branches import BranchEditor
from tui.chat_parts.continuing import ReplyContinuer
from tui.chat_parts.copying import ReplyCopier
from tui.chat_parts.find import ConversationFinder
from tui.chat_parts.inspecting import ReplyInspector
from tui.chat_parts.presence import PresenceCheck
from tui.chat_parts.reply import ReplyLifecycle
from tui.chat_parts.settings_flow import SettingsFlow
from tui.formatting import verdict_line
from tui.keymap import CHAT_KEYS, bindings, key_display, key_for
from tui.messages import ReplyEventArrived, ReplyTextArrived
from tui.prompt_draft import load_draft, save_draft
from tui.reply_header import variant_header
from tui.screens.error import describe_error
from tui.screens.help import HelpScreen
from tui.screens.presets import PresetPickerScreen
from tui.widgets.chat_log import ChatLog
from tui.widgets.footer import FittingFooter
from tui.widgets.message import ReplyMessage
from tui.widgets.prompt import PromptInput
from tui.widgets.status_bar import StatusBar, collect_status

if TYPE_CHECKING:
    from engine.session import ChatSession

# The status bar's figures (tok/s, acceptance, sparkline) at 4 Hz: each repaint is a compositor pass on the UI
# thread, and the eye does not read a figure that changes faster. Measured at 160x48 while a reply streamed: the
# bar was the most repainted widget (85 of 180 repaints in 11 s at 10 Hz).
STATUS_INTERVAL_S = 0.25


class ChatScreen(Screen[None]):
    BINDINGS = bindings(CHAT_KEYS)

    def __init__(self, host: chat_host.ChatHost) -> None:
        super().__init__(id="chat")
        self.host = host
        self.highlight_drafts = False
        self._footer_state: tuple[bool, bool, bool] | None = None
        self._load_notes: set[str] = set()  # the last load's notes, as the reload toast compares them
        # The screen's parts, made once (a query from the app would search the dialog on top instead).
        self.chat_log = ChatLog(id="chat-log")
        self.prompt = PromptInput(id="prompt")
        self.status_bar = StatusBar(id="status-bar")
        # Editing a message into a new branch, and paging branches and variants (tui/chat_parts/branches.py).
        log, prompt = self.chat_log, self.prompt
        self.branches = BranchEditor(lambda: self.session, log, prompt, self.shown_key, self.notify)
        # Sending, streaming, stopping and ending a reply, and the message waiting for the model (chat_parts/reply.py).
        self.lifecycle = ReplyLifecycle(self)
        # The flows around the conversation, one part each (tui/chat_parts/).
        self.continuer = ReplyContinuer(self)
        self.finder = ConversationFinder(self)
        self.attacher = Attacher(self)
        self.copier = ReplyCopier(self)
        self.inspector = ReplyInspector(self)
        self.settings_flow = SettingsFlow(self)
        self.presence = PresenceCheck(self)

    # What the app holds for every screen: the session, the model's state (loading / failed / ready), the keys.
    @property
    def session(self) -> ChatSession:
        return self.host.session

    @property
    def state(self) -> str:
        return self.host.model_status.state

    @property
    def keymap(self) -> dict[str, str]:
        return self.host.keymap

    def shown_key(self, binding_id: str) -> str:
        """The key in force for `binding_id`, as the user reads it (toasts and headers say it)."""
        return key_display(key_for(binding_id, self.keymap))

    # --- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        help_key = key_for("help.show", self.keymap)
        self.prompt.placeholder = f"Ask anything · enter sends · ctrl+j new line · {help_key} help"
        yield self.chat_log
        yield self.prompt
        yield self.status_bar
        yield FittingFooter()

    def on_mount(self) -> None:
        draft = load_draft(self.host.settings)
        if draft is not None:
            self.prompt.insert(draft, (0, 0))
            self.notify("The message you had not sent is back in the prompt.", title="Draft kept", timeout=6)
        self.prompt.focus()
        self.set_interval(STATUS_INTERVAL_S, self._tick)
        # A dialog shows the chat dimmed behind it: the chat's scrollbar beside the dialog's read as a second one.
        self.watch(self, "stack_updates", self._chat_covered, init=False)
        self.refresh_status()

    def _chat_covered(self) -> None:
        self.chat_log.set_class(self.app.screen is not self, "covered")

    def on_unmount(self) -> None:
        # Quitting mid-reply: stop the generation thread, or the process would wait for the whole reply.
        # Quitting (ctrl+q) keeps what was typed and not sent, and a message still waiting for the model.
        waiting = self.lifecycle.close()
        text = "\n".join(t for t in (waiting, self.prompt.text) if t.strip())
        save_draft(self.host.settings, text, self.session.chat_id)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # The message does not bubble: this screen's workers (a reply, a dialog) go to the app's one handler too.
        self.host.on_worker_state_changed(event)

    @property
    def generating(self) -> bool:
        return self.lifecycle.generating

    @property
    def editing(self) -> int | None:  # the user turn being edited into a new branch
        return self.branches.editing

    # --- periodic: status bar + draining a quiet buffer ------------------------------------------------------

    async def _tick(self) -> None:
        await self.lifecycle.drain_overdue()
        for notice in self.session.take_notices():  # storage trouble (damaged db, full disk): told once
            self.notify(notice, title="History", severity="warning", timeout=12)
        self.presence.check()
        if self.lifecycle.status_due():
            self.lifecycle.show_pending_start()
            self.refresh_status()

    async def keys_settled(self) -> None:
        """Wait until the footer's keys are in place after a change (`FittingFooter.settled`)."""
        await self.query_one(FittingFooter).settled()

    def refresh_status(self) -> None:
        if not self.is_mounted or not self.app.is_running:
            return
        state = {"loading": "loading", "failed": "failed"}.get(self.state, "ready")
        self.status_bar.show(collect_status(self.session, state, self.host.model_status.message))
        # What check_action answers for the footer's keys: refresh them only when it changes.
        footer_state = (
            self.generating,
            self.lifecycle.queued is not None,
            self.editing is not None,
            any(t.role == "assistant" for t in self.session.turns),
        )
        if footer_state != self._footer_state:
            self._footer_state = footer_state
            self.refresh_bindings()

    # --- the model, as the app loads it (tui/chat_host.py's messages) ------------------------------------------

    def on_model_load_started(self, message: chat_host.ModelLoadStarted) -> None:
        self.chat_log.show_loading(message.model, message.draft)
        self.refresh_status()

    def on_load_stage_reached(self, message: chat_host.LoadStageReached) -> None:
        self.chat_log.show_load_progress(message.stage)
        self.refresh_status()

    def on_model_load_deferred(self, _: chat_host.ModelLoadDeferred) -> None:
        self.show_startup_banner()

    async def on_model_loaded(self, message: chat_host.ModelLoaded) -> None:
        await self.model_loaded(message.info, message.reloaded)

    def on_model_load_failed(self, message: chat_host.ModelLoadFailed) -> None:
        self.model_failed(message.title, message.message)

    def on_model_reload_failed(self, message: chat_host.ModelReloadFailed) -> None:
        self.reload_failed(message.message)

    def on_reply_crashed(self, message: chat_host.ReplyCrashed) -> None:
        self.lifecycle.crashed(message.message)

    async def on_stored_chat_chosen(self, message: chat_host.StoredChatChosen) -> None:
        await self.show_chat(message.chat_id)

    def show_startup_banner(self) -> None:
        """What stays above the chat after loading: a config problem, and each preset file that was skipped."""
        startup_error = self.host.model_status.startup_error
        self.chat_log.show_problems(startup_error, self.session.preset_choice.skipped.values())

    async def model_loaded(self, info: Any, reloaded: bool = False) -> None:
        self.show_startup_banner()
        notes = list(getattr(info, "notes", ()) or ())
        before, self._load_notes = self._load_notes, {_gist(note) for note in notes}
        # A reload's toast is short (the chat is on screen under it): notes the last load gave are not repeated.
        if reloaded:
            draft = info.draft_model or info.draft_mode
            new = _in_brackets([note for note in notes if _gist(note) not in before])
            self.notify(
                f"{info.model} · draft {draft} on {info.backend}·{info.device}{new}; the chat goes on with it",
                title="Model loaded",
            )
        else:
            reason = (
                f" · {self.session.backend_reason}"
                if self.session.backend_reason not in ("", "given")
                else ""
            )
            self.notify(
                f"{info.model} on {info.backend}·{info.device}{reason}{_in_brackets(notes)}",
                title="Model loaded",
            )
        await self.say_verdict()
        self.refresh_status()
        await self.lifecycle.send_queued()

    async def say_verdict(self, changed: bool = False) -> None:
        """Whether drafting pays on this machine, as a line in the chat: at load, and when a reply's
        measurements turn the verdict (the doctor's words: engine.decoding.verdict)."""
        self.session.verdict_changed = False
        line = verdict_line(self.session.verdict, self.session.info, changed)
        if line:
            await self.chat_log.add_notice(line)

    def model_failed(self, title: str, message: str) -> None:
        """The model did not load: the banner says why, and a waiting message goes back to the prompt."""
        self.chat_log.show_load_failure(message, title)
        self.refresh_status()
        self.lifecycle.unqueue()

    def reload_failed(self, message: str) -> None:
        """Another model for this chat did not load: the old one (if any) stays, and so does everything typed."""
        if self.state == "failed":
            self.chat_log.show_load_failure(message)
        else:
            self.show_startup_banner()
        loaded = self.session.info.model if self.session.info is not None else None
        still = f" · still on {loaded}" if loaded and self.state != "failed" else ""
        # The settings dialog comes back with the typed path and the reason in it; a toast where no dialog applied it.
        if not self.settings_flow.reopen(f"not loaded: {message}{still}"):
            self.notify(f"{message}{still}", title="The model was not changed", severity="error", timeout=15)
        self.refresh_status()
        self.lifecycle.unqueue()

    # --- sending ---------------------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _prompt_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if text and self.attacher.command(text):
            return
        if self.generating:
            # Said even for an empty prompt: enter seemed to do nothing. What was typed stays in the prompt.
            self.notify(
                f"A reply is being generated: {self.shown_key('reply.cancel')} stops it.", severity="warning"
            )
            return
        if not text:
            return
        if self.state == "loading":
            await self.lifecycle.queue(text)
            return
        if self.state != "ready":
            why = self.host.model_status.load_error or "it is still loading"
            self.notify(f"The model is not ready: {why}", severity="error")
            return
        flow = await self.branches.send(text) if self.editing is not None else None
        await self.lifecycle.send(text, flow)

    # The generation thread's messages (tui/messages.py): the reply lifecycle takes them.
    async def on_reply_text_arrived(self, message: ReplyTextArrived) -> None:
        await self.lifecycle.drain(message.buffer)

    async def on_reply_event_arrived(self, message: ReplyEventArrived) -> None:
        await self.lifecycle.event_arrived(message.event, message.buffer)

    # --- around a reply (what tui/chat_parts/reply.py asks of the screen) ------------------------------------

    def mark_context(self) -> None:
        """Dim the turns the model no longer sees (trimmed to fit the context), under one rule that says so."""
        session = self.session
        self.chat_log.mark_context(sum(1 for t in session.turns[: session.context_start] if t.role == "user"))
        self.label_branches()

    def reply_shown(self, reply: ReplyMessage) -> None:
        """A reply that ended with text: a regenerated one says which variant it is and how to page, one cut at
        its token limit how to go on."""
        position, count = self.session.variants()
        if count > 1:
            older, newer = (
                key_for("reply.older_variant", self.keymap),
                key_for("reply.newer_variant", self.keymap),
            )
            reply.set_header(variant_header(reply.header, position, count, older, newer))
        self.continuer.offer()

    def label_branches(self) -> None:
        """Every message with alternatives says which one it is and how to page them."""
        keys = (key_for("reply.older_variant", self.keymap), key_for("reply.newer_variant", self.keymap))
        self.branches.label(*keys)

    # --- actions ---------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The footer shows what a key does now: stop while a reply streams (or a message waits), regenerate
        # once there is a reply and none is streaming.
        if action == "cancel_reply":
            return self.generating or self.lifecycle.queued is not None or self.editing is not None
        if action == "regenerate":
            return not self.generating and any(t.role == "assistant" for t in self.session.turns)
        # On a selected reply its own ^b takes the key, and shows in the footer where it has a code block (this
        # one is a priority binding without a footer entry: it would hide that one).
        return not (action == "copy_code" and isinstance(self.focused, ReplyMessage))

    def action_use_preset(self, name: str) -> None:
        try:
            self.session.set_mode(name)
        except UserError as exc:
            title, message = describe_error(exc)
            self.notify(message, title=title or "", severity="error")
            return
        # The status bar shows the switch at once; a toast only where it does not take effect at once.
        if self.generating:
            self.notify(f"Preset {name} applies from the next reply.", timeout=2)
        self.refresh_status()

    def action_pick_preset(self) -> None:
        def chosen(name: str | None) -> None:
            if name:
                self.action_use_preset(name)

        self.app.push_screen(PresetPickerScreen(self.session.presets, self.session.mode), chosen)

    def action_show_help(self) -> None:
        self.app.push_screen(HelpScreen(dict(self.keymap)))

    def action_cancel_reply(self) -> None:
        if self.lifecycle.stop():
            return
        if self.branches.cancel():
            self.label_branches()
        else:  # a message waiting for the model (if any): back to the prompt
            self.lifecycle.unqueue()

    def _told_to_wait(self) -> bool:
        """A reply is streaming: say so (the action waits for it) and return True."""
        if self.generating:
            self.notify(
                f"Wait for the reply to finish, or press {self.shown_key('reply.cancel')}.",
                severity="warning",
            )
        return self.generating

    async def action_regenerate(self) -> None:
        if self._told_to_wait():
            return
        if self.state != "ready":
            return
        if not self.session.turns:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        await self.lifecycle.regenerate()

    async def action_edit_last(self) -> None:
        if self._told_to_wait():
            return
        if self.state != "ready":
            self.notify("The model is not ready yet: edit once it has loaded.", severity="warning")
        else:
            self.branches.start(self.focused)

    async def action_page_variant(self, step: int) -> None:
        if self._told_to_wait():
            return
        if await self.branches.page(step, self.focused, self.highlight_drafts, self.mark_context):
            self.refresh_status()

    async def action_continue_reply(self) -> None:
        if not self._told_to_wait() and self.state == "ready":
            await self.continuer.start()

    def action_find(self) -> None:
        self.finder.ask()

    def action_attach_file(self) -> None:
        self.attacher.pick()

    def action_show_settings(self) -> None:
        self.settings_flow.open()

    # Copying and inspecting the selected reply (the keys), or the one whose own key or click asked.
    def action_copy_reply(self) -> None:
        self.copier.copy(self.chat_log.selected_reply(self.focused), code_only=False)

    def action_copy_code(self) -> None:
        self.copier.copy(self.chat_log.selected_reply(self.focused), code_only=True)

    def on_reply_message_copy_requested(self, event: ReplyMessage.CopyRequested) -> None:
        self.copier.copy(event.reply, event.code_only)

    def action_inspect_reply(self) -> None:
        self.inspector.inspect(self.chat_log.selected_reply(self.focused))

    def on_reply_message_inspect_requested(self, event: ReplyMessage.InspectRequested) -> None:
        self.inspector.inspect(event.reply)

    def action_select_reply(self, step: int) -> None:
        self.chat_log.select_reply(step, self.focused)

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    # The prompt as a whole, wherever focus is (the key table's prompt.* keys): the prompt's own actions.
    def action_edit_in_editor(self) -> None:
        self.prompt.action_edit_in_editor()

    def action_clear_prompt(self) -> None:
        self.prompt.action_clear_prompt()

    def action_select_everything(self) -> None:
        self.prompt.action_select_everything()

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
        if self._told_to_wait():
            return
        self.session.new_chat()
        await self.chat_log.clear_messages()
        self.prompt.focus()
        self.refresh_status()

    # --- history (tui/screens/history.py) and the metrics trend ------------------------------------------------

    async def show_chat(self, chat_id: int) -> None:
        """Put a stored chat on screen, stats lines included; the conversation continues from it."""
        if self._told_to_wait():
            return
        try:
            turns = self.session.open_chat(chat_id)
        except UserError as exc:
            title, message = describe_error(exc)
            self.notify(message, title=title or "", severity="error")
            return
        await self.chat_log.show_turns(turns, self.highlight_drafts)
        self.mark_context()
        self.prompt.focus()
        self.refresh_status()

    def action_show_history(self) -> None:
        from tui.screens.history import HistoryScreen

        def chosen(chat_id: int | None) -> None:
            if chat_id is not None:
                self.run_worker(self.show_chat(chat_id), group="history", exclusive=True)

        self.app.push_screen(HistoryScreen(self.session), chosen)

    def action_show_trend(self) -> None:
        from tui.screens.trend import TrendScreen

        self.app.push_screen(TrendScreen(self.session.metrics_rows(), list(self.session.regressions)))

    @on(StatusBar.TrendRequested)
    def _trend_requested(self) -> None:
        self.action_show_trend()


def _in_brackets(notes: list[str]) -> str:
    return f" ({'; '.join(notes)})" if notes else ""


def _gist(note: str) -> str:
    """A load note without its measured figures in brackets ("2 threads: measured at load per token (1 thread
    27.6 ms, 2 threads 18.4 ms), the fastest"): the same note at the next load reads the same."""
    return re.sub(r"\([^()]*\)", "", note).strip()
