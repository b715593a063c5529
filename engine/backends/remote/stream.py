"""A reply's stream from an OpenAI-compatible server, read defensively: the event stream (capped), each chunk's text,
reasoning and counters, an error body's message, a tokenizer's ids. Pure functions over bytes and JSON, whatever
kind of server sent them (engine.backends.remote.servers says what each kind is).

A count that is not a non-negative integer (a string, a bool, inf, 1e308) is treated as not reported, with a reason
the inspector shows beside "–"; nothing here raises on a server's data but `StreamLimitError`, where a line or an
event breaks its cap, so a server cannot make the client hold more than a few MiB per reply.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# The largest count taken from a server (2**53: a float counter is still exact there); past it, a count is
# a server's bug, not a reply's figure.
MAX_COUNT = 2**53
# An event-stream line, and one event's data, longer than these end the reply (real chunks are a few KiB).
MAX_EVENT_LINE = 1 << 20
MAX_EVENT_DATA = 4 << 20


def dig(data: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def count(value: Any) -> int | None:
    """A server's count as an int, or None where it is not one: bools, strings, negatives, NaN, inf and
    numbers past MAX_COUNT are not counts (JSON has no integer type, so 12.0 is 12)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value) if 0 <= value <= MAX_COUNT else None
    return None


def shown_value(value: Any, limit: int = 40) -> str:
    """A server's value for a one-line message: repr, whitespace collapsed, cut at `limit` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(slots=True)
class StreamCounters:
    """Cumulative counts a stream reported so far (None: never reported, or not a count).

    `problems` maps a MessageStats field to why the server's figure for it was not used (shown beside "–").
    """

    predicted: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    problems: dict[str, str] = field(default_factory=dict)

    def read(self, data: dict) -> None:
        """Fold one chunk's counters in: llama-server `timings`, OpenAI/vLLM `usage`, TabbyAPI draft fields."""
        timings = data.get("timings")
        if isinstance(timings, dict):
            self.predicted = _take(timings, "predicted_n", self.predicted)
            # llama-server leaves draft_n out until something was drafted (server_slot_stats::to_json).
            if "draft_n" in timings:
                self._drafts(timings, "draft_n", "draft_n_accepted", total=True)
            cache_n = count(timings.get("cache_n"))
            self.cached_tokens = cache_n if cache_n is not None else self.cached_tokens
            prompt_n = count(timings.get("prompt_n"))
            if prompt_n is not None and cache_n is not None:
                self.prompt_tokens = prompt_n + cache_n
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = _take(usage, "completion_tokens", self.completion_tokens)
            self.prompt_tokens = _take(usage, "prompt_tokens", self.prompt_tokens)
            cached = count(dig(usage, "prompt_tokens_details", "cached_tokens"))
            self.cached_tokens = cached if cached is not None else self.cached_tokens
        # TabbyAPI's backend puts draft_accept / draft_reject on its finish chunk (backends/exllamav3/model.py);
        # read them wherever a server forwards them (the chunk, its choice, or its usage).
        choice = dig(data, "choices", 0)
        choice = choice if isinstance(choice, dict) else {}
        for holder in (data, choice, usage if isinstance(usage, dict) else {}):
            if "draft_accept" in holder:
                self._drafts(holder, "draft_reject", "draft_accept", total=False)
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = " ".join(str(reason).split())[:40]

    def _drafts(self, holder: dict, drafted_key: str, accepted_key: str, *, total: bool) -> None:
        """Drafted and accepted counts, both or neither: `total` where `drafted_key` is the drafted count
        (llama-server's draft_n), else the rejected count (TabbyAPI's draft_reject)."""
        other = holder.get(drafted_key)
        if other is None and not total:
            other = 0  # TabbyAPI sends draft_reject null when nothing was rejected
        taken = holder.get(accepted_key)
        if taken is None and total:
            taken = 0  # llama-server: draft_n without draft_n_accepted accepted nothing
        first, accepted = count(other), count(taken)
        if first is None or accepted is None:
            bad, value = (drafted_key, other) if first is None else (accepted_key, taken)
            why = f"the server's {bad} ({shown_value(value)}) is not a count"
        else:
            drafted = first if total else first + accepted
            if accepted <= drafted:
                self.drafted, self.accepted = drafted, accepted
                for name in DRAFT_FIELDS:
                    self.problems.pop(name, None)
                return
            why = f"the server reported more accepted ({accepted}) than drafted ({drafted}) tokens"
        self.drafted = self.accepted = None
        for name in DRAFT_FIELDS:
            self.problems[name] = why

    @property
    def tokens(self) -> int | None:
        return self.predicted if self.predicted is not None else self.completion_tokens


