"""The command palette's provider (ctrl+p): every key of the key table (tui/keymap.py) as "area: action", e.g.
"reply: regenerate", plus the session's own presets (user presets too) and the commands that have no key.

Each command runs the same action as its key, on the screen the palette was opened over (the chat), so a palette
command and its key do the same thing; a command runs even where the footer would hide its key (copy code on a
selected reply), as a direct call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.actions import parse
from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui.keymap import APP_KEYS, CHAT_KEYS, KEYLESS_COMMANDS
from tui.screens.chat import ChatScreen


def action_call(target: Any, action: str) -> Callable[[], Any]:
    """A callable that runs `action` (a key table's action string, "use_preset('qa')") on `target`."""
    _, name, parameters = parse(action)
    method = getattr(target, f"action_{name}")
    return lambda: method(*parameters)


class SpecchatCommands(Provider):
    """'preset: use creative', 'reply: regenerate', ... in the command palette (ctrl+p)."""

    def _commands(self) -> list[tuple[str, Any, str]]:
        chat = next(screen for screen in self.app.screen_stack if isinstance(screen, ChatScreen))
        presets = chat.session.presets
        commands: list[tuple[str, Any, str]] = []
        for specs, target in ((CHAT_KEYS, chat), (APP_KEYS, self.app)):
            for spec in specs:
                if spec.palette is None:
                    continue
                preset = (
                    presets.get(spec.id.removeprefix("preset.")) if spec.id.startswith("preset.") else None
                )
                # A preset's key says what the preset is for (its file's description) in the palette.
                help_text = (preset.description if preset is not None else "") or spec.help
                commands.append((spec.palette, action_call(target, spec.action), help_text))
        named = {name for name, _, _ in commands}
        for name, preset in presets.items():  # the presets without a key of their own
            if f"preset: use {name}" not in named:
                commands.append(
                    (
                        f"preset: use {name}",
                        action_call(chat, f"use_preset({name!r})"),
                        preset.description or name,
                    )
                )
        for name, action, help_text in KEYLESS_COMMANDS:
            commands.append((name, action_call(chat, action), help_text))
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
