"""How the benches, `tune` and `doctor` print a figure: one dash ("–") where nothing was measured, as the chat's
status bar and the stats do (tui/formatting.py)."""

from __future__ import annotations

DASH = "–"


def fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    """`value` in `pattern`; DASH for None (nothing measured)."""
    return DASH if value is None else pattern.format(value)


def percent(value: float | None) -> str:
    """A fraction as a whole percentage ("42%"); DASH for None."""
    return fmt(value, "{:.0%}")
