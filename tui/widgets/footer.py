"""The key footer, fitted to the terminal's width: whole keys are left out, least useful first, never cut."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.keymap import APP_KEYS, CHAT_KEYS

# Actions in the order the footer shows them; unknown ones (a dialog's own keys) come first.
ORDER = [spec.action for spec in CHAT_KEYS + APP_KEYS]
# Dropped first to last when the keys do not fit; every other key stays (presets, help, stop, quit).
DROP_ORDER = (
    "toggle_highlight",
    "pick_preset",
    "app.command_palette",
    "command_palette",
    "regenerate",
    "inspect_reply",
)


def key_width(key: FooterKey) -> int:
    """Cells a compact FooterKey takes, with the one-cell gap after it: 'f1 auto '."""
    return len(key.key_display) + (1 + len(key.description) if key.description else 0) + 1


def fit_keys(keys: list[FooterKey], width: int) -> list[FooterKey]:
    """The keys to show in `width` cells, in display order."""
    ordered = sorted(keys, key=lambda k: ORDER.index(k.action) if k.action in ORDER else -1)
    kept = list(ordered)
    for action in DROP_ORDER:
        if sum(key_width(k) for k in kept) <= width:
            break
        kept = [k for k in kept if k.action != action]
    while kept and sum(key_width(k) for k in kept) > width:
        kept.pop()  # still too wide (a very narrow terminal): the rightmost go
    return kept


class FittingFooter(Footer):
    """Textual's Footer (compact), recomposed on resize so that it never overflows into broken words."""

    def __init__(self, **kwargs) -> None:
        super().__init__(compact=True, **kwargs)
        self._composed_for = 0

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        keys = [w for w in widgets if isinstance(w, FooterKey)]
        # The footer spans the terminal: its width is the app's (known before the footer's own first layout).
        self._composed_for = self.app.size.width
        kept = fit_keys(keys, self._composed_for)
        self.styles.grid_size_columns = max(1, len(kept))
        yield from kept

    def on_resize(self) -> None:
        # Only a terminal resize changes what fits; recomposing on every layout pass would churn the keys.
        if self._composed_for and self.app.size.width != self._composed_for:
            self._composed_for = self.app.size.width
            self.call_after_refresh(self.recompose)
