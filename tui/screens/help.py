"""Every key, as currently mapped (the user's keymap applied): the key table of tui/keymap.py, row by row."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.keymap import ALL_KEYS, HELP_KEYS, TEXT_KEYS, TYPING_NOTE, bindings, key_display, key_for
from tui.widgets.footer import FittingFooter


def keys_table(keymap: Mapping[str, str]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", justify="right")
    table.add_column()
    table.add_column(style="dim")
    for key, what in TEXT_KEYS:
        table.add_row(key, what, "")
    for spec in ALL_KEYS:
        table.add_row(key_display(key_for(spec.id, keymap)), spec.help, spec.id)
    table.add_row(*TYPING_NOTE, "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = bindings(HELP_KEYS)

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
