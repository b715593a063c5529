"""Pick the preset for the next replies: auto (the router decides per message) or any built-in or user preset."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tui.keymap import PRESETS_KEYS, bindings
from tui.widgets.footer import FittingFooter


def preset_option_text(name: str, preset: object | None) -> Text:
    if preset is None:
        return Text.assemble(("auto", "bold"), ("  the router picks code, qa or creative per message", "dim"))
    k = f"K {preset.k}" if preset.drafting and preset.k > 0 else "draft off"
    source = "" if preset.source == "built-in" else f"  [{preset.source}]"
    return Text.assemble(
        (name, "bold"), f"  {k} · T {preset.temperature:.2f}", ("  " + preset.description + source, "dim")
    )


class PresetPickerScreen(ModalScreen[str | None]):
    BINDINGS = bindings(PRESETS_KEYS)

    def __init__(self, presets: dict, current: str) -> None:
        super().__init__()
        self.presets = presets
        self.current = current

    def compose(self) -> ComposeResult:
        names = ["auto", *self.presets]
        options = [
            Option(preset_option_text(n, self.presets.get(n) if n != "auto" else None), id=n) for n in names
        ]
        with Vertical(id="preset-picker", classes="dialog"):
            yield Static(Text("Preset for the next replies", style="bold"), classes="title")
            yield OptionList(*options)
            yield Static("enter choose · esc close", classes="hint")
        yield FittingFooter()

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        names = ["auto", *self.presets]
        if self.current in names:
            option_list.highlighted = names.index(self.current)
        option_list.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
