"""The key footer, fitted to the terminal's width: whole keys are left out, least useful first, never cut."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import AwaitMount
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
    """Textual's Footer (compact), recomposed on resize so that it never overflows into broken words.

    When the bindings change (a reply starts or ends: stop shows, regenerate goes), the keys on screen take the new
    keys' text in place, one more mounted or one fewer removed, where Textual's Footer would remove and mount every
    key: that styling and layout on the UI thread lands in a reply's first tokens, which it slows (on 2 cores,
    ~10-20 ms of a short answer's ~100 ms)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(compact=True, **kwargs)
        self._composed_for = 0
        self._mounting: AwaitMount | None = None

    def compose(self) -> ComposeResult:
        kept = self._fitted()
        self.styles.grid_size_columns = max(1, len(kept))
        yield from kept

    def _fitted(self) -> list[FooterKey]:
        keys = [w for w in super().compose() if isinstance(w, FooterKey)]
        # The footer spans the terminal: its width is the app's (known before the footer's own first layout).
        self._composed_for = self.app.size.width
        return fit_keys(keys, self._composed_for)

    def on_mount(self, event: events.Mount) -> None:
        # Told at once, in place of Footer's subscription (which posts each change to this widget's queue, to run
        # after the next frame: its own frame, in the reply's first tokens).
        event.prevent_default()
        self.screen.bindings_updated_signal.subscribe(self, self.bindings_changed, immediate=True)

    def bindings_changed(self, screen: Screen) -> None:
        # The signal comes in the screen's context: keys composed here (Footer.compose's data_bind) bind to the footer.
        with self._context():
            if self._bindings_ready and self.is_attached and screen is self.screen and self.app.app_focus:
                self._update_in_place()
            else:
                super().bindings_changed(screen)

    def _update_in_place(self) -> None:
        shown = list(self.query_children(FooterKey))
        kept = self._fitted()
        if any(key.has_class("-grouped") for key in shown + kept):
            self.call_after_refresh(self.recompose)  # keys in a group: not a plain swap of text
            return
        for old, new in zip(shown, kept, strict=False):
            take_key(old, new)
        if len(kept) > len(shown):
            self._mounting = self.mount_all(kept[len(shown) :])
        elif len(kept) < len(shown):
            self.remove_children(shown[len(kept) :])
        self.styles.grid_size_columns = max(1, len(kept))

    async def settled(self) -> None:
        """Wait until the keys the last change mounted are in place (a reply's first frame draws them too)."""
        mounting, self._mounting = self._mounting, None
        if mounting is not None:
            await mounting

    def on_resize(self) -> None:
        # Only a terminal resize changes what fits; recomposing on every layout pass would churn the keys.
        if self._composed_for and self.app.size.width != self._composed_for:
            self._composed_for = self.app.size.width
            self.call_after_refresh(self.recompose)


def take_key(shown: FooterKey, new: FooterKey) -> None:
    """`shown` (on screen) becomes `new` (composed, not mounted): its key, text, action, state and tooltip."""
    text = (new.key, new.key_display, new.description, new.action, new._disabled)
    if text == (shown.key, shown.key_display, shown.description, shown.action, shown._disabled):
        return
    shown.key, shown.key_display, shown.description, shown.action, shown._disabled = text
    shown.set_class(new._disabled, "-disabled")
    shown.set_class(new.has_class("-command-palette"), "-command-palette")
    shown.tooltip = new.tooltip
    shown.refresh(layout=True)
