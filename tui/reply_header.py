"""The line above a reply: its preset (and whether the router chose it), K or "draft off", the router's reason,
and, for a regenerated reply, which variant it is. Pure functions of the session's plain values.

A reply gets its header when it starts (`started_header`); a stored reply gets the same line back from its stats
(`stored_header`), so a chat reopened from the history reads as it did when it streamed.
"""

from __future__ import annotations

from engine.events import MessageStats, ReplyStarted
from tui.formatting import k_label, preset_label


def started_header(event: ReplyStarted, k_by_server: bool) -> str:
    """The header of a reply that has just started (`k_by_server`: the server, not the preset, sets K)."""
    why = f" — {event.router_reason}" if event.auto and event.router_reason else ""
    k_text = "K server" if k_by_server else f"K {event.num_draft_tokens}"
    drafting = k_text if event.drafting else "draft off"
    return f"{preset_label(event.preset, event.auto)} · {drafting}{why}"


def stored_header(stats: MessageStats) -> str:
    """A stored reply's header, as it read when the reply streamed (preset, K, the router's reason)."""
    drafting = (
        k_label(stats)
        if stats.draft_mode != "none" and (stats.num_draft_tokens or stats.k_by_server)
        else "draft off"
    )
    why = f" — {stats.router_reason}" if stats.router_reason else ""
    return f"{preset_label(stats.preset, bool(stats.router_reason))} · {drafting}{why}"


def variant_header(header: str, position: int, count: int, older_key: str, newer_key: str) -> str:
    """`header` saying which variant of a regenerated reply this is, and the keys that page them."""
    base = header.split(" · variant ")[0]
    return f"{base} · variant {position}/{count} ({older_key} / {newer_key})"
