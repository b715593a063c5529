"""Thinking replies: the reasoning a model writes before its answer, between `<think>` and `</think>`.

Models such as Qwen3 or DeepSeek-R1 open their reply with `<think>`; templates that put `<think>` in the prompt
already leave only the closing `</think>` in the reply. `split_reasoning` finds either shape in a reply (complete or
still streaming) so the UI can fold the reasoning and the stats can count its tokens apart. Pure functions only.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    thinking: str  # the reasoning, without the tags ("" when the reply has none)
    answer: str  # what follows it (the whole reply when there is no reasoning)
    answer_start: int  # index in the reply where `answer` begins
    has_thinking: bool
    closed: bool  # the reasoning has ended (always True without reasoning)
    undecided: bool = False  # the reply so far is a prefix of "<think>": wait for more text
    thinking_start: int = 0  # index in the reply where `thinking` begins


def split_reasoning(text: str) -> ReasoningSplit:
    stripped = text.lstrip()
    lead = len(text) - len(stripped)
    if stripped and len(stripped) < len(OPEN) and OPEN.startswith(stripped):
        return ReasoningSplit("", "", len(text), False, False, undecided=True)
    if stripped.startswith(OPEN):
        body_start = lead + len(OPEN)
        end = text.find(CLOSE, body_start)
        if end < 0:
            # Still thinking; hold back a partial closing tag at the end.
            body = text[body_start:]
            for cut in range(len(CLOSE) - 1, 0, -1):
                if body.endswith(CLOSE[:cut]):
                    body = body[:-cut]
                    break
            start = _skip_space(text, body_start)
            return ReasoningSplit(body.strip(), "", len(text), True, False, thinking_start=start)
        answer_start = end + len(CLOSE)
        return ReasoningSplit(
            text[body_start:end].strip(),
            text[answer_start:].lstrip(),
            _skip_space(text, answer_start),
            True,
            True,
            thinking_start=_skip_space(text, body_start),
        )
    end = text.find(CLOSE)
    if end >= 0:  # the template opened the reasoning in the prompt
        answer_start = end + len(CLOSE)
        return ReasoningSplit(
            text[:end].strip(),
            text[answer_start:].lstrip(),
            _skip_space(text, answer_start),
            True,
            True,
            thinking_start=_skip_space(text, 0),
        )
    return ReasoningSplit("", text, 0, False, True)


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def thinking_end(text: str) -> int:
    """Characters of a finished reply that belong to its reasoning (tags included); 0 without reasoning."""
    split = split_reasoning(text)
    if not split.has_thinking:
        return 0
    return split.answer_start if split.closed else len(text)
