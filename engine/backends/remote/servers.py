"""What each kind of OpenAI-compatible server is, honours and reports: pure functions over its JSON and text.

No I/O here (the remote backend does the HTTP): the probe's answers go in, a `ServerProfile` comes out;
a stream chunk goes in, its counters come out; a `/metrics` page goes in, the speculation counters come out.
The shapes are llama.cpp's `llama-server` (tools/server), vLLM (OpenAI server + Prometheus), TabbyAPI.

Every field a server sends is read defensively: a count that is not a non-negative integer (a string, a bool,
inf, 1e308) is treated as not reported, with a reason the inspector shows beside "—"; nothing here raises on
a server's data. Lines, label values and events are capped (`EventStreamReader`, `spec_counters`), so a server
cannot make the client hold more memory than a few MiB per reply.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

ServerKind = Literal["llama-server", "vllm", "tabbyapi", "other"]

# The largest count taken from a server (2**53: a float counter is still exact there); past it, a count is
# a server's bug, not a reply's figure.
MAX_COUNT = 2**53
# Draft positions a /metrics page may name (K is at most a few dozen on every server); a label
# position="10000000" is ignored instead of growing a 10-million-entry tuple.
MAX_POSITIONS = 64
# A /metrics sample line longer than this is skipped (real ones are under 300 characters).
MAX_METRICS_LINE = 4096
# An event-stream line, and one event's data, longer than these end the reply (real chunks are a few KiB).
MAX_EVENT_LINE = 1 << 20
MAX_EVENT_DATA = 4 << 20

# Sampler fields beyond OpenAI's own (temperature, top_p, max_tokens, seed) that each server accepts,
# as (our SamplerSettings field, the server's request field).
EXTRA_SAMPLER_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "llama-server": (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repeat_penalty")),
    "vllm": (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty")),
    "tabbyapi": (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty")),
    "other": (),
}

# Prometheus counter names (without the `_total` suffix the exposition adds) per server kind:
# drafting rounds, drafted tokens, accepted tokens, accepted per position (label "position").
# llama-server: tools/server/server-task.cpp (metrics: "llamacpp:" prefix, counters end in _total already).
# vLLM: vllm/v1/spec_decode/metrics.py, class SpecDecodingProm (prometheus_client adds `_total`).
SPEC_COUNTERS: dict[str, tuple[str, str, str, str]] = {
    "llama-server": (
        "llamacpp:spec_decode_num_drafts_total",
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    ),
    "vllm": (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ),
}


@dataclass(frozen=True, slots=True)
class ServerProfile:
    """What the connect-time probe found."""

    kind: ServerKind
    model: str
    max_context: int | None
    # Whether the server drafts (None: cannot tell), and whether it takes K per request.
    speculating: bool | None
    k_per_request: bool
    metrics: bool  # a /metrics page with speculation counters this client can read
    tokenize: Literal["llama-server", "vllm", "estimate"]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def knobs(self) -> tuple[str, ...]:
        sent = ["temperature", "top_p", "max_tokens", "seed"]
        sent += [ours for ours, _ in EXTRA_SAMPLER_FIELDS[self.kind]]
        if self.k_per_request:
            sent.append("K")
        return tuple(sent)

    @property
    def statistics(self) -> str:
        if self.kind == "llama-server":
            return "draft counts from each reply's timings" + (
                ", rounds from /metrics" if self.metrics else " (/metrics off: start it with --metrics)"
            )
        if self.kind == "vllm":
            return "draft counts, rounds and per-position acceptance from /metrics"
        if self.kind == "tabbyapi":
            return "draft counts only where the finish chunk carries draft_accept / draft_reject"
        return "none (an unknown server reports no speculation)"

    def summary(self) -> str:
        k = "K per request" if self.k_per_request else "K fixed by the server"
        return f"{self.kind}: sends {', '.join(self.knobs)}; {k}; statistics: {self.statistics}"


def _dig(data: Any, *keys: Any) -> Any:
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


def first_model(models: Any) -> tuple[str | None, dict]:
    """The first entry of a /v1/models answer: (id, entry)."""
    entry = _dig(models, "data", 0)
    if not isinstance(entry, dict):
        return None, {}
    model_id = entry.get("id")
    return (str(model_id)[:200] if isinstance(model_id, (str, int)) and str(model_id) else None), entry


def detect_kind(serviceinfo: Any, props: Any, version: Any, models: Any) -> ServerKind:
    """The server kind from its probe answers (None where the endpoint answered nothing useful).

    TabbyAPI names itself in /.well-known/serviceinfo (endpoints/core/router.py) and also serves a /props
    (with only n_ctx), so it is checked first. llama-server's /props carries build_info and the default
    generation settings' params. vLLM answers /version and lists its models as owned_by "vllm".
    """
    if _dig(serviceinfo, "software", "name") == "TabbyAPI":
        return "tabbyapi"
    if isinstance(props, dict) and (
        "build_info" in props or _dig(props, "default_generation_settings", "params")
    ):
        return "llama-server"
    _, entry = first_model(models)
    if entry.get("owned_by") == "vllm" or (
        isinstance(version, dict) and "version" in version and entry.get("max_model_len")
    ):
        return "vllm"
    return "other"


def build_profile(
    kind: ServerKind,
    *,
    models: Any,
    props: Any = None,
    slots: Any = None,
    tabby_model: Any = None,
    metrics_text: str | None = None,
    model_override: str | None = None,
) -> ServerProfile:
    """Everything the client needs to know about a server, from its probe answers."""
    model_id, entry = first_model(models)
    model = model_override or model_id or "remote model"
    notes: list[str] = []
    if kind == "llama-server":
        params = _dig(props, "default_generation_settings", "params")
        params = params if isinstance(params, dict) else {}
        n_ctx = _context(
            _dig(props, "default_generation_settings", "n_ctx") or _dig(slots, 0, "n_ctx"), "n_ctx", notes
        )
        speculating = _dig(slots, 0, "speculative")
        # Per-request K: llama-server takes speculative.n_max/n_min only in versions that list them among the
        # request params (tools/server/server-schema.cpp has them under `#if 0` in the versions that do not).
        k_per_request = "speculative.n_max" in params
        if speculating is None:
            notes.append("cannot tell whether the server drafts (/slots is off)")
        if metrics_text is None:
            notes.append("/metrics is off: start llama-server with --metrics for rounds and α")
        alias = props.get("model_alias") if isinstance(props, dict) else None
        return ServerProfile(
            kind,
            model if model_override or model_id or not isinstance(alias, str) or not alias else alias[:200],
            n_ctx,
            bool(speculating) if speculating is not None else None,
            k_per_request,
            metrics_text is not None,
            "llama-server",
            tuple(notes),
        )
    if kind == "vllm":
        counters = spec_counters("vllm", metrics_text) if metrics_text is not None else None
        speculating = counters is not None
        if metrics_text is None:
            notes.append("/metrics unreadable: no speculation statistics")
        max_len = _context(entry.get("max_model_len"), "max_model_len", notes)
        return ServerProfile(
            kind, model, max_len, speculating, False, metrics_text is not None, "vllm", tuple(notes),
        )  # fmt: skip
    if kind == "tabbyapi":
        params = _dig(tabby_model, "parameters")
        params = params if isinstance(params, dict) else {}
        max_len = _context(params.get("max_seq_len"), "max_seq_len", notes)
        speculating = bool(params.get("draft")) if "draft" in params else None
        # TabbyAPI on exllamav3 drafts by a draft model, the model's MTP head or n-gram ("model" | "mtp" | "ngram");
        # where /v1/model reports its draft_mode (in parameters, or in the draft card), say which.
        draft_mode = params.get("draft_mode") or _dig(params, "draft", "draft_mode")
        if isinstance(draft_mode, str) and draft_mode.strip():
            draft_mode = draft_mode.strip()[:40]
            notes.append(f"TabbyAPI draft mode: {draft_mode}")
            speculating = draft_mode.lower() not in ("none", "off", "false")
        notes.append("prompt length estimated (TabbyAPI's tokenizer endpoint is not used)")
        tabby_id = _dig(tabby_model, "id")
        return ServerProfile(
            kind, model_override or (tabby_id[:200] if isinstance(tabby_id, str) and tabby_id else model),
            max_len, speculating, False, False, "estimate", tuple(notes),
        )  # fmt: skip
    notes.append("prompt length estimated (no tokenizer endpoint known)")
    return ServerProfile(kind, model, None, None, False, False, "estimate", tuple(notes))


def _context(value: Any, name: str, notes: list[str]) -> int | None:
    """A context length from the probe, or None (with a note) where the server's value is not a count."""
    if value is None:
        return None
    length = count(value)
    if not length:
        notes.append(f"the server's {name} ({shown_value(value)}) is not a token count: ignored")
        return None
    return length


