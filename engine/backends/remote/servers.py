"""What each kind of OpenAI-compatible server is, honours and reports: one object per kind behind one interface.

A kind (`Server`; `LlamaServer`, `Vllm`, `TabbyApi`, and the base for a server this client does not know) says how
the connect-time probe recognises it and what more the probe asks it, what its profile holds, which sampler fields
and request fields it takes, how it tokenizes a prompt and where a reply's speculation figures come from. The
shapes are llama.cpp's `llama-server` (tools/server), vLLM (OpenAI server + Prometheus), TabbyAPI.

No I/O here (the remote backend does the HTTP and hands a kind what it needs): the probe's answers go in, a
`ServerProfile` comes out; a `/metrics` page goes in, the speculation counters come out; a reply's stream counters
(engine.backends.remote.stream) go in, its draft figures come out. Every field a server sends is read
defensively: nothing here raises on a server's data, and lines and label values are capped (`spec_counters`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from engine.backends.remote.stream import MAX_COUNT, StreamCounters, count, dig, shown_value

ServerKind = Literal["llama-server", "vllm", "tabbyapi", "other"]

# Draft positions a /metrics page may name (K is at most a few dozen on every server); a label
# position="10000000" is ignored instead of growing a 10-million-entry tuple.
MAX_POSITIONS = 64
# A /metrics sample line longer than this is skipped (real ones are under 300 characters).
MAX_METRICS_LINE = 4096


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
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def server(self) -> Server:
        return server(self.kind)

    @property
    def knobs(self) -> tuple[str, ...]:
        sent = ["temperature", "top_p", "max_tokens", "seed"]
        sent += [ours for ours, _ in self.server.sampler_fields]
        if self.k_per_request:
            sent.append("K")
        return tuple(sent)

    @property
    def statistics(self) -> str:
        return self.server.statistics(self)

    def summary(self) -> str:
        k = "K per request" if self.k_per_request else "K fixed by the server"
        return f"{self.kind}: sends {', '.join(self.knobs)}; {k}; statistics: {self.statistics}"


@dataclass(frozen=True, slots=True)
class Probe:
    """The probe's answers (None where a path answered nothing usable) and the model asked for."""

    models: Any = None
    props: Any = None
    version: Any = None
    serviceinfo: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # the kind's own `probe_paths`' answers, by name
    metrics_text: str | None = None
    model_override: str | None = None


@dataclass(frozen=True, slots=True)
class ReplyDrafts:
    """A reply's speculation figures as a server reported them (None: not reported; `unavailable` says why)."""

    drafted: int | None = None
    accepted: int | None = None
    rounds: int | None = None
    position_drafted: tuple[int, ...] | None = None
    position_accepted: tuple[int, ...] | None = None
    unavailable: tuple[tuple[str, str], ...] = ()


Post = Callable[[str, dict], dict]  # the backend's POST of a JSON body to a path, answering a JSON object


class Server:
    """A kind of server; this base is one this client does not know ("other"): OpenAI's fields only, the prompt's
    length estimated, no speculation figures."""

    name: ClassVar[ServerKind] = "other"
    # Sampler fields beyond OpenAI's own (temperature, top_p, max_tokens, seed) that it accepts,
    # as (our SamplerSettings field, the server's request field).
    sampler_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Prometheus counter names on its /metrics page (without the `_total` suffix the exposition adds): drafting
    # rounds, drafted tokens, accepted tokens, accepted per position (label "position"); () no such page.
    counters: ClassVar[tuple[str, ...]] = ()
    # What the probe also asks a server of this kind: {name in Probe.extra: path}.
    probe_paths: ClassVar[dict[str, str]] = {}
    # Its /metrics counters are a reply's only draft figures: read them while the reply streams.
    polls_metrics: ClassVar[bool] = False
    no_statistics = "none (an unknown server reports no speculation)"

    def recognises(self, probe: Probe) -> bool:
        return True

    def profile(self, probe: Probe) -> ServerProfile:
        notes = ["prompt length estimated (no tokenizer endpoint known)"]
        return ServerProfile(self.name, _model(probe), None, None, False, False, tuple(notes))

    def statistics(self, profile: ServerProfile) -> str:
        return self.no_statistics

    def request_fields(self, body: dict[str, Any], profile: ServerProfile, k: int) -> None:
        """Add what this kind takes beyond OpenAI's fields and the sampler's (`k`: the reply's draft length)."""

    def tokenize(
        self, post: Post, profile: ServerProfile, messages: list[dict[str, str]]
    ) -> list[int] | None:
        """The prompt's token ids where the server tokenizes; None: the caller estimates the length."""
        return None

    def no_drafts(self, metrics_why: str) -> str:
        """Why a reply has no draft counts."""
        return "this server reports no speculation statistics"

    def drafts(
        self, profile: ServerProfile, counters: StreamCounters, delta: SpecCounters | None, metrics_why: str
    ) -> ReplyDrafts:
        """A reply's figures from its stream's counters and its /metrics difference (`delta`, None: none)."""
        if counters.drafted is None and "drafted_tokens" not in counters.problems:
            why = self.no_drafts(metrics_why)
            return ReplyDrafts(unavailable=(("drafted_tokens", why), ("acceptance_rate", why)))
        return ReplyDrafts(counters.drafted, counters.accepted)


