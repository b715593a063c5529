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
    """One key of the app: its binding, its word in the footer (`description`), its line in the help screen and
    `specchat --help` (`help`), and its command in the palette (`palette`, "area: action"; None: not there)."""

    id: str
    key: str
    action: str
    description: str
    help: str
    palette: str | None = None
    show: bool = True  # in the footer
    priority: bool = False


K = KeySpec

# The chat screen's keys (tui/screens/chat.py): active while no dialog covers the chat.
CHAT_KEYS: tuple[KeySpec, ...] = (
    K(
        "preset.auto",
        "f1",
        "use_preset('auto')",
        "auto",
        help="preset: auto (router decides)",
        palette="preset: use auto",
        priority=True,
    ),
    K(
        "preset.code",
        "f2",
        "use_preset('code')",
        "code",
        help="preset: code",
        palette="preset: use code",
        priority=True,
    ),
    K(
        "preset.qa",
        "f3",
        "use_preset('qa')",
        "qa",
        help="preset: qa",
        palette="preset: use qa",
        priority=True,
    ),
    K(
        "preset.creative",
        "f4",
        "use_preset('creative')",
        "creative",
        help="preset: creative",
        palette="preset: use creative",
        priority=True,
    ),
    K(
        "preset.pick",
        "ctrl+o",
        "pick_preset",
        "presets",
        help="pick any preset (user presets too)",
        palette="preset: pick…",
        priority=True,
    ),
    K("help.show", "f5", "show_help", "help", help="this help", palette="help: keys", priority=True),
    K(
        "view.draft_highlight",
        "f6",
        "toggle_highlight",
        "draft colours",
        help="colour text the draft got right (history drafts in their own colour)",
        palette="view: toggle draft highlighting",
        priority=True,
    ),
    K(
        "reply.cancel",
        "escape",
        "cancel_reply",
        "stop",
        help="stop the reply (prompt comes back if nothing came)",
        palette="reply: stop",
    ),
    K(
        "reply.regenerate",
        "ctrl+r",
        "regenerate",
        "regenerate",
        help="regenerate the last reply (the old one stays as a variant)",
        palette="reply: regenerate",
        priority=True,
    ),
    # Not priority: while the prompt holds text, ctrl+e / ctrl+y are its end-of-line and redo (see PromptInput).
    K(
        "reply.edit_last",
        "ctrl+e",
        "edit_last",
        "edit",
        help="edit the selected (or last) message: a new branch; esc cancels",
        palette="reply: edit message",
        show=False,
    ),
    K(
        "reply.copy",
        "ctrl+y",
        "copy_reply",
        "copy",
        help="copy the selected (or last) reply",
        palette="reply: copy",
        show=False,
    ),
    K(
        "reply.copy_code",
        "ctrl+b",
        "copy_code",
        "copy code",
        help="copy its code blocks, one per press (first, then the next)",
        palette="reply: copy code block",
        show=False,
        priority=True,
    ),
    K(
        "reply.inspect",
        "ctrl+s",
        "inspect_reply",
        "stats",
        help="statistics of the selected (or last) reply",
        palette="reply: statistics",
        priority=True,
    ),
    K(
        "reply.older_variant",
        "alt+left",
        "page_variant(-1)",
        "older variant",
        help="older branch / variant of the selected message (or last reply)",
        palette="reply: older variant / branch",
        show=False,
        priority=True,
    ),
    K(
        "reply.newer_variant",
        "alt+right",
        "page_variant(1)",
        "newer variant",
        help="newer branch / variant of the selected message (or last reply)",
        palette="reply: newer variant / branch",
        show=False,
        priority=True,
    ),
    K(
        "reply.previous",
        "alt+up",
        "select_reply(-1)",
        "previous message",
        help="select the previous message",
        palette="reply: select the previous message",
        show=False,
        priority=True,
    ),
    K(
        "reply.next",
        "alt+down",
        "select_reply(1)",
        "next message",
        help="select the next message",
        palette="reply: select the next message",
        show=False,
        priority=True,
    ),
    K(
        "reply.continue",
        "alt+c",
        "continue_reply",
        "continue",
        help="continue the last reply where its token limit cut it",
        palette="reply: continue",
        show=False,
        priority=True,
    ),
    K(
        "chat.find",
        "ctrl+f",
        "find",
        "find",
        help="find text in the conversation (again: the match before)",
        palette="chat: find",
        show=False,
        priority=True,
    ),
    K(
        "prompt.attach",
        "ctrl+t",
        "attach_file",
        "attach file",
        help="attach a text file to the message (a file picker)",
        palette="prompt: attach file",
        show=False,
        priority=True,
    ),
    K(
        "prompt.focus",
        "ctrl+l",
        "focus_prompt",
        "prompt",
        help="back to the prompt",
        palette="prompt: focus",
        show=False,
        priority=True,
    ),
    # Priority: the prompt (a TextArea) would page its own few lines; these page the conversation above it.
    K(
        "chat.page_up",
        "pageup,shift+pageup",
        "scroll_chat(-1)",
        "scroll up",
        help="scroll the chat up a page",
        palette="chat: scroll up a page",
        show=False,
        priority=True,
    ),
    K(
        "chat.page_down",
        "pagedown,shift+pagedown",
        "scroll_chat(1)",
        "scroll down",
        help="scroll the chat down a page",
        palette="chat: scroll down a page",
        show=False,
        priority=True,
    ),
    # The prompt as a whole (PromptInput's actions, wherever focus is): a long message in $EDITOR, and clear /
    # select all (TextArea's f7 is the history's; ctrl+u clears every line, not only one: ctrl+z brings it back).
    K(
        "prompt.editor",
        "f10",
        "edit_in_editor",
        "editor",
        help="compose the message in $VISUAL / $EDITOR (vi if unset)",
        palette="prompt: edit in $EDITOR",
        show=False,
        priority=True,
    ),
    K(
        "prompt.clear",
        "ctrl+u",
        "clear_prompt",
        "clear prompt",
        help="clear the prompt (ctrl+z brings it back)",
        palette="prompt: clear",
        show=False,
        priority=True,
    ),
    K(
        "prompt.select_all",
        "alt+a",
        "select_everything",
        "select all",
        help="select the whole prompt",
        palette="prompt: select all",
        show=False,
        priority=True,
    ),
    K(
        "chat.new",
        "ctrl+n",
        "new_chat",
        "new chat",
        help="new chat (the last one stays in the history)",
        palette="chat: new",
        show=False,
        priority=True,
    ),
    K(
        "chat.history",
        "ctrl+h,f7",
        "show_history",
        "history",
        help="saved chats: search, open, rename, delete, export (f7: where ctrl+h is backspace)",
        palette="chat: history",
        show=False,
        priority=True,
    ),
    K(
        "settings.open",
        "f12",
        "show_settings",
        "settings",
        help="settings for this chat: model and draft, system prompt, K, temperature, top_p, ramp, drafting",
        palette="settings: edit",
        show=False,
        priority=True,
    ),
)

