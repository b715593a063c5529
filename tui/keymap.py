"""Every key binding of the app, with a stable id users can remap in the config file.

`[keymap]` in config.toml maps a binding id to a key string (textual spelling, several keys comma-separated):

    [keymap]
    "preset.creative" = "f8"
    "reply.cancel" = "ctrl+g"

The defaults avoid keys the prompt (a TextArea) already uses for editing, or take them with `priority=True`
where the app's meaning matters more (F6: the prompt would select a line). ctrl+e and ctrl+y stay the prompt's
(end of line, redo) while it holds text and act on the last reply when it is empty.

`check_keymap` reports ids that name no binding (a warning: the rest applies), and keys that are no key or that
two bindings would share (errors: the app then opens on the default keys and names the binding ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class KeySpec:
    id: str
    key: str
    action: str
    description: str
    show: bool = True  # in the footer
    priority: bool = False


# The chat screen's keys (tui/screens/chat.py): active while no dialog covers the chat.
CHAT_KEYS: tuple[KeySpec, ...] = (
    KeySpec("preset.auto", "f1", "use_preset('auto')", "auto", priority=True),
    KeySpec("preset.code", "f2", "use_preset('code')", "code", priority=True),
    KeySpec("preset.qa", "f3", "use_preset('qa')", "qa", priority=True),
    KeySpec("preset.creative", "f4", "use_preset('creative')", "creative", priority=True),
    KeySpec("preset.pick", "ctrl+o", "pick_preset", "presets", priority=True),
    KeySpec("help.show", "f5", "show_help", "help", priority=True),
    KeySpec("view.draft_highlight", "f6", "toggle_highlight", "draft colours", priority=True),
    KeySpec("reply.cancel", "escape", "cancel_reply", "stop"),
    KeySpec("reply.regenerate", "ctrl+r", "regenerate", "regenerate", priority=True),
    # Not priority: while the prompt holds text, ctrl+e / ctrl+y are its end-of-line and redo (see PromptInput).
    KeySpec("reply.edit_last", "ctrl+e", "edit_last", "edit", show=False),
    KeySpec("reply.copy", "ctrl+y", "copy_reply", "copy", show=False),
    KeySpec("reply.copy_code", "ctrl+b", "copy_code", "copy code", show=False, priority=True),
    KeySpec("reply.inspect", "ctrl+s", "inspect_reply", "stats", priority=True),
    KeySpec(
        "reply.older_variant", "alt+left", "page_variant(-1)", "older variant", show=False, priority=True
    ),
    KeySpec(
        "reply.newer_variant", "alt+right", "page_variant(1)", "newer variant", show=False, priority=True
    ),
    KeySpec("reply.previous", "alt+up", "select_reply(-1)", "previous message", show=False, priority=True),
    KeySpec("reply.next", "alt+down", "select_reply(1)", "next message", show=False, priority=True),
    KeySpec("reply.continue", "alt+c", "continue_reply", "continue", show=False, priority=True),
    KeySpec("chat.find", "ctrl+f", "find", "find", show=False, priority=True),
    KeySpec("prompt.attach", "ctrl+t", "attach_file", "attach file", show=False, priority=True),
    KeySpec("prompt.focus", "ctrl+l", "focus_prompt", "prompt", show=False, priority=True),
    # Priority: the prompt (a TextArea) would page its own few lines; these page the conversation above it.
    KeySpec("chat.page_up", "pageup,shift+pageup", "scroll_chat(-1)", "scroll up", show=False, priority=True),
    KeySpec(
        "chat.page_down",
        "pagedown,shift+pagedown",
        "scroll_chat(1)",
        "scroll down",
        show=False,
        priority=True,
    ),
    # The prompt as a whole (PromptInput's actions, wherever focus is): a long message in $EDITOR, and clear /
    # select all (TextArea's f7 is the history's; ctrl+u clears every line, not only one: ctrl+z brings it back).
    KeySpec("prompt.editor", "f10", "edit_in_editor", "editor", show=False, priority=True),
    KeySpec("prompt.clear", "ctrl+u", "clear_prompt", "clear prompt", show=False, priority=True),
    KeySpec("prompt.select_all", "alt+a", "select_everything", "select all", show=False, priority=True),
    KeySpec("chat.new", "ctrl+n", "new_chat", "new chat", show=False, priority=True),
    KeySpec("chat.history", "ctrl+h,f7", "show_history", "history", show=False, priority=True),
    KeySpec("settings.open", "f12", "show_settings", "settings", show=False, priority=True),
)

# The app's own keys: on every screen, dialogs too.
APP_KEYS: tuple[KeySpec, ...] = (KeySpec("app.quit", "ctrl+q", "quit", "quit", priority=True),)

# Keys of a focused reply in the chat log. None is a printable key: typing with a reply selected goes to the
# prompt (a question that starts with "c" must not copy the reply), so these are enter and the app's own keys.
MESSAGE_KEYS: tuple[KeySpec, ...] = (
    KeySpec("message.inspect", "enter", "inspect", "stats"),
    KeySpec("message.copy", "ctrl+y", "copy", "copy"),
    KeySpec("message.copy_code", "ctrl+b", "copy_code", "copy code"),
    KeySpec("message.help", "f5", "screen.show_help", "help", show=False),
)

# Every key, in the order the help screen and `specchat --help` list them.
ALL_KEYS: tuple[KeySpec, ...] = CHAT_KEYS + APP_KEYS + MESSAGE_KEYS


def bindings(specs: tuple[KeySpec, ...]) -> list[Binding]:
    from textual.binding import Binding

    return [
        Binding(spec.key, spec.action, spec.description, show=spec.show, priority=spec.priority, id=spec.id)
        for spec in specs
    ]


KNOWN_IDS: frozenset[str] = frozenset(spec.id for spec in ALL_KEYS)
MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
# Keys the app has without a KeySpec: the command palette.
RESERVED_KEYS = {"ctrl+p": "the command palette"}


@dataclass(frozen=True, slots=True)
class KeymapProblem:
    message: str
    severity: str  # "warning" (the rest of the keymap applies) or "error" (the defaults are used)


def is_key_name(key: str) -> bool:
    """True for a key Textual can report: modifiers joined by '+' to one key name ('ctrl+g', 'f8', 'question_mark')."""
    from textual.keys import Keys, key_to_character

    *modifiers, base = key.strip().split("+")
    if not base or any(m not in MODIFIERS for m in modifiers):
        return False
    if len(base) == 1:
        return base.isprintable() and not base.isspace()
    if base != base.lower() or " " in base:
        return False
    named = {k.value.rpartition("+")[2] for k in Keys}
    return base in named or key_to_character(base) is not None


def _keys_of(binding: str) -> list[str]:
    from textual.keys import _character_to_key

    keys = [k.strip() for k in binding.split(",")]
    return [_character_to_key(k) if len(k) == 1 else k for k in keys]


def check_keymap(keymap: Mapping[str, str]) -> list[KeymapProblem]:
    """Problems with a user keymap, one line each, naming the binding ids (see module doc)."""
    import difflib

    problems: list[KeymapProblem] = []
    for binding_id, keys in keymap.items():
        if binding_id not in KNOWN_IDS:
            close = difflib.get_close_matches(binding_id, sorted(KNOWN_IDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(KeymapProblem(f"keymap: unknown binding id '{binding_id}'{hint}", "warning"))
            continue
        bad = [k for k in str(keys).split(",") if not is_key_name(k)]
        if bad:
            problems.append(
                KeymapProblem(
                    f"keymap: '{binding_id}' = '{keys}': '{bad[0].strip()}' is not a key name "
                    "(e.g. ctrl+g, f8, escape); using the default keys",
                    "error",
                )
            )
    # Two bindings of one scope on the same key: one would silently steal the other.
    for scope in (CHAT_KEYS + APP_KEYS, MESSAGE_KEYS):
        owners: dict[str, list[str]] = {}
        for spec in scope:
            for key in _keys_of(keymap.get(spec.id, spec.key)):
                if is_key_name(key):
                    owners.setdefault(key, []).append(spec.id)
        for key, ids in owners.items():
            if len(ids) > 1:
                problems.append(
                    KeymapProblem(
                        f"keymap: {key} is bound to both {' and '.join(ids)}; using the default keys", "error"
                    )
                )
        if scope is not MESSAGE_KEYS:
            for key, what in RESERVED_KEYS.items():
                if key in owners:
                    problems.append(
                        KeymapProblem(
                            f"keymap: {key} is {what}, not free for {' and '.join(owners[key])}; "
                            "using the default keys",
                            "error",
                        )
                    )
    return problems


WORD_KEYS = frozenset({"enter", "tab", "backspace", "delete", "space"})  # clearer as words than as glyphs


def key_display(keys: str) -> str:
    """Keys as people read them: 'question_mark' -> '?', 'i,enter' -> 'i / enter', 'ctrl+r' stays 'ctrl+r'."""
    from textual.keys import format_key

    shown = []
    for key in keys.split(","):
        *modifiers, base = key.strip().split("+")
        shown.append("+".join([*modifiers, base if base in WORD_KEYS else format_key(base)]))
    return " / ".join(shown)


def bound_keys(specs: tuple[KeySpec, ...], keymap: Mapping[str, str]) -> set[str]:
    """Every key `specs` are on once the user's keymap is applied, in Textual's key names ('c', 'question_mark')."""
    return {key for spec in specs for key in _keys_of(keymap.get(spec.id, spec.key))}


def key_for(binding_id: str, keymap: Mapping[str, str]) -> str:
    """The key a binding is on once the user's keymap is applied."""
    if binding_id in keymap:
        return keymap[binding_id]
    for spec in ALL_KEYS:
        if spec.id == binding_id:
            return spec.key
    raise KeyError(binding_id)
