"""The chat's flows beyond send and regenerate, mixed into the chat screen (`tui.screens.chat.ChatScreen`):
continuing a reply cut at its token limit, finding text in the conversation, attaching text files, copying and
inspecting a reply, and what the chat says about itself (open in another window). Editing and paging branches are
the screen's `BranchEditor` part (`tui.chat_parts.branches`), a reply's life its `ReplyLifecycle`
(`tui.chat_parts.reply`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work

from engine.errors import UserError
from engine.session.attachments import AttachmentError, attachment_block, expand_attach, parse_attach
from tui.chat_settings import ChatSettings, draft_suggestions, model_suggestions
from tui.clipboard import copy_text
from tui.keymap import key_display, key_for
from tui.screens.inspector import InspectorScreen, context_line
from tui.screens.settings import SettingsScreen
from tui.widgets.message import ReplyMessage, UserMessage, code_blocks

if TYPE_CHECKING:
    from textual.app import App
    from textual.widget import Widget

    from engine.session import ChatSession
    from tui.chat_host import ChatHost
    from tui.chat_parts.branches import BranchEditor
    from tui.chat_parts.reply import ReplyLifecycle
    from tui.widgets.chat_log import ChatLog
    from tui.widgets.prompt import PromptInput

PRESENCE_CHECK_S = 2.0  # how often the chat looks for another window on it (a glob and a lock try)


class ChatFlows:
    # Provided by ChatScreen (and Screen).
    host: ChatHost
    session: ChatSession
    keymap: dict[str, str]
    highlight_drafts: bool
    state: str
    focused: Widget | None
    chat_log: ChatLog
    prompt: PromptInput
    generating: bool
    branches: BranchEditor
    lifecycle: ReplyLifecycle

    _find_query = ""
    _presence_checked_at = 0.0
    _told_elsewhere: int | None = None  # the chat whose other window was already mentioned
    # What the settings dialog applied while its model or draft loads: the dialog comes back with it on failure.
    _settings_typed: dict[str, Any] | None = None

    if TYPE_CHECKING:  # Screen's and ChatScreen's own (never defined here: they would shadow them)
        app: App[None]

        def notify(self, message: str, **kwargs: Any) -> None: ...

        def refresh_status(self) -> None: ...

        def call_after_refresh(self, callback: Any, *args: Any) -> bool: ...

        async def say_verdict(self, changed: bool = False) -> None: ...

        def mark_context(self) -> None: ...

    def _keys(self, binding_id: str) -> str:
        return key_display(key_for(binding_id, self.keymap))

    # --- editing and paging: the BranchEditor part does the work ----------------------------------------------

    def label_branches(self) -> None:
        """Every message with alternatives says which one it is and how to page them."""
        keys = (key_for("reply.older_variant", self.keymap), key_for("reply.newer_variant", self.keymap))
        self.branches.label(*keys)

    async def action_edit_last(self) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
        elif self.state != "ready":
            self.notify("The model is not ready yet: edit once it has loaded.", severity="warning")
        else:
            self.branches.start(self.focused)

    async def action_page_variant(self, step: int) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
            return
        if await self.branches.page(step, self.focused, self.highlight_drafts, self.mark_context):
            self.refresh_status()

    # --- continuing a reply cut at its token limit ---------------------------------------------------------

    async def action_continue_reply(self) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press esc.", severity="warning")
            return
        if self.state != "ready":
            return
        if not self.session.can_continue():
            self.notify(
                "Nothing to continue: the last reply was not cut at its token limit.",
                severity="warning",
                timeout=4,
            )
            return
        replies = self.chat_log.replies()
        last = replies[-1] if replies else None
        if last is not None:
            self.lifecycle.replace(last)  # hidden while it goes on in a new widget; back if nothing new comes
            prefix = list(last.runs) or [(last.text, False)]
        else:
            turn = self.session.turns[-1]
            prefix = list(turn.runs or ((turn.content, False),))
        await self.lifecycle.start(None, flow=self.session.continue_reply, prefix=prefix)

    def offer_continue(self) -> None:
        """A reply that ran into its token limit says how to go on."""
        if self.session.can_continue():
            self.notify(
                f"The reply reached its token limit: {self._keys('reply.continue')} continues it.", timeout=6
            )

    # --- find in the conversation --------------------------------------------------------------------------

    def matches(self, query: str) -> list[UserMessage | ReplyMessage]:
        needle = query.casefold().strip()
        return (
            [m for m in self.branches.on_screen() if needle and needle in m.text.casefold()] if needle else []
        )

    def action_find(self) -> None:
        from tui.screens.find import FindScreen

        def chosen(query: str | None) -> None:
            if query:
                self.jump_to_match(query)

        self.app.push_screen(FindScreen(self._find_query, lambda q: len(self.matches(q))), chosen)

    def jump_to_match(self, query: str) -> None:
        """Select the newest message holding `query`; the same query again goes one match further back."""
        found = self.matches(query)
        if not found:
            self.notify(f"No message contains {query.strip()!r}.", severity="warning", timeout=3)
            return
        focused = self.focused
        if query == self._find_query and focused in found:
            target = found[found.index(focused) - 1]  # one back; from the oldest round to the newest
        else:
            target = found[-1]
        self._find_query = query
        target.focus()
        target.scroll_visible(animate=False)
        number = found.index(target) + 1
        self.notify(
            f"Match {number} of {len(found)} for {query.strip()!r} · {self._keys('chat.find')}, enter: the next",
            timeout=4,
        )

    # --- attaching text files -------------------------------------------------------------------------------

    def attach_command(self, text: str) -> bool:
        """A prompt whose first line is `/attach PATH ...`: the files go into the prompt (True), nothing is sent."""
        if parse_attach(text) is None:
            return False
        try:
            expanded = expand_attach(text)
        except AttachmentError as exc:
            self.notify(str(exc), title="Not attached", severity="error", timeout=10)
            return True  # the prompt keeps what was typed
        self.prompt.set_text(expanded)
        self.prompt.focus()
        count = len(parse_attach(text) or ())
        self.notify(
            f"Attached {count} file{'s' if count != 1 else ''}: write your question, enter sends.", timeout=4
        )
        return True

    def action_attach_file(self) -> None:
        from tui.screens.path_picker import PathPickerScreen

        def picked(path: str | None) -> None:
            if not path:
                return
            try:
                block = attachment_block(path)
            except AttachmentError as exc:
                self.notify(str(exc), title="Not attached", severity="error", timeout=10)
                return
            prompt = self.prompt
            before = prompt.text
            prompt.set_text(block + "\n\n" + before.lstrip("\n") if before.strip() else block + "\n\n")
            prompt.focus()
            self.notify(f"Attached {Path(path).name}: write your question, enter sends.", timeout=4)

        self.app.push_screen(PathPickerScreen("Attach a text file", Path.cwd()), picked)

    # --- settings for this chat (F12): the dialog returns its values, applied here -----------------------

    @work(exclusive=True, exit_on_error=False, group="settings")
    async def action_show_settings(self, typed: dict[str, Any] | None = None, error: str = "") -> None:
        """The settings dialog for this chat; `typed` and `error`: opened again with what was typed, and why that
        model or draft did not load."""
        form = ChatSettings.of(self.session, typed)
        dialog = SettingsScreen(
            form.system_prompt,
            form.values,
            lambda result: form.check(result, self._busy()),
            form.title,
            model=form.shown_model,
            draft=form.shown_draft,
            check_model=form.check_model,
            check_draft=form.check_draft,
            error=error,
            model_names=model_suggestions(),
            draft_names=draft_suggestions(),
            history_drafting=form.history_drafting,
        )
        result = await self.app.push_screen_wait(dialog)
        if result is None:
            return
        form.apply(result)
        # History drafting turned on or off: the free drafts the verdict counts changed, and the chat says so.
        if self.session.verdict_changed:
            await self.say_verdict(changed=True)
        if self.generating:
            self.notify("The settings apply from the next reply.", timeout=2)
        if form.model_changed(result):
            # Kept until the load ends: where it fails, the dialog comes back with what was typed.
            self._settings_typed = result
            self.host.start_reload(result["model"] or None, result["draft"])
        self.refresh_status()

    def _busy(self) -> str | None:
        """Why the model cannot change now, or None."""
        if self.generating:
            return "a reply is streaming (esc stops it)"
        return "a model is loading" if self.state == "loading" else None

    # --- what the chat says about itself --------------------------------------------------------------------

    def check_open_elsewhere(self) -> None:
        """Say once per chat that another specchat window has it open (each window's messages become branches)."""
        now = time.monotonic()
        if now - self._presence_checked_at < PRESENCE_CHECK_S:
            return
        self._presence_checked_at = now
        chat_id = self.session.chat_id
        if chat_id is None or chat_id == self._told_elsewhere:
            return
        try:
            others = self.session.history.open_elsewhere()
        except (OSError, UserError):
            return
        if others:
            self._told_elsewhere = chat_id
            window = "another specchat window" if others == 1 else f"{others} other specchat windows"
            self.notify(
                f"This chat is open in {window} too: what each sends becomes its own branch "
                f"(select a message, {self._keys('reply.older_variant')} / {self._keys('reply.newer_variant')} "
                "pages them).",
                title="Open elsewhere",
                severity="warning",
                timeout=20,
            )

    # --- copying and inspecting a reply ---------------------------------------------------------------------

    def action_copy_reply(self) -> None:
        self._copy(self.chat_log.selected_reply(self.focused), code_only=False)

    def action_copy_code(self) -> None:
        self._copy(self.chat_log.selected_reply(self.focused), code_only=True)

    def on_reply_message_copy_requested(self, event: ReplyMessage.CopyRequested) -> None:
        self._copy(event.reply, event.code_only)

    def _copy(self, reply: ReplyMessage | None, code_only: bool) -> None:
        if reply is None or not reply.text:
            self.notify("No reply to copy yet.", severity="warning")
            return
        text = reply.answer_text  # a thinking reply's reasoning stays out of the clipboard
        if not code_only:
            self.notify(copy_text(self.app, text, f"the reply ({len(text)} characters)"), timeout=4)
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
        self.notify(copy_text(self.app, code, what), timeout=4)

    def action_inspect_reply(self) -> None:
        self._inspect(self.chat_log.selected_reply(self.focused))

    def on_reply_message_inspect_requested(self, event: ReplyMessage.InspectRequested) -> None:
        self._inspect(event.reply)

    def _inspect(self, reply: ReplyMessage | None) -> None:
        session = self.session
        notes = session.info.notes if session.info is not None else ()
        streaming = self.lifecycle.streaming
        if streaming is not None and reply in (None, streaming) and getattr(reply, "stats", None) is None:
            # Asked before the reply's last token (a short reply looks done early): open now, fill in at the end.
            self.app.push_screen(
                InspectorScreen(
                    pending=streaming,
                    recent_for=session.history.recent_average,
                    context=context_line(session),
                    backend_notes=notes,
                )
            )
            return
        if reply is None or reply.stats is None:
            self.notify("No finished reply to inspect yet.", severity="warning")
            return
        stats = reply.stats
        recent = session.history.recent_average(stats.preset, model=stats.model, backend=stats.backend)
        replies = self.chat_log.replies()
        self.app.push_screen(
            InspectorScreen(
                reply.stats,
                reply.cancelled,
                recent,
                context=context_line(session),
                backend_notes=notes,
                # The newest reply is in the metrics log's recent average; an older one may have left it.
                includes_this=bool(replies) and reply is replies[-1],
            )
        )
