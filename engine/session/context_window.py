"""The context window's arithmetic: the conversation as the model's messages, the room a reply keeps for its answer,
and the first turn that still fits (the oldest exchanges are left out, never the message being answered).

The session keeps the figures (`context_used`, `context_start`) and says when turns leave the context; these are
the pure parts, given the turns and the backend's chat encoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.presets import Preset
from engine.reasoning import split_reasoning
from engine.session.turn import Turn

Messages = list[dict[str, str]]


def without_reasoning(text: str) -> str:
    """A reply as it goes back into the context: a finished reasoning block is left out (as chat templates do)."""
    split = split_reasoning(text)
    return split.answer if split.has_thinking and split.closed else text


def context_messages(turns: Sequence[Turn], system_prompt: str | None) -> Messages:
    """The turns as the model's chat messages: the system prompt first, replies without their finished reasoning,
    empty replies left out."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [
        {"role": t.role, "content": t.content if t.role == "user" else without_reasoning(t.content)}
        for t in turns
        if t.content or t.role == "user"
    ]
    return messages


def reply_room(preset: Preset, max_context: int) -> int:
    """Room a reply with `preset` keeps free in the context for its answer."""
    return min(preset.max_new_tokens, max_context // 2)


def fit_turns(
    turns: Sequence[Turn],
    start: int,
    reserve: int,
    keep_from: int,
    max_context: int,
    encode: Callable[[Sequence[Turn]], list[int]],
) -> tuple[int, list[int]]:
    """(first turn kept, prompt ids): from turn `start` on, the oldest exchanges are dropped until the prompt
    (`encode(turns)`) plus `reserve` fits, never past turn `keep_from` (the message being answered)."""
    ids = encode(turns[start:])
    while len(ids) + reserve > max_context and start < keep_from:
        start += 1
        while start < keep_from and turns[start].role != "user":
            start += 1
        ids = encode(turns[start:])
    return start, ids
