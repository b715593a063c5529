"""The context window's arithmetic: the conversation as the model's messages, the room a reply keeps for its answer,
and the first turn that still fits (the oldest exchanges are left out, never the message being answered).

The pure parts, given the turns and the backend's chat encoder, and `ContextWindow`, the figures the session holds
(`session.context_window`: the tokens the next reply sees, the first turn it sees), which says when turns leave
the context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.errors import UserError
from engine.events import ContextTrimmed
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


class ContextWindow:
    """A conversation's context figures: `used`, the tokens the next reply will see (the kept turns as its prompt
    renders them; during a reply, its prompt plus what it has generated so far), and `start`, the first turn it
    sees: `turns[:start]` stay in the chat (on screen, in the store) but no longer fit the context. Trimming only
    moves forward; each call is given the turns, the encoder and the sizes as they are then."""

    def __init__(self) -> None:
        self.used = 0
        self.start = 0

    def clear(self) -> None:
        self.used = 0
        self.start = 0

    def recount(
        self,
        turns: Sequence[Turn],
        encode: Callable[[Sequence[Turn]], list[int]],
        max_context: int,
        reserve: int,
        from_start: bool = False,
        on_event: Callable[[Any], None] | None = None,
    ) -> None:
        """The figures for `turns` as they stand, with `reserve` kept for the next reply (`from_start` begins again
        at the first turn: another model, another branch). Turns that leave the context are said to `on_event`
        (ContextTrimmed), where given: after a reply, when they leave, not at the next message."""
        before = self.start
        users = [i for i, t in enumerate(turns) if t.role == "user"]
        last_user = users[-1] if users else 0
        start = 0 if from_start else min(self.start, last_user)
        try:
            self.start, ids = fit_turns(turns, start, reserve, last_user, max_context, encode)
        except UserError:
            return  # the figure stays as it was; the next reply measures it again
        self.used = len(ids)
        if on_event is not None and self.start > before:
            on_event(
                ContextTrimmed(
                    dropped_turns=self.start - before, prompt_tokens=self.used, max_context=max_context
                )
            )

    def fit_reply(
        self,
        turns: Sequence[Turn],
        encode: Callable[[Sequence[Turn]], list[int]],
        max_context: int,
        reserve: int,
        on_event: Callable[[Any], None],
    ) -> list[int] | None:
        """The prompt for a reply to the last turn, leaving out the oldest exchanges until it plus `reserve` fits
        (said to `on_event`); None where even the last message does not fit."""
        before = min(self.start, len(turns) - 1)
        start, ids = fit_turns(turns, before, reserve, len(turns) - 1, max_context, encode)
        if len(ids) + min(reserve, 16) > max_context:
            return None
        self.start = start
        if start > before:
            on_event(
                ContextTrimmed(dropped_turns=start - before, prompt_tokens=len(ids), max_context=max_context)
            )
        return ids