# --------------------------------------------------------------------------------------- /metrics pages

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class SpecCounters:
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...] = ()

    def minus(self, before: SpecCounters) -> SpecCounters | None:
        """The counts between two readings; None when a counter went back (the server restarted) or the
        difference is not a plausible count (accepted more than drafted, past MAX_COUNT)."""
        delta = SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(
                a - (before.per_position[i] if i < len(before.per_position) else 0.0)
                for i, a in enumerate(self.per_position)
            ),
        )
        figures = (delta.drafts, delta.draft_tokens, delta.accepted, *delta.per_position)
        if not all(0 <= x <= MAX_COUNT for x in figures) or delta.accepted > delta.draft_tokens:
            return None  # also NaN: every comparison with it is False
        return delta


def spec_counters(kind: str, text: str | None) -> SpecCounters | None:
    """The speculation counters on a Prometheus text page (summed over engines/models), or None if absent
    or unusable (`read_spec_counters` says why)."""
    return read_spec_counters(kind, text)[0]


def read_spec_counters(kind: str, text: str | None) -> tuple[SpecCounters | None, str]:
    """(the counters, "") or (None, why not). Values that are not finite, and sums that overflow to inf,
    make the page unusable rather than a figure; position labels past MAX_POSITIONS and sample lines longer
    than MAX_METRICS_LINE are skipped."""
    names = SPEC_COUNTERS.get(kind)
    if names is None or not text:
        return None, "the server has no /metrics page"
    drafts_name, tokens_name, accepted_name, per_pos_name = names
    sums = {drafts_name: 0.0, tokens_name: 0.0, accepted_name: 0.0}
    seen = False
    not_finite = ""
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or len(line) > MAX_METRICS_LINE:
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if name not in sums and name != per_pos_name:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isfinite(number) or number < 0:
            not_finite = not_finite or f"{name} {shown_value(value)}"
            continue
        if name in sums:
            sums[name] += number
            seen = True
        else:
            position = dict(_LABEL.findall(labels or "")).get("position")
            if position is not None and position.isdigit() and int(position) < MAX_POSITIONS:
                per_pos[int(position)] = per_pos.get(int(position), 0.0) + number
    if not seen:
        if not_finite:
            return None, f"the server's /metrics counters are not usable numbers ({not_finite})"
        return None, "the server's /metrics page has no speculation counters"
    totals = (*sums.values(), *per_pos.values())
    if not_finite or not all(x <= MAX_COUNT for x in totals):  # 1e308 + 1e308 is inf
        why = not_finite or "they add up past 2^53 (or to inf)"
        return None, f"the server's /metrics counters are not usable numbers ({why})"
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(sums[drafts_name], sums[tokens_name], sums[accepted_name], positions), ""


