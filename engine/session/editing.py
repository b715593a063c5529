"""Changing a conversation that already has replies: an earlier message edited (a new branch beside the old one)
and a reply cut at its token limit continued. The turns as the edit or the continuation leaves them, and the prompt
a continued reply goes on from; the session records the message and runs the reply (`ChatSession._reply`, given
what to put back if it produces nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import SpecchatError
from engine.session.turn import Turn

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.events import BackendInfo
    from engine.origins import OriginRun


def cut_for_edit(turns: list[Turn], index: int, text: str) -> list[Turn]:
    """Put `text` in place of user turn `index` (any of them, not only the last): the turns from `index` on are
    taken off (returned: the old branch, which comes back if the reply produces nothing) and the new message ends
    `turns`."""
    if not text.strip():
        raise SpecchatError("empty message: type something to send")
    if not 0 <= index < len(turns) or turns[index].role != "user":
        raise SpecchatError("no such message to edit")
    edited = turns[index:]
    del turns[index:]
    turns.append(Turn("user", text))
    return edited


def can_continue(turns: list[Turn]) -> bool:
    """True when the last reply stopped at its token limit (max_new_tokens) and can be continued."""
    last = turns[-1] if turns else None
    return (
        last is not None
        and last.role == "assistant"
        and last.stats is not None
        and last.stats.stop_reason == "max_new_tokens"
    )


def take_continued(turns: list[Turn], info: BackendInfo | None) -> tuple[Turn, str]:
    """Take the reply to continue off `turns`: (that reply, the user message it answers)."""
    if not can_continue(turns):
        raise SpecchatError("nothing to continue: the last reply did not stop at its token limit")
    if info is not None and info.backend == "remote":
        raise SpecchatError("continue needs a local model (a server cannot resume a reply mid-turn)")
    last = turns.pop()
    user_text = next((t.content for t in reversed(turns) if t.role == "user"), "")
    return last, user_text


def grown(
    continuing: Turn, text: str, origins: list[bool], runs: list[OriginRun]
) -> tuple[str, list[bool], list[OriginRun]]:
    """A continued reply is one reply: its text, origins and colouring grow by what came now."""
    prefix = continuing.content
    return (
        prefix + text,
        [*(continuing.origins or ()), *origins],
        [*(continuing.runs or ((prefix, False),)), *runs],
    )


def continued_prompt(backend: Backend, messages: list[dict[str, str]], text: str) -> list[int]:
    """The prompt that goes on from reply `text` after `messages`: the conversation rendered with it as the last
    turn, cut right after its last character (before the end of turn). Found by decoding, so a template that joins
    the turn's header and its first token differently still cuts at the right place."""
    base = backend.encode_chat(messages)
    closed = backend.encode_chat([*messages, {"role": "assistant", "content": text}])
    start = 0
    while start < min(len(base), len(closed)) and base[start] == closed[start]:
        start += 1
    want = text.rstrip() or text

    def shown(end: int) -> str:
        return backend.decode(list(closed[start:end]))

    low, high = start, len(closed)
    while low < high:  # the fewest tokens that decode to at least the reply's length
        middle = (low + high) // 2
        if len(shown(middle)) >= len(want):
            high = middle
        else:
            low = middle + 1
    for end in range(low, min(len(closed), low + 16) + 1):
        if shown(end).endswith(want):
            return list(closed[:end])
    raise SpecchatError("this model's chat template cannot continue a reply")