# The app's own keys: on every screen, dialogs too.
APP_KEYS: tuple[KeySpec, ...] = (
    K("app.quit", "ctrl+q", "quit", "quit", help="quit", palette="app: quit", priority=True),
)

# Keys of a focused reply in the chat log. None is a printable key: typing with a reply selected goes to the
# prompt (a question that starts with "c" must not copy the reply), so these are enter and the app's own keys.
# Not in the palette: there the chat's own reply.inspect / reply.copy / reply.copy_code act on the selected reply.
MESSAGE_KEYS: tuple[KeySpec, ...] = (
    K("message.inspect", "enter", "inspect", "stats", help="on a selected reply: statistics"),
    K("message.copy", "ctrl+y", "copy", "copy", help="on a selected reply: copy it"),
    K(
        "message.copy_code",
        "ctrl+b",
        "copy_code",
        "copy code",
        help="on a selected reply: copy its code blocks",
    ),
    K("message.help", "f5", "screen.show_help", "help", help="on a selected reply: this help", show=False),
)

# Keys of the saved-chats dialog (tui/screens/history.py; ctrl+h / f7 opens it). Ctrl keys with priority: the
# search box has the focus and would take them.
HISTORY_KEYS: tuple[KeySpec, ...] = (
    K("history.close", "escape", "close", "close", help="saved chats: close (or cancel a rename or delete)"),
    K("history.next", "down", "move(1)", "next", help="saved chats: next chat", show=False),
    K("history.previous", "up", "move(-1)", "previous", help="saved chats: previous chat", show=False),
    K("history.delete", "ctrl+d", "delete", "delete", help="saved chats: delete (asks first)", priority=True),
    K("history.rename", "ctrl+t", "rename", "rename", help="saved chats: rename", priority=True),
    K("history.export", "ctrl+x", "export", "export", help="saved chats: export as Markdown", priority=True),
    K(
        "history.private",
        "ctrl+k",
        "toggle_private",
        "private",
        help="saved chats: mark private (never drafted from by history drafting) or not",
        priority=True,
    ),
)

