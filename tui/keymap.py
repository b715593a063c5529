"""Every key binding of the app, with a stable id users can remap in the config file.

`[keymap]` in config.toml maps a binding id to a key string (textual spelling, several keys comma-separated):

    [keymap]
    "preset.creative" = "f8"
    "reply.cancel" = "ctrl+g"

The defaults avoid keys the prompt (a TextArea) already uses for editing, or take them with `priority=True`
where the app's meaning matters more (F6: the prompt would select a line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class KeySpec:
    id: str
    key: str
    action: str
    description: str
    show: bool = True  # in the footer
    priority: bool = False


APP_KEYS: tuple[KeySpec, ...] = (
    KeySpec("preset.auto", "f1", "use_preset('auto')", "auto", priority=True),
    KeySpec("preset.code", "f2", "use_preset('code')", "code", priority=True),
    KeySpec("preset.qa", "f3", "use_preset('qa')", "qa", priority=True),
    KeySpec("preset.creative", "f4", "use_preset('creative')", "creative", priority=True),
    KeySpec("preset.pick", "ctrl+o", "pick_preset", "presets", priority=True),
    KeySpec("help.show", "f5", "show_help", "help", priority=True),
    KeySpec("view.draft_highlight", "f6", "toggle_highlight", "draft colours", priority=True),
    KeySpec("reply.cancel", "escape", "cancel_reply", "stop"),
    KeySpec("reply.regenerate", "ctrl+r", "regenerate", "regenerate", priority=True),
    KeySpec("reply.edit_last", "ctrl+e", "edit_last", "edit last", show=False, priority=True),
    KeySpec("reply.copy", "ctrl+y", "copy_reply", "copy", show=False, priority=True),
    KeySpec("reply.copy_code", "ctrl+b", "copy_code", "copy code", show=False, priority=True),
    KeySpec("reply.inspect", "ctrl+s", "inspect_reply", "stats", priority=True),
    KeySpec(
        "reply.older_variant", "alt+left", "page_variant(-1)", "older variant", show=False, priority=True
    ),
    KeySpec(
        "reply.newer_variant", "alt+right", "page_variant(1)", "newer variant", show=False, priority=True
    ),
    KeySpec("reply.previous", "alt+up", "select_reply(-1)", "previous reply", show=False, priority=True),
    KeySpec("reply.next", "alt+down", "select_reply(1)", "next reply", show=False, priority=True),
    KeySpec("prompt.focus", "ctrl+l", "focus_prompt", "prompt", show=False, priority=True),
    KeySpec("chat.new", "ctrl+n", "new_chat", "new chat", show=False, priority=True),
    KeySpec("chat.history", "ctrl+h,f7", "show_history", "history", show=False, priority=True),
    KeySpec("app.quit", "ctrl+q", "quit", "quit", priority=True),
)

# Keys of a focused reply in the chat log (no modifier needed: the prompt is not focused then).
MESSAGE_KEYS: tuple[KeySpec, ...] = (
    KeySpec("message.inspect", "i,enter", "inspect", "stats"),
    KeySpec("message.copy", "c", "copy", "copy"),
    KeySpec("message.copy_code", "b", "copy_code", "copy code"),
    KeySpec("message.help", "question_mark", "app.show_help", "help", show=False),
)


def bindings(specs: tuple[KeySpec, ...]) -> list[Binding]:
    return [
        Binding(spec.key, spec.action, spec.description, show=spec.show, priority=spec.priority, id=spec.id)
        for spec in specs
    ]


KNOWN_IDS: frozenset[str] = frozenset(spec.id for spec in APP_KEYS + MESSAGE_KEYS)


def check_keymap(keymap: Mapping[str, str]) -> list[str]:
    """One message per entry that names no binding, so a typo in the config file is reported, not ignored."""
    import difflib

    problems = []
    for binding_id in keymap:
        if binding_id not in KNOWN_IDS:
            close = difflib.get_close_matches(binding_id, sorted(KNOWN_IDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(f"keymap: unknown binding id '{binding_id}'{hint}")
    return problems


def key_for(binding_id: str, keymap: Mapping[str, str]) -> str:
    """The key a binding is on once the user's keymap is applied."""
    if binding_id in keymap:
        return keymap[binding_id]
    for spec in APP_KEYS + MESSAGE_KEYS:
        if spec.id == binding_id:
            return spec.key
    raise KeyError(binding_id)
