"""The remote engine's HTTP pieces that hold no connection: what a server's answer may be (capped, JSON or not),
the refusals raised before a request leaves (a redirect to another origin, an answer too large or too slow), a
reply's event stream read under its cap, an origin as a message may show it, and one line for why a request failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from engine.backends.remote.stream import EventStreamReader, StreamLimitError

# Caps on what a server can make this client hold: one probe/JSON answer or /metrics page, and one reply's
# whole event stream (a 4096-token reply with per-token timings is ~2 MiB).
MAX_ANSWER_BYTES = 8 << 20
MAX_STREAM_BYTES = 64 << 20
MAX_REDIRECTS = 5
DEFAULT_PORTS = {"http": 80, "https": 443}


class CrossOriginRedirect(httpx.RequestError):
    """A redirect to another origin: refused before the request (and its key) leaves."""


class AnswerTooLarge(httpx.RequestError):
    """An answer past MAX_ANSWER_BYTES, or slower than PROBE_DEADLINE_S."""


class NotJSON(ValueError):
    """A 200 answer whose body is not JSON."""


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    scheme = url.scheme.lower()
    return scheme, (url.host or "").lower(), url.port or DEFAULT_PORTS.get(scheme)


def shown_origin(url: httpx.URL) -> str:
    """scheme://host[:port] of a URL a server named, safe for a one-line message (no path, query or user)."""
    scheme, host, port = origin(url)
    text = f"{scheme}://{host}" + (f":{port}" if port != DEFAULT_PORTS.get(scheme) else "")
    text = "".join(c for c in text if c.isprintable() and not c.isspace())
    return text[:100]


def reason_of(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    for known in ("Connection refused", "Name or service not known", "No route to host"):
        if known.lower() in text.lower():
            return known.lower()
    if "peer closed connection" in text or "incomplete chunked read" in text:
        return "the connection closed before the reply was complete"
    return text[:120]


class Answer:
    """A non-streamed answer, its body already read (capped)."""

    def __init__(self, status_code: int, body: bytes, where: str) -> None:
        self.status_code = status_code
        self.body = body
        self.where = where

    @classmethod
    def capped(cls, response: httpx.Response, where: str) -> Answer:
        """The body of a streamed response (an error answer), read up to MAX_ANSWER_BYTES."""
        content = bytearray()
        for piece in response.iter_bytes():
            content += piece[: MAX_ANSWER_BYTES - len(content)]
            if len(content) >= MAX_ANSWER_BYTES:
                break
        return cls(response.status_code, bytes(content), where)

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):  # RecursionError: [[[[... nested past the parser's depth
            shown = " ".join(self.body[:40].decode("utf-8", "replace").split())
            raise NotJSON(
                f"the server at {self.where} answered {self.status_code} with a body that is not JSON "
                f"({shown!r}{'…' if len(self.body) > 40 else ''})"
            ) from None


def event_data(response: httpx.Response) -> Iterator[str]:
    """The data of each server-sent event, with every cap applied (EventStreamReader, MAX_STREAM_BYTES)."""
    reader = EventStreamReader()
    received = 0
    for piece in response.iter_bytes():
        received += len(piece)
        if received > MAX_STREAM_BYTES:
            raise StreamLimitError(f"more than {MAX_STREAM_BYTES >> 20} MiB")
        yield from reader.feed(piece)
    yield from reader.close()
