"""What ends a reply besides a stop token: stop strings in its text, and the repetition guard.

Both are decided token by token (the round loop asks them about every token a round takes), so plain and
speculative decoding stop at the same token.
"""

from __future__ import annotations

from collections.abc import Sequence

# The repetition guard: a reply whose last tokens repeat one span of at most MAX_PERIOD tokens, over at least
# max(MIN_REPEATED_TOKENS, REPEATS * period) tokens after the span's first copy, is stopped there. Small models
# fall into such loops ("la femme au roi, la femme au roi, ...") and, with n-gram drafting accepting nearly every
# draft, would otherwise run fast to max_new_tokens and feed the loop back as context.
MAX_PERIOD = 64
MIN_REPEATED_TOKENS = 96
REPEATS = 3
REPETITION_NOTE = "stopped: the reply kept repeating the same {period}-token span"


class RepetitionGuard:
    """Notices a reply stuck in a loop: the same span of p tokens repeated, token by token.

    For every period p <= MAX_PERIOD it keeps how many tokens in a row have equalled the token p places back;
    the reply is looping when that run reaches max(MIN_REPEATED_TOKENS, REPEATS * p). Decided per token, so
    plain and speculative decoding stop at the same token.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.runs = [0] * (MAX_PERIOD + 1)

    def push(self, token: int) -> int | None:
        """Add a token; the period of the loop it completes, if any."""
        tokens = self.tokens
        tokens.append(token)
        n = len(tokens)
        found = None
        for p in range(1, min(MAX_PERIOD, n - 1) + 1):
            if tokens[n - 1 - p] == token:
                self.runs[p] += 1
                if found is None and self.runs[p] >= max(MIN_REPEATED_TOKENS, REPEATS * p):
                    found = p
            else:
                self.runs[p] = 0
        return found


class StopStringWatch:
    """Finds stop strings in the reply text as it grows, and holds back a tail that could begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.sent = 0  # characters released to the user

    def add(self, delta: str) -> int | None:
        """Append `delta`; the position where a stop string begins, if one is now complete."""
        start = max(0, len(self.text) - self.longest)
        self.text += delta
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def release(self, final: bool, end: int | None = None) -> str:
        """The text that can go out now: all of it up to `end` when final, else all but a tail that is the
        start of some stop string."""
        limit = len(self.text) if end is None else end
        if not final and self.stops:
            for keep in range(min(self.longest - 1, limit - self.sent), 0, -1):
                tail = self.text[limit - keep : limit]
                if any(s.startswith(tail) for s in self.stops):
                    limit -= keep
                    break
        out = self.text[self.sent : limit] if limit > self.sent else ""
        self.sent = max(self.sent, limit)
        return out