class LlamaServer(Server):
    """llama.cpp's llama-server: /props and /slots, draft counts in each chunk's timings, rounds on /metrics."""

    name = "llama-server"
    sampler_fields = (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repeat_penalty"))
    # tools/server/server-task.cpp (metrics: "llamacpp:" prefix, counters end in _total already).
    counters = (
        "llamacpp:spec_decode_num_drafts_total",
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    )
    probe_paths = {"slots": "/slots"}

    def recognises(self, probe: Probe) -> bool:
        props = probe.props
        return isinstance(props, dict) and bool(
            "build_info" in props or dig(props, "default_generation_settings", "params")
        )

    def profile(self, probe: Probe) -> ServerProfile:
        notes: list[str] = []
        props, slots = probe.props, probe.extra.get("slots")
        params = dig(props, "default_generation_settings", "params")
        params = params if isinstance(params, dict) else {}
        n_ctx = _context(
            dig(props, "default_generation_settings", "n_ctx") or dig(slots, 0, "n_ctx"), "n_ctx", notes
        )
        speculating = dig(slots, 0, "speculative")
        # Per-request K: llama-server takes speculative.n_max/n_min only in versions that list them among the
        # request params (tools/server/server-schema.cpp has them under `#if 0` in the versions that do not).
        k_per_request = "speculative.n_max" in params
        if speculating is None:
            notes.append("cannot tell whether the server drafts (/slots is off)")
        if probe.metrics_text is None:
            notes.append("/metrics is off: start llama-server with --metrics for rounds and α")
        alias = props.get("model_alias") if isinstance(props, dict) else None
        named = probe.model_override or first_model(probe.models)[0]
        model = _model(probe) if named or not isinstance(alias, str) or not alias else alias[:200]
        return ServerProfile(
            self.name, model, n_ctx, bool(speculating) if speculating is not None else None, k_per_request,
            probe.metrics_text is not None, tuple(notes),
        )  # fmt: skip

    def statistics(self, profile: ServerProfile) -> str:
        return "draft counts from each reply's timings" + (
            ", rounds from /metrics" if profile.metrics else " (/metrics off: start it with --metrics)"
        )

    def request_fields(self, body: dict[str, Any], profile: ServerProfile, k: int) -> None:
        body["timings_per_token"] = True  # live draft counts in every chunk
        if profile.k_per_request:
            body["speculative.n_max"] = k
            body["speculative.n_min"] = 0

    def tokenize(
        self, post: Post, profile: ServerProfile, messages: list[dict[str, str]]
    ) -> list[int] | None:
        prompt = post("/apply-template", {"messages": messages}).get("prompt")
        if not isinstance(prompt, str):
            return None
        body = {"content": prompt, "add_special": True, "parse_special": True}
        return token_ids(post("/tokenize", body).get("tokens"))

    def drafts(
        self, profile: ServerProfile, counters: StreamCounters, delta: SpecCounters | None, metrics_why: str
    ) -> ReplyDrafts:
        unavailable: list[tuple[str, str]] = []
        drafted, accepted, rounds = counters.drafted, counters.accepted, None
        if drafted is None and "drafted_tokens" in counters.problems:
            pass  # the server sent draft counts that are not counts: "–" with the reason, not a 0
        elif drafted is None and counters.predicted is not None:
            # Its timings leave draft_n out when nothing was drafted (server_slot_stats::to_json): a real 0.
            drafted, accepted = 0, 0
        elif drafted is None:
            drafted, accepted = 0, 0
            unavailable.append(("drafted_tokens", "the server sent no timings for this reply"))
        if delta is not None and drafted is not None and count(delta.draft_tokens) == drafted:
            rounds = count(delta.drafts)
        elif profile.metrics:
            why = metrics_why or "/metrics counters did not match this reply (another client?)"
            unavailable.append(("alpha", why))
        unavailable.append(
            ("per_position_acceptance", "llama-server counts accepted drafts per position, but not drafts per position")
        )  # fmt: skip
        return ReplyDrafts(drafted, accepted, rounds, unavailable=tuple(unavailable))


class Vllm(Server):
    """vLLM: /version, models owned_by "vllm", every speculation figure on /metrics (polled while a reply streams)."""

    name = "vllm"
    sampler_fields = (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty"))
    # vllm/v1/spec_decode/metrics.py, class SpecDecodingProm (prometheus_client adds `_total`).
    counters = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    )
    polls_metrics = True

    def recognises(self, probe: Probe) -> bool:
        _, entry = first_model(probe.models)
        version = probe.version
        return entry.get("owned_by") == "vllm" or bool(
            isinstance(version, dict) and "version" in version and entry.get("max_model_len")
        )

    def profile(self, probe: Probe) -> ServerProfile:
        notes: list[str] = []
        text = probe.metrics_text
        speculating = (spec_counters(self.name, text) if text is not None else None) is not None
        if text is None:
            notes.append("/metrics unreadable: no speculation statistics")
        max_len = _context(first_model(probe.models)[1].get("max_model_len"), "max_model_len", notes)
        return ServerProfile(
            self.name, _model(probe), max_len, speculating, False, text is not None, tuple(notes)
        )

    def statistics(self, profile: ServerProfile) -> str:
        return "draft counts, rounds and per-position acceptance from /metrics"

    def request_fields(self, body: dict[str, Any], profile: ServerProfile, k: int) -> None:
        body["stream_options"]["continuous_usage_stats"] = True

    def tokenize(
        self, post: Post, profile: ServerProfile, messages: list[dict[str, str]]
    ) -> list[int] | None:
        body = {"model": profile.model, "messages": messages, "add_generation_prompt": True}
        return token_ids(post("/tokenize", body).get("tokens"))

    def no_drafts(self, metrics_why: str) -> str:
        if metrics_why:
            return f"{metrics_why} (vLLM reports drafts only there)"
        return "vLLM's /metrics had no speculation counters (is --speculative-config set?)"

    def drafts(
        self, profile: ServerProfile, counters: StreamCounters, delta: SpecCounters | None, metrics_why: str
    ) -> ReplyDrafts:
        if delta is None:
            return super().drafts(profile, counters, delta, metrics_why)
        position_drafted = position_accepted = None
        if delta.per_position and delta.drafts:
            # vLLM drafts a fixed K every round, so every round's draft reaches every position.
            position_drafted = tuple(int(delta.drafts) for _ in delta.per_position)
            position_accepted = tuple(int(a) for a in delta.per_position)
        return ReplyDrafts(
            count(delta.draft_tokens),
            count(delta.accepted),
            count(delta.drafts),
            position_drafted,
            position_accepted,
        )


class TabbyApi(Server):
    """TabbyAPI: names itself in /.well-known/serviceinfo; /v1/model says its draft; draft counts only where its
    finish chunk carries them."""

    name = "tabbyapi"
    sampler_fields = (("top_k", "top_k"), ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty"))
    probe_paths = {"tabby_model": "/v1/model"}

    def recognises(self, probe: Probe) -> bool:
        return dig(probe.serviceinfo, "software", "name") == "TabbyAPI"

    def profile(self, probe: Probe) -> ServerProfile:
        notes: list[str] = []
        tabby_model = probe.extra.get("tabby_model")
        params = dig(tabby_model, "parameters")
        params = params if isinstance(params, dict) else {}
        max_len = _context(params.get("max_seq_len"), "max_seq_len", notes)
        speculating = bool(params.get("draft")) if "draft" in params else None
        # TabbyAPI on exllamav3 drafts by a draft model, the model's MTP head or n-gram ("model" | "mtp" | "ngram");
        # where /v1/model reports its draft_mode (in parameters, or in the draft card), say which.
        draft_mode = params.get("draft_mode") or dig(params, "draft", "draft_mode")
        if isinstance(draft_mode, str) and draft_mode.strip():
            draft_mode = draft_mode.strip()[:40]
            notes.append(f"TabbyAPI draft mode: {draft_mode}")
            speculating = draft_mode.lower() not in ("none", "off", "false")
        notes.append("prompt length estimated (TabbyAPI's tokenizer endpoint is not used)")
        tabby_id = dig(tabby_model, "id")
        model = probe.model_override or (
            tabby_id[:200] if isinstance(tabby_id, str) and tabby_id else _model(probe)
        )
        return ServerProfile(self.name, model, max_len, speculating, False, False, tuple(notes))

    def statistics(self, profile: ServerProfile) -> str:
        return "draft counts only where the finish chunk carries draft_accept / draft_reject"

    def no_drafts(self, metrics_why: str) -> str:
        return "TabbyAPI logs draft_accept / draft_reject but does not send them to clients"


OTHER = Server()
# In the order the probe asks them: TabbyAPI first, since it also serves a /props (with only n_ctx).
SERVERS: tuple[Server, ...] = (TabbyApi(), LlamaServer(), Vllm())


def server(kind: str) -> Server:
    """The kind named `kind`; the unknown server's where none is."""
    return next((known for known in SERVERS if known.name == kind), OTHER)


def detect(probe: Probe) -> Server:
    """The kind of server that gave the probe's answers (TabbyAPI names itself in /.well-known/serviceinfo,
    endpoints/core/router.py; llama-server's /props carries build_info and the default generation settings'
    params; vLLM answers /version and lists its models as owned_by "vllm")."""
    return next((known for known in SERVERS if known.recognises(probe)), OTHER)


def detect_kind(serviceinfo: Any, props: Any, version: Any, models: Any) -> ServerKind:
    """The name of the server's kind from its probe answers ("other" where none recognises them)."""
    return detect(Probe(models=models, props=props, version=version, serviceinfo=serviceinfo)).name


def build_profile(
    kind: str,
    *,
    models: Any,
    props: Any = None,
    slots: Any = None,
    tabby_model: Any = None,
    metrics_text: str | None = None,
    model_override: str | None = None,
) -> ServerProfile:
    """Everything the client needs to know about a server of `kind`, from its probe answers."""
    extra = {"slots": slots, "tabby_model": tabby_model}
    probe = Probe(models, props, extra=extra, metrics_text=metrics_text, model_override=model_override)
    return server(kind).profile(probe)


def first_model(models: Any) -> tuple[str | None, dict]:
    """The first entry of a /v1/models answer: (id, entry)."""
    entry = dig(models, "data", 0)
    if not isinstance(entry, dict):
        return None, {}
    model_id = entry.get("id")
    return (str(model_id)[:200] if isinstance(model_id, (str, int)) and str(model_id) else None), entry


def _model(probe: Probe) -> str:
    return probe.model_override or first_model(probe.models)[0] or "remote model"


def _context(value: Any, name: str, notes: list[str]) -> int | None:
    """A context length from the probe, or None (with a note) where the server's value is not a count."""
    if value is None:
        return None
    length = count(value)
    if not length:
        notes.append(f"the server's {name} ({shown_value(value)}) is not a token count: ignored")
        return None
    return length


def token_ids(tokens: Any) -> list[int] | None:
    """A tokenizer's answer as token ids, or None where it is not a list of counts."""
    if not isinstance(tokens, list):
        return None
    ids = [count(t) for t in tokens]
    return None if any(t is None for t in ids) else ids  # type: ignore[misc]


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
    names = server(kind).counters
    if not names or not text:
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
