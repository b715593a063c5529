"""The command palette's provider (ctrl+p): every app action as "area: action", e.g. "preset: use creative".

The presets offered are the session's own (user presets too); each command calls the app's action, so a palette
command and its key do the same thing.
"""

from __future__ import annotations

from typing import Any

from textual.command import DiscoveryHit, Hit, Hits, Provider


class SpecchatCommands(Provider):
    """'preset: use creative', 'reply: regenerate', ... in the command palette (ctrl+p)."""

    def _commands(self) -> list[tuple[str, Any, str]]:
        app: Any = self.app.chat  # type: ignore[attr-defined]  # the chat screen (tui/screens/chat.py): its actions
        commands: list[tuple[str, Any, str]] = [
            (
                "preset: use auto",
                lambda: app.action_use_preset("auto"),
                "the router picks a preset per message",
            )
        ]
        for name, preset in app.session.presets.items():
            commands.append(
                (f"preset: use {name}", lambda n=name: app.action_use_preset(n), preset.description or name)
            )
        commands += [
            ("preset: pick…", app.action_pick_preset, "choose from every preset"),
            (
                "reply: regenerate",
                app.action_regenerate,
                "generate the last reply again (the old one is kept as a variant)",
            ),
            (
                "reply: edit message",
                app.action_edit_last,
                "edit the selected (or last) message and resend it as a new branch; esc cancels",
            ),
            (
                "reply: continue",
                app.action_continue_reply,
                "extend the last reply where its token limit cut it",
            ),
            ("chat: find", app.action_find, "find text in the conversation and jump to it"),
            ("prompt: attach file", app.action_attach_file, "add a text file's contents to the message"),
            ("reply: copy", app.action_copy_reply, "copy the selected or last reply"),
            ("reply: copy code block", app.action_copy_code, "copy the reply's code blocks, one per press"),
            ("reply: statistics", app.action_inspect_reply, "open the statistics inspector"),
            (
                "view: toggle draft highlighting",
                app.action_toggle_highlight,
                "colour what the draft got right",
            ),
            ("chat: new", app.action_new_chat, "start a new conversation"),
            ("chat: history", app.action_show_history, "saved chats: search, open, rename, delete, export"),
            ("metrics: trend", app.action_show_trend, "acceptance and speed over the last 7 days"),
            (
                "reply: older variant / branch",
                lambda: app.action_page_variant(-1),
                "page regenerated replies, or edited messages' branches (select one first)",
            ),
            (
                "reply: newer variant / branch",
                lambda: app.action_page_variant(1),
                "page regenerated replies, or edited messages' branches (select one first)",
            ),
            (
                "settings: edit",
                app.action_show_settings,
                "model and draft, system prompt, K, temperature, top_p, ramp, drafting",
            ),
            ("help: keys", app.action_show_help, "list every key"),
        ]
        prompt = app.prompt
        commands += [
            ("prompt: edit in $EDITOR", prompt.action_edit_in_editor, "compose the message in your editor"),
            ("prompt: clear", prompt.action_clear_prompt, "empty the prompt (ctrl+z brings it back)"),
            ("prompt: select all", prompt.action_select_everything, "select the whole prompt"),
        ]
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
