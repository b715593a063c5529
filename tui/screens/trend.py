"""The metrics trend: what regressed (if anything), the daily table and the per-reply plot of the last 7 days.

Opened from the status bar's regression warning (a click) or the command palette ("metrics: trend"). The
rows come from the session's metrics log; the table and plot are the same as `specchat metrics` prints.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.formatting import trend_text
from tui.keymap import TREND_KEYS, bindings


class TrendScreen(ModalScreen[None]):
    BINDINGS = bindings(TREND_KEYS)

    def __init__(self, rows: list[dict], regressions: list) -> None:
        super().__init__()
        self.rows = rows
        self.regressions = regressions

    def compose(self) -> ComposeResult:
        with Vertical(id="trend", classes="dialog"):
            yield Static(Text("Acceptance and speed, last 7 days", style="bold"), classes="title")
            with VerticalScroll():
                yield Static(Text(trend_text(self.rows, self.regressions)), id="trend-body")
            yield Static("esc close · specchat metrics in a shell for --by, --json, --csv", classes="hint")