# ------------------------------------------------------------------------------------------ stream chunks


@dataclass(slots=True)
class StreamCounters:
    """Cumulative counts a stream reported so far (None: never reported, or not a count).

    `problems` maps a MessageStats field to why the server's figure for it was not used (shown beside "—").
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
            cached = count(_dig(usage, "prompt_tokens_details", "cached_tokens"))
            self.cached_tokens = cached if cached is not None else self.cached_tokens
        # TabbyAPI's backend puts draft_accept / draft_reject on its finish chunk (backends/exllamav3/model.py);
        # read them wherever a server forwards them (the chunk, its choice, or its usage).
        choice = _dig(data, "choices", 0)
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


# The MessageStats fields left empty ("—" and the reason) when a server's draft counts are not counts.
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
    delta = _dig(data, "choices", 0, "delta")
    if not isinstance(delta, dict):
        return ""
    content = delta.get("content")
    return content if isinstance(content, str) else ""


def chunk_reasoning(data: dict) -> str:
    delta = _dig(data, "choices", 0, "delta")
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
            value = _dig(body, *path)
            if isinstance(value, str) and value.strip():
                return " ".join(value.split())[:200]
            if isinstance(value, list) and value:
                return " ".join(str(value[0]).split())[:200]
    return ""


def token_ids(tokens: Any) -> list[int] | None:
    """A tokenizer's answer as token ids, or None where it is not a list of counts."""
    if not isinstance(tokens, list):
        return None
    ids = [count(t) for t in tokens]
    return None if any(t is None for t in ids) else ids  # type: ignore[misc]
