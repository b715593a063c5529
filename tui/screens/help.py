"""Every key, as currently mapped (the user's keymap applied)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.keymap import ALL_KEYS, key_display, key_for
from tui.widgets.footer import FittingFooter

PROMPT_KEYS = (
    ("enter", "send the message"),
    ("ctrl+j / shift+enter", "new line in the prompt"),
    ("ctrl+p", "command palette (presets, actions)"),
    ("/attach PATH …", "typed in the prompt: the files' text goes in as fenced blocks"),
)

LONG_NAMES = {
    "preset.auto": "preset: auto (router decides)",
    "preset.code": "preset: code",
    "preset.qa": "preset: qa",
    "preset.creative": "preset: creative",
    "preset.pick": "pick any preset (user presets too)",
    "help.show": "this help",
    "view.draft_highlight": "colour text the draft got right",
    "reply.cancel": "stop the reply (prompt comes back if nothing came)",
    "reply.regenerate": "regenerate the last reply",
    "reply.edit_last": "edit the selected (or last) message: a new branch; esc cancels",
    "reply.copy": "copy the selected (or last) reply",
    "reply.copy_code": "copy its code blocks, one per press (first, then the next)",
    "reply.inspect": "statistics of the selected (or last) reply",
    "reply.previous": "select the previous message",
    "reply.next": "select the next message",
    "reply.older_variant": "older branch / variant of the selected message (or last reply)",
    "reply.newer_variant": "newer branch / variant of the selected message (or last reply)",
    "reply.continue": "continue the last reply where its token limit cut it",
    "chat.find": "find text in the conversation (again: the match before)",
    "prompt.attach": "attach a text file to the message (a file picker)",
    "prompt.focus": "back to the prompt",
    "prompt.editor": "compose the message in $EDITOR",
    "prompt.clear": "clear the prompt (ctrl+z brings it back)",
    "prompt.select_all": "select the whole prompt",
    "chat.new": "new chat",
    "chat.page_up": "scroll the chat up a page",
    "chat.page_down": "scroll the chat down a page",
    "app.quit": "quit",
    "message.inspect": "on a selected reply: statistics",
    "message.copy": "on a selected reply: copy it",
    "message.copy_code": "on a selected reply: copy its last code block",
    "message.help": "on a selected reply: this help",
}
# Printable keys are never a reply's: typed with a reply selected they go to the prompt (a line says so).
TYPING_NOTE = ("a–z, 0–9 …", "on a selected reply: typed into the prompt", "")


def keys_table(keymap: Mapping[str, str]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", justify="right")
    table.add_column()
    table.add_column(style="dim")
    for key, what in PROMPT_KEYS:
        table.add_row(key, what, "")
    for spec in ALL_KEYS:
        table.add_row(
            key_display(key_for(spec.id, keymap)), LONG_NAMES.get(spec.id, spec.description), spec.id
        )
    table.add_row(*TYPING_NOTE)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f5,question_mark", "dismiss", "close", id="help.close")]

    def __init__(self, keymap: Mapping[str, str]) -> None:
        super().__init__()
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with Vertical(id="help", classes="dialog"):
            yield Static(Text("Keys", style="bold"), classes="title")
            with VerticalScroll():
                yield Static(keys_table(self.keymap))
                yield Static(
                    Text(
                        '\nRemap any key in config.toml:  [keymap]  "reply.cancel" = "ctrl+g"   '
                        "(the right column is the binding id)",
                        style="dim",
                    )
                )
            yield Static("esc close · ↑↓ pgup pgdn home end scroll", classes="hint")
        yield FittingFooter()