# The MessageStats fields left empty ("–" and the reason) when a server's draft counts are not counts.
DRAFT_FIELDS = ("drafted_tokens", "acceptance_rate", "mean_accepted_length", "rounds", "alpha")


def _take(holder: dict, key: str, current: int | None) -> int | None:
    """holder[key] as a count; the current value where the key is absent or not a count."""
    value = count(holder.get(key))
    return current if value is None else value


def size(n: int) -> str:
    """A byte count for a message: 1 MiB, 64 KiB, 100 bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


class StreamLimitError(ValueError):
    """An event stream broke a cap (a line or an event too long): the message says which, in one line."""


_LINE_END = re.compile(rb"[\r\n]")


class EventStreamReader:
    """Server-sent events from a byte stream, each event's `data` lines joined by newlines.

    Written here instead of httpx-sse's reader because that one buffers a line without limit (a server that
    sends 50 MB without a newline held them all). A line past `max_line` bytes, or an event's data past
    `max_data`, raises StreamLimitError at once; the buffer never holds more than `max_line` bytes.
    Lines end at CRLF, LF or CR (the SSE spec); fields other than `data` are ignored; comments are skipped.
    """

    def __init__(self, max_line: int = MAX_EVENT_LINE, max_data: int = MAX_EVENT_DATA) -> None:
        self.max_line = max_line
        self.max_data = max_data
        self._line = bytearray()
        self._data: list[str] = []
        self._data_size = 0
        self._after_cr = False  # a chunk ended in CR: a LF opening the next one belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event that this chunk completes."""
        done: list[str] = []
        start, end = 0, len(chunk)
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        self._after_cr = False
        while start < end:
            match = _LINE_END.search(chunk, start)
            stop = match.start() if match else end
            if len(self._line) + stop - start > self.max_line:
                raise StreamLimitError(f"an event-stream line longer than {size(self.max_line)}")
            self._line += chunk[start:stop]
            if match is None:
                break
            self._end_line(done)
            start = stop + 1
            if chunk[stop] == 0x0D:  # CR: skip the LF of a CRLF, here or at the start of the next chunk
                if start < end and chunk[start] == 0x0A:
                    start += 1
                elif start == end:
                    self._after_cr = True
        return done

    def close(self) -> list[str]:
        """The last event where the stream ended without the blank line after it."""
        done: list[str] = []
        if self._line:
            self._end_line(done)
        self._end_line(done)
        return done

    def _end_line(self, done: list[str]) -> None:
        line = self._line.decode("utf-8", "replace")
        self._line.clear()
        if not line:
            if self._data:
                done.append("\n".join(self._data))
            self._data, self._data_size = [], 0
            return
        name, _, value = line.partition(":")
        if name != "data":
            return  # a comment (":" first), or a field this client does not use (event, id, retry)
        value = value[1:] if value.startswith(" ") else value
        self._data_size += len(value) + 1
        if self._data_size > self.max_data:
            raise StreamLimitError(f"an event of more than {size(self.max_data)}")
        self._data.append(value)


def chunk_text(data: dict) -> str:
    """The reply text a stream chunk adds (reasoning a server split off is put back inside <think> tags by
    the caller; here only `content`)."""
    delta = dig(data, "choices", 0, "delta")
    if not isinstance(delta, dict):
        return ""
    content = delta.get("content")
    return content if isinstance(content, str) else ""


def chunk_reasoning(data: dict) -> str:
    delta = dig(data, "choices", 0, "delta")
    if not isinstance(delta, dict):
        return ""
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str):
            return value
    return ""


def error_message(body: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}} or {"detail": ...})."""
    if isinstance(body, dict):
        for path in (("error", "message"), ("error",), ("detail",), ("message",)):
            value = dig(body, *path)
            if isinstance(value, str) and value.strip():
                return " ".join(value.split())[:200]
            if isinstance(value, list) and value:
                return " ".join(str(value[0]).split())[:200]
    return ""
