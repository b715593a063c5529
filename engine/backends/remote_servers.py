"""What each kind of OpenAI-compatible server is, honours and reports: pure functions over its JSON and text.

No I/O here (the remote backend does the HTTP): the probe's answers go in, a `ServerProfile` comes out;
a stream chunk goes in, its counters come out; a `/metrics` page goes in, the speculation counters come out.
The shapes are llama.cpp's `llama-server` (tools/server), vLLM (OpenAI server + Prometheus), TabbyAPI.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

ServerKind = Literal["llama-server", "vllm", "tabbyapi", "other"]

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0")

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


def normalize_endpoint(url: str) -> str:
    """The server's base URL (no trailing slash, no trailing /v1); ValueError with a one-line reason."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint {url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8080)")
    if parts.username or parts.password:
        raise ValueError(
            "endpoint must not carry a user or password: put the API key in an environment variable "
            "and pass --api-key-env VAR"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"endpoint {url!r} must be a base URL without ?query or #fragment")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def insecure_warning(url: str) -> str | None:
    """A warning for plain http:// to a host other than this machine (the API key and chat go in clear)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "http" and host not in LOCAL_HOSTS and not host.startswith("127."):
        return f"warning: {host} is not this machine and the endpoint is plain http: the chat and API key travel unencrypted"
    return None


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


def first_model(models: Any) -> tuple[str | None, dict]:
    """The first entry of a /v1/models answer: (id, entry)."""
    entry = _dig(models, "data", 0)
    if not isinstance(entry, dict):
        return None, {}
    return (str(entry["id"]) if entry.get("id") is not None else None), entry


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
        params = _dig(props, "default_generation_settings", "params") or {}
        n_ctx = _dig(props, "default_generation_settings", "n_ctx") or _dig(slots, 0, "n_ctx")
        speculating = _dig(slots, 0, "speculative")
        # Per-request K: llama-server takes speculative.n_max/n_min only in versions that list them among the
        # request params (tools/server/server-schema.cpp has them under `#if 0` in the versions that do not).
        k_per_request = "speculative.n_max" in params
        if speculating is None:
            notes.append("cannot tell whether the server drafts (/slots is off)")
        if metrics_text is None:
            notes.append("/metrics is off: start llama-server with --metrics for rounds and α")
        return ServerProfile(
            kind,
            model if model_override or model_id else str(props.get("model_alias") or model),
            int(n_ctx) if n_ctx else None,
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
        max_len = entry.get("max_model_len")
        return ServerProfile(
            kind, model, int(max_len) if max_len else None, speculating, False,
            metrics_text is not None, "vllm", tuple(notes),
        )  # fmt: skip
    if kind == "tabbyapi":
        params = _dig(tabby_model, "parameters") or {}
        max_len = params.get("max_seq_len")
        speculating = bool(params.get("draft")) if "draft" in params else None
        notes.append("prompt length estimated (TabbyAPI's tokenizer endpoint is not used)")
        return ServerProfile(
            kind, model_override or _dig(tabby_model, "id") or model, int(max_len) if max_len else None,
            speculating, False, False, "estimate", tuple(notes),
        )  # fmt: skip
    notes.append("prompt length estimated (no tokenizer endpoint known)")
    return ServerProfile(kind, model, None, None, False, False, "estimate", tuple(notes))


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
        """The counts between two readings; None when a counter went back (the server restarted)."""
        delta = SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(
                a - (before.per_position[i] if i < len(before.per_position) else 0.0)
                for i, a in enumerate(self.per_position)
            ),
        )
        if min(delta.drafts, delta.draft_tokens, delta.accepted, *delta.per_position, 0.0) < 0:
            return None
        return delta


def spec_counters(kind: str, text: str | None) -> SpecCounters | None:
    """The speculation counters on a Prometheus text page (summed over engines/models), or None if absent."""
    names = SPEC_COUNTERS.get(kind)
    if names is None or not text:
        return None
    drafts_name, tokens_name, accepted_name, per_pos_name = names
    sums = {drafts_name: 0.0, tokens_name: 0.0, accepted_name: 0.0}
    seen = False
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isfinite(number):
            continue
        if name in sums:
            sums[name] += number
            seen = True
        elif name == per_pos_name:
            position = dict(_LABEL.findall(labels or "")).get("position")
            if position is not None and position.isdigit():
                per_pos[int(position)] = per_pos.get(int(position), 0.0) + number
    if not seen:
        return None
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(sums[drafts_name], sums[tokens_name], sums[accepted_name], positions)


# ------------------------------------------------------------------------------------------ stream chunks


@dataclass(slots=True)
class StreamCounters:
    """Cumulative counts a stream reported so far (None: never reported)."""

    predicted: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None

    def read(self, data: dict) -> None:
        """Fold one chunk's counters in: llama-server `timings`, OpenAI/vLLM `usage`, TabbyAPI draft fields."""
        timings = data.get("timings")
        if isinstance(timings, dict):
            if isinstance(timings.get("predicted_n"), int):
                self.predicted = timings["predicted_n"]
            # llama-server leaves draft_n out until something was drafted (server_slot_stats::to_json).
            if isinstance(timings.get("draft_n"), int):
                self.drafted = timings["draft_n"]
                self.accepted = int(timings.get("draft_n_accepted") or 0)
            if isinstance(timings.get("cache_n"), int):
                self.cached_tokens = timings["cache_n"]
            if isinstance(timings.get("prompt_n"), int) and isinstance(timings.get("cache_n"), int):
                self.prompt_tokens = timings["prompt_n"] + timings["cache_n"]
        usage = data.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            cached = _dig(usage, "prompt_tokens_details", "cached_tokens")
            if isinstance(cached, int):
                self.cached_tokens = cached
        # TabbyAPI's backend puts draft_accept / draft_reject on its finish chunk (backends/exllamav3/model.py);
        # read them wherever a server forwards them (the chunk, its choice, or its usage).
        choice = _dig(data, "choices", 0) or {}
        for holder in (data, choice, usage or {}):
            if isinstance(holder, dict) and isinstance(holder.get("draft_accept"), int):
                self.accepted = holder["draft_accept"]
                self.drafted = holder["draft_accept"] + int(holder.get("draft_reject") or 0)
        if isinstance(choice, dict) and choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    @property
    def tokens(self) -> int | None:
        return self.predicted if self.predicted is not None else self.completion_tokens


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