# The other dialogs' keys (tui/screens/*.py), one table each. Listed by `specchat --help` and docs/usage.md; the help
# screen lists the chat's keys and the saved chats' (each dialog's footer shows its own).
ERROR_KEYS: tuple[KeySpec, ...] = (
    K("error.close", "escape,enter", "dismiss", "close", help="error dialog: close"),
)
FIND_KEYS: tuple[KeySpec, ...] = (K("find.close", "escape", "dismiss(None)", "close", help="find: close"),)
HELP_KEYS: tuple[KeySpec, ...] = (
    K("help.close", "escape,q,f5,question_mark", "dismiss", "close", help="help: close"),
)
INSPECTOR_KEYS: tuple[KeySpec, ...] = (
    K("inspector.close", "escape,q,i", "dismiss", "close", help="statistics: close"),
    # The scroller takes End itself when it has the focus; this one is for the moments it does not
    # (still waiting for the figures, or the focus elsewhere): End is kept for when they arrive.
    K(
        "inspector.end",
        "end",
        "remember_end",
        "",
        help="statistics: to the end (kept while they load)",
        show=False,
    ),
)
PICKER_KEYS: tuple[KeySpec, ...] = (
    K("picker.close", "escape", "dismiss(None)", "back", help="file picker: back"),
    K("picker.pick", "ctrl+s", "pick", "pick", help="file picker: pick the highlighted file", priority=True),
    K("picker.up", "backspace", "up", "parent folder", help="file picker: the parent folder"),
)
PRESETS_KEYS: tuple[KeySpec, ...] = (
    K("presets.close", "escape", "dismiss(None)", "close", help="preset picker: close"),
)
SETTINGS_KEYS: tuple[KeySpec, ...] = (
    K("settings.close", "escape", "dismiss(None)", "close", help="settings: close without applying"),
    K("settings.apply", "ctrl+s", "apply", "apply", help="settings: apply", priority=True),
)
TREND_KEYS: tuple[KeySpec, ...] = (K("trend.close", "escape,q", "dismiss", "close", help="trend: close"),)
DIALOG_KEYS: tuple[tuple[KeySpec, ...], ...] = (
    ERROR_KEYS,
    FIND_KEYS,
    HELP_KEYS,
    INSPECTOR_KEYS,
    PICKER_KEYS,
    PRESETS_KEYS,
    SETTINGS_KEYS,
    TREND_KEYS,
)

# Keys that are no binding: what the prompt does with them, first in the help screen and `specchat --help`.
TEXT_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "send the message"),
    ("ctrl+j / shift+enter", "new line in the prompt"),
    ("ctrl+p", "command palette (presets, actions)"),
    ("/attach PATH …", "typed in the prompt: the files' text goes in as fenced blocks"),
)
# Printable keys are never a reply's: typed with a reply selected they go to the prompt (a line says so).
TYPING_NOTE = ("a–z, 0–9 …", "on a selected reply: typed into the prompt")

# Commands of the palette with no key: (name, the chat screen's action, what it does).
KEYLESS_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("metrics: trend", "show_trend", "acceptance and speed over the last 7 days"),
)

# Every key, in the order the help screen and `specchat --help` list them.
ALL_KEYS: tuple[KeySpec, ...] = CHAT_KEYS + APP_KEYS + MESSAGE_KEYS + HISTORY_KEYS
# Every binding of the app, the other dialogs' too: what `[keymap]` may name and `specchat --help` lists.
EVERY_KEY: tuple[KeySpec, ...] = ALL_KEYS + tuple(spec for specs in DIALOG_KEYS for spec in specs)


def bindings(specs: tuple[KeySpec, ...]) -> list[Binding]:
    from textual.binding import Binding

    return [
        Binding(spec.key, spec.action, spec.description, show=spec.show, priority=spec.priority, id=spec.id)
        for spec in specs
    ]


KNOWN_IDS: frozenset[str] = frozenset(spec.id for spec in EVERY_KEY)
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
    scopes = (
        CHAT_KEYS + APP_KEYS,
        MESSAGE_KEYS,
        HISTORY_KEYS + APP_KEYS,
        *(k + APP_KEYS for k in DIALOG_KEYS),
    )
    for scope in scopes:
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


# `specchat --help` names keys in words (a pipe or a log may not take arrows); the help screen uses Textual's glyphs.
KEY_WORDS = {"escape": "esc", "pageup": "pgup", "pagedown": "pgdn"}


def key_words(keys: str) -> str:
    """Keys as `specchat --help` writes them: 'escape' -> 'esc', 'ctrl+h,f7' -> 'ctrl+h / f7'."""
    shown = []
    for key in keys.split(","):
        *modifiers, base = key.strip().split("+")
        shown.append("+".join([*modifiers, KEY_WORDS.get(base, base)]))
    return " / ".join(shown)


def keys_help() -> str:
    """The key list at the end of `specchat --help`: every key of the table, its line and its binding id."""
    rows = [(key, what) for key, what in TEXT_KEYS]
    rows += [(key_words(spec.key), f"{spec.help} [{spec.id}]") for spec in EVERY_KEY]
    rows.append(TYPING_NOTE)
    width = max(len(key) for key, _ in rows)
    head = 'keys in the chat (binding id in brackets; remap under [keymap] in config.toml, e.g. "reply.cancel" = "ctrl+g"):'
    return "\n".join([head, *(f"  {key:<{width}}  {what}" for key, what in rows)]) + "\n"


def key_for(binding_id: str, keymap: Mapping[str, str]) -> str:
    """The key a binding is on once the user's keymap is applied."""
    if binding_id in keymap:
        return keymap[binding_id]
    for spec in EVERY_KEY:
        if spec.id == binding_id:
            return spec.key
    raise KeyError(binding_id)
