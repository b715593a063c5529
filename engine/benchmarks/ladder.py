"""The doctor's context ladder: the prompt of each rung and the rule that judges the rungs' acceptance.

Every rung asks for the same copy (numbered notes up to the rung's length, then one message to repeat word for
word), so acceptance compares like with like; a drop beyond 5 points fails only where it also exceeds the noise of
the two rates. Pure but for `ladder_prompt`, which needs the backend's chat encoding.
"""

from __future__ import annotations

import math
from typing import Any

from engine.events import DASH

LADDER_TOLERANCE_POINTS = 5.0
# A ladder drop must also exceed this many standard errors of the difference of the two rates to fail.
LADDER_Z = 2.0
# Fewer drafted tokens than this make an acceptance figure too noisy to judge a 5-point rule on.
MIN_DRAFTED_TO_JUDGE = 20
# The ladder's prompt: numbered notes up to the rung's length, then the same message to repeat at every rung, so
# acceptance compares like with like (a question about the notes drew 8-14 made-up tokens per rung: noise).
LADDER_MESSAGE = (
    "The ferry to Tarn Island leaves the north pier at seven, ten and four. Tickets are sold on board, dogs "
    "travel free, and bicycles must be left on the lower deck. In fog the ferry waits at the pier until the "
    "harbour master raises the green flag."
)
_COLOURS = ("red", "blue", "green", "yellow", "white", "black", "orange")
_ANIMALS = ("fox", "owl", "cat", "horse", "whale", "crow", "goat", "otter", "bee")
_CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Kyoto", "Quito", "Perth", "Turin", "Accra", "Hanoi", "Riga")


def ladder_verdict(rungs: list[dict[str, Any]]) -> tuple[str, str]:
    """(status, reason) for the context ladder: every judged rung within 5 points of the first judged one; a
    larger drop fails only where it also exceeds the noise of the two rates (LADDER_Z standard errors over their
    drafts), else warns. Measured: the old ladder's 9/30, 10/30, 3/24 accepted drafts (512, 2,048, 3,984 tokens)
    were an "18-point fall" within 22 points of noise."""
    judged = [
        r for r in rungs if r.get("acceptance") is not None and r.get("drafted", 0) >= MIN_DRAFTED_TO_JUDGE
    ]
    shown = ", ".join(
        f"{r['context']}: "
        + (DASH if r.get("acceptance") is None else f"{r['acceptance'] * 100:.0f}% of {r.get('drafted', 0)}")
        for r in rungs
    )
    if len(judged) < 2:
        if len(rungs) >= 2:
            return "warn", f"too few drafted tokens to compare the rungs ({shown})"
        return "pass", f"one rung only ({shown})"
    first = judged[0]
    unclear = None
    for rung in judged[1:]:
        drop = round((first["acceptance"] - rung["acceptance"]) * 100, 6)
        if drop <= LADDER_TOLERANCE_POINTS:
            continue
        variance = sum(r["acceptance"] * (1 - r["acceptance"]) / r["drafted"] for r in (first, rung))
        noise = LADDER_Z * 100 * math.sqrt(variance)
        if drop > noise:
            return "fail", (
                f"acceptance falls {drop:.0f} points from {first['context']} to {rung['context']} tokens of "
                f"context (more than {LADDER_TOLERANCE_POINTS:.0f}, and than the noise, {noise:.0f}): {shown}"
            )
        unclear = unclear or (drop, noise, rung)
    if unclear is not None:
        drop, noise, rung = unclear
        return "warn", (
            f"acceptance {drop:.0f} points lower at {rung['context']} than at {first['context']} tokens, within "
            f"the noise of so few drafts ({noise:.0f} points): {shown}"
        )
    return "pass", f"acceptance within {LADDER_TOLERANCE_POINTS:.0f} points across the ladder ({shown})"


def default_ladder(max_context: int) -> list[int]:
    rungs, size = [512], 2048
    while size < max_context:
        rungs.append(size)
        size *= 2
    if rungs[-1] != max_context and max_context > rungs[-1]:
        rungs.append(max_context)
    return [r for r in rungs if r <= max_context]


def ladder_prompt(backend, length: int) -> list[int]:
    """A chat prompt of about `length` tokens: numbered notes, then LADDER_MESSAGE and a request to repeat it."""

    def note(i: int) -> str:
        return (
            f"Note {i}: the {_COLOURS[i % len(_COLOURS)]} {_ANIMALS[i % len(_ANIMALS)]} lives in "
            f"{_CITIES[i % len(_CITIES)]} and was seen {i % 5 + 1} times."
        )

    request = f"\n\nHere is the message:\n\n{LADDER_MESSAGE}\n\nRepeat the message exactly, word for word."

    def encoded(count: int) -> list[int]:
        text = "\n".join(note(i) for i in range(1, count + 1)) + request
        return backend.encode_chat([{"role": "user", "content": text.lstrip()}])

    per_note = max(1.0, (len(encoded(20)) - len(encoded(0))) / 20)
    count = max(0, int((length - len(encoded(0))) / per_note))
    ids = encoded(count)
    while len(ids) > length and count > 0:
        count = max(0, count - max(1, int((len(ids) - length) / per_note)))
        ids = encoded(count)
    return ids
