"""Remote backend: the chat runs on an OpenAI-compatible server (llama.cpp's llama-server, vLLM, TabbyAPI, ...).

The server drafts and verifies; this client streams `/v1/chat/completions` (httpx, and a capped event-stream
reader of its own), sends what the server honours of the preset (engine.backends.remote.servers), and reports
speculation only from what the server says: llama-server's per-token `timings` (live) and `/metrics` deltas
(rounds), vLLM's `/metrics` counters (polled at most twice a second while a reply streams, and their before/after
difference), TabbyAPI's finish fields where it forwards them. Anything else stays empty with a reason. Tokens/s and TTFT are the client's own.

Failures (server down, refused, timed out, 401/404/5xx, a stream cut mid-reply, a body that is not JSON, a line or
an answer past its cap) become one BackendError line that says what, where and what to do; the session keeps the
partial reply. The API key is read from an environment variable at each request and is never stored, and it goes
only to the endpoint's origin: a redirect to another scheme, host or port is refused before anything is sent
there (httpx drops `Authorization` on such a redirect but would forward `x-api-key` and, on a 307, the chat).
Every answer is read with a byte cap, so a misbehaving server costs at most a few MiB.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import replace
from typing import Any

import httpx

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.remote.http import (
    MAX_ANSWER_BYTES,
    MAX_REDIRECTS,
    Answer,
    AnswerTooLarge,
    CrossOriginRedirect,
    NotJSON,
    event_data,
    origin,
    reason_of,
    shown_origin,
)
from engine.backends.remote.servers import (
    Probe,
    ServerProfile,
    SpecCounters,
    detect,
    read_spec_counters,
    spec_counters,
)
from engine.backends.remote.stream import (
    DRAFT_FIELDS,
    StreamCounters,
    StreamLimitError,
    chunk_reasoning,
    chunk_text,
    error_message,
)
from engine.endpoint import insecure_warning, normalize_endpoint
from engine.errors import BackendError
from engine.events import BackendInfo, Chunk, Done, ServerStats, StopReason
from engine.request import GenerationRequest

BACKEND_NAME = "remote"
METRICS_POLL_S = 0.5  # at most 2 Hz: the server serves other clients too
PROBE_TIMEOUT = httpx.Timeout(5.0)
# Reading may wait long (a big prompt's prefill on a busy server); connecting may not.
STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=5.0)
FINISH_REASONS: dict[str, StopReason] = {"stop": "end_of_turn", "length": "max_new_tokens", "eos": "eos"}
# A probe answer must arrive within PROBE_DEADLINE_S in all (a server dribbling a byte every few seconds never times
# out a read); the caps on what an answer or a reply's stream may hold are http.py's.
PROBE_DEADLINE_S = 30.0


class RemoteBackend:
    name = BACKEND_NAME

    def __init__(
        self,
        endpoint: str,
        *,
        api_key_env: str | None = None,
        model: str | None = None,
        max_context: int = 4096,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        try:
            self.base = normalize_endpoint(endpoint)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        self.api_key_env = api_key_env
        self.model_override = model
        self.default_context = max_context
        self._transport = transport
        self._client: httpx.Client | None = None
        self.profile: ServerProfile | None = None
        self._info: BackendInfo | None = None
        self.warning = insecure_warning(self.base)

    # --- connection ------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise BackendError(
                f"the API key variable ${self.api_key_env} is empty or unset: export it, or drop --api-key-env"
            )
        # TabbyAPI reads x-api-key or Authorization (common/auth.py); the others read Authorization.
        return {"Authorization": f"Bearer {key}", "x-api-key": key}

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.base,
                transport=self._transport,
                follow_redirects=True,  # within the endpoint's origin only: see _same_origin
                # Uncompressed answers: the byte caps then bound what is held (64 KiB of gzip can be 64 MiB).
                headers={"Accept-Encoding": "identity"},
                max_redirects=MAX_REDIRECTS,
                event_hooks={"request": [self._same_origin]},
            )
        return self._client

    def _same_origin(self, request: httpx.Request) -> None:
        """Refuse any request (a followed redirect) that would leave the endpoint's origin: it would carry the
        API key (x-api-key survives httpx's cross-origin redirect; Authorization does not) and the chat."""
        if origin(request.url) != origin(httpx.URL(self.base)):
            raise CrossOriginRedirect(
                f"the server at {self.base} redirected to another origin ({shown_origin(request.url)}): "
                "not followed, so the API key and the chat stay with --endpoint; "
                "if that is the real server, pass it as --endpoint",
                request=request,
            )

    def _fail(self, exc: Exception, path: str, during: str = "") -> BackendError:
        """One line: what went wrong, where, what to do."""
        where = f"{self.base}{path}"
        if isinstance(exc, (CrossOriginRedirect, AnswerTooLarge)):
            return BackendError(str(exc))
        if isinstance(exc, httpx.TooManyRedirects):
            return BackendError(
                f"the server at {where} redirected more than {MAX_REDIRECTS} times: not followed"
            )
        if isinstance(exc, httpx.ConnectError):
            return BackendError(
                f"cannot reach the server at {self.base} ({reason_of(exc)}): start it, or check --endpoint"
            )
        if isinstance(exc, httpx.TimeoutException):
            return BackendError(f"the server at {where} timed out{during}: it may be overloaded; try again")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            kept = "the partial reply is kept; " if during else ""  # `during` is set once text arrived
            return BackendError(
                f"the server at {self.base} dropped the connection{during} ({reason_of(exc)}): "
                f"{kept}ask again when the server is back"
            )
        return BackendError(f"request to {where} failed{during}: {reason_of(exc)}")

    def _status_error(self, answer: Answer, path: str) -> BackendError:
        try:
            body = answer.json()
        except NotJSON:
            body = None
        detail = error_message(body)
        detail = f": {detail}" if detail else ""
        code, where = answer.status_code, f"{self.base}{path}"
        if code in (401, 403):
            hint = (
                f"check the key in ${self.api_key_env}"
                if self.api_key_env
                else "the server wants an API key: put it in an environment variable and pass --api-key-env VAR"
            )
            return BackendError(f"the server at {self.base} refused the request ({code}{detail}): {hint}")
        if code == 404:
            return BackendError(
                f"{where} not found (404{detail}): --endpoint should be the server's base URL "
                "(e.g. http://127.0.0.1:8080), and --remote-model a model it serves"
            )
        if code >= 500:
            return BackendError(f"the server at {self.base} failed ({code}{detail}): see the server's log")
        return BackendError(f"the server at {where} rejected the request ({code}{detail})")

    def _request(self, method: str, path: str, body: dict | None = None) -> Answer:
        """One non-streaming request, its body read up to MAX_ANSWER_BYTES within PROBE_DEADLINE_S."""
        deadline = time.monotonic() + PROBE_DEADLINE_S
        with self.client.stream(
            method, path, json=body, headers=self._headers(), timeout=PROBE_TIMEOUT
        ) as response:
            content = bytearray()
            for piece in response.iter_bytes():
                content += piece
                if len(content) > MAX_ANSWER_BYTES or time.monotonic() > deadline:
                    what = (
                        f"more than {MAX_ANSWER_BYTES >> 20} MiB"
                        if len(content) > MAX_ANSWER_BYTES
                        else f"for more than {PROBE_DEADLINE_S:.0f} s"
                    )
                    raise AnswerTooLarge(
                        f"the server at {self.base}{path} kept sending {what}: not read further",
                        request=response.request,
                    )
            return Answer(response.status_code, bytes(content), f"{self.base}{path}")

    def _get(self, path: str) -> Answer | None:
        """GET for the probe: None where the endpoint is absent; BackendError where the server is unusable."""
        try:
            answer = self._request("GET", path)
        except httpx.HTTPError as exc:
            raise self._fail(exc, path) from None
        if answer.status_code in (401, 403):
            raise self._status_error(answer, path)
        return answer if answer.status_code == 200 else None

    def _get_json(self, path: str) -> Any:
        answer = self._get(path)
        if answer is None:
            return None
        try:
            return answer.json()
        except NotJSON:
            return None

    def _metrics_text(self) -> str | None:
        try:
            answer = self._request("GET", "/metrics")
        except (httpx.HTTPError, BackendError):
            return None
        return answer.body.decode("utf-8", "replace") if answer.status_code == 200 else None

    # --- Backend protocol ------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        if self._info is None:
            raise BackendError("the remote backend is not connected yet")
        return self._info

    def load(self, progress: ProgressCallback | None = None) -> None:
        if progress:
            progress(f"connecting to {self.base}", None)
        models = self._get_json("/v1/models")
        if models is None:
            raise BackendError(
                f"{self.base} has no OpenAI-compatible API (GET /v1/models failed): "
                "--endpoint should be the server's base URL, e.g. http://127.0.0.1:8080"
            )
        probe = Probe(
            models=models,
            serviceinfo=self._get_json("/.well-known/serviceinfo"),
            props=self._get_json("/props"),
            version=self._get_json("/version"),
            model_override=self.model_override,
        )
        server = detect(probe)
        extra = {name: self._get_json(path) for name, path in server.probe_paths.items()}
        metrics = self._metrics_text() if server.counters else None
        self.profile = profile = server.profile(replace(probe, extra=extra, metrics_text=metrics))
        notes = [profile.summary(), *profile.notes]
        if self.warning:
            notes.insert(0, self.warning)
        if profile.max_context is None:
            notes.append(f"context length unknown: max_context {self.default_context} assumed")
        notes.append("temperature ramps are not sent: the server samples at the preset's temperature")
        draft_mode = "none" if profile.speculating is False else "server"
        # llama-server names its model by the GGUF's path: the file name says the same, shorter.
        shown = profile.model.rsplit("/", 1)[-1] if profile.model.endswith(".gguf") else profile.model
        self._info = BackendInfo(
            backend=BACKEND_NAME,
            model=shown,
            device=f"{profile.kind}@{self.base.split('://', 1)[1]}",
            cache_mode="server",
            draft_cache_mode="server",
            draft_mode=draft_mode,  # type: ignore[arg-type]
            draft_model=None,
            max_context=profile.max_context or self.default_context,
            notes=tuple(notes),
            k_by_server=not profile.k_per_request,
        )

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the rendered conversation where the server tokenizes (llama-server, vLLM); else a
        length estimate (about 3 characters a token, -1 for each) good enough to fit the context."""
        profile = self.profile
        try:
            tokens = profile.server.tokenize(self._post_json, profile, messages) if profile else None
            if tokens is not None:
                return tokens
        except BackendError as exc:
            if "cannot reach" in str(exc) or "refused" in str(exc) or "another origin" in str(exc):
                raise
        # Any other answer (not JSON, not token ids, too large): the estimate below still fits the context.
        chars = sum(len(m.get("content", "")) + 8 for m in messages)
        return [-1] * math.ceil(chars / 3)

    def _post_json(self, path: str, body: dict) -> dict:
        try:
            answer = self._request("POST", path, body)
        except httpx.HTTPError as exc:
            raise self._fail(exc, path) from None
        if answer.status_code != 200:
            raise self._status_error(answer, path)
        try:
            data = answer.json()
        except NotJSON as exc:
            raise BackendError(str(exc)) from None
        return data if isinstance(data, dict) else {}

    def decode(self, token_ids: list[int]) -> str:
        return ""  # replies arrive as text; nothing here decodes ids

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The chat completion request: the preset's fields the server honours, and nothing it ignores."""
        profile = self.profile
        assert profile is not None
        sampler = request.sampler
        body: dict[str, Any] = {
            "model": profile.model,
            "messages": list(request.messages),
            "stream": True,
            "max_tokens": request.max_new_tokens,
            "temperature": sampler.temperature,
            "top_p": sampler.top_p,
            "stream_options": {"include_usage": True},
        }
        if request.seed is not None:
            body["seed"] = request.seed
        neutral = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
        for ours, theirs in profile.server.sampler_fields:
            value = getattr(sampler, ours)
            if value != neutral[ours]:
                body[theirs] = value
        profile.server.request_fields(body, profile, request.effective_k)
        return body

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        profile = self.profile
        if profile is None:
            raise BackendError("the remote backend is not connected yet")
        if not request.messages:
            raise BackendError("the remote backend needs the conversation as messages")
        before, metrics_why = (
            read_spec_counters(profile.kind, self._metrics_text()) if profile.metrics else (None, "")
        )
        poller = _MetricsPoller(self, before) if profile.server.polls_metrics and before is not None else None
        reader = _ReplyReader(self.base, StreamCounters(), poller, request.sampler.temperature)
        path = "/v1/chat/completions"
        try:
            with self.client.stream(
                "POST",
                path,
                json=self.request_body(request),
                headers=self._headers(),
                timeout=STREAM_TIMEOUT,
            ) as response:
                self._check_stream(response, path)
                stop = yield from self._stream_chunks(response, reader, cancel)
        except httpx.HTTPError as exc:
            raise self._fail(exc, path, " mid-reply" if reader.content_events else "") from None
        except StreamLimitError as exc:
            kept = "the partial reply is kept; " if reader.content_events else ""
            raise BackendError(
                f"the server at {self.base} sent {exc} in its reply: not read further ({kept}see the server's log)"
            ) from None
        finally:
            if poller is not None:
                poller.stop()
        yield self._done(profile, request, reader, stop, before, metrics_why)

    def _check_stream(self, response: httpx.Response, path: str) -> None:
        """The reply's answer is a 200 and an event stream, or a BackendError that says what it is instead."""
        if response.status_code != 200:
            raise self._status_error(Answer.capped(response, self.base + path), path)
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" not in content_type:
            raise BackendError(
                f"the server at {self.base}{path} answered without streaming "
                f"(Content-Type {' '.join(content_type.split())[:60] or 'none'}, not text/event-stream): "
                "is --endpoint an OpenAI-compatible server?"
            )

    @staticmethod
    def _stream_chunks(
        response: httpx.Response, reader: _ReplyReader, cancel: threading.Event
    ) -> Generator[Chunk, None, StopReason]:
        """The stream's payloads as Chunks until [DONE], the stream's end ("eos", for now) or a cancel ("cancelled")."""
        for payload in event_data(response):
            if cancel.is_set():
                return "cancelled"
            if payload.strip() == "[DONE]":
                break
            chunk = reader.read(payload)
            if chunk is not None:
                yield chunk
        return "eos"

    def _done(
        self,
        profile: ServerProfile,
        request: GenerationRequest,
        reader: _ReplyReader,
        stop: StopReason,
        before: SpecCounters | None,
        metrics_why: str,
    ) -> Done:
        """The reply's Done: the server's finish reason unless cancelled, a BackendError for a stream cut short."""
        counters = reader.counters
        if stop != "cancelled":
            stop = FINISH_REASONS.get(counters.finish_reason or "", "eos")
            if counters.finish_reason is None and reader.content_events:
                raise BackendError(
                    f"the server at {self.base} ended the stream without finishing the reply: "
                    "the partial reply is kept; ask again"
                )
        return Done(
            stop_reason=stop,
            prompt_tokens=counters.prompt_tokens or len(request.prompt_ids),
            cached_tokens=counters.cached_tokens or 0,
            server=self._server_stats(profile, counters, before, reader.seen_tokens, metrics_why),
        )

    def _server_stats(
        self,
        profile: ServerProfile,
        counters: StreamCounters,
        before: SpecCounters | None,
        seen: int,
        metrics_why: str,
    ) -> ServerStats:
        """The reply's server figures. The text has streamed by now: whatever the server sent, this gives
        figures or "—" with reasons, never an exception that would lose the reply."""
        try:
            return self._read_server_stats(profile, counters, before, seen, metrics_why)
        except (ArithmeticError, ValueError, TypeError) as exc:
            # A shape nobody foresaw: say so beside every figure, and keep the text.
            why = f"the server's figures could not be read ({type(exc).__name__})"
            return ServerStats(
                source=profile.kind,
                new_tokens=seen,
                unavailable=tuple((name, why) for name in DRAFT_FIELDS),
            )

    def _read_server_stats(
        self,
        profile: ServerProfile,
        counters: StreamCounters,
        before: SpecCounters | None,
        seen: int,
        metrics_why: str,
    ) -> ServerStats:
        unavailable: list[tuple[str, str]] = list(counters.problems.items())
        new_tokens = counters.completion_tokens if counters.completion_tokens is not None else counters.tokens
        if new_tokens is None:
            unavailable.append(("new_tokens", "the server sent no token counts: stream chunks are counted"))
        delta = None
        if before is not None:
            after, metrics_why = read_spec_counters(profile.kind, self._metrics_text())
            delta = after.minus(before) if after is not None else None
            if after is not None and delta is None:
                metrics_why = "the server's /metrics counters went back or do not add up across this reply"
        drafts = profile.server.drafts(profile, counters, delta, metrics_why)
        return ServerStats(
            source=profile.kind,
            drafted=drafts.drafted,
            accepted=drafts.accepted,
            new_tokens=new_tokens if new_tokens is not None else seen,
            prompt_tokens=counters.prompt_tokens,
            cached_tokens=counters.cached_tokens,
            drafting_rounds=drafts.rounds,
            position_drafted=drafts.position_drafted,
            position_accepted=drafts.position_accepted,
            unavailable=(*unavailable, *drafts.unavailable),
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _ReplyReader:
    """One reply's event-stream payloads read into Chunks: what the stream has shown so far (tokens, drafted and
    accepted tokens, whether a thinking block is open, how many payloads carried text)."""

    def __init__(
        self, base: str, counters: StreamCounters, poller: _MetricsPoller | None, temperature: float
    ) -> None:
        self.base = base
        self.counters = counters
        self.poller = poller
        self.temperature = temperature
        self.seen_tokens = self.seen_drafted = self.seen_accepted = 0
        self.content_events = 0
        self.thinking = False

    def read(self, payload: str) -> Chunk | None:
        """The payload's Chunk, or None for one that is not a JSON object or adds nothing."""
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        if "error" in data and not data.get("choices"):
            raise BackendError(
                f"the server at {self.base} stopped the reply: {error_message(data) or 'error'}"
            )
        self.counters.read(data)
        piece = self._piece(data)
        tokens = self.counters.tokens
        n = (tokens - self.seen_tokens) if tokens is not None else (1 if piece else 0)
        drafted, accepted = self._drafts()
        if not piece and n <= 0 and drafted == self.seen_drafted:
            return None
        chunk = Chunk(
            text=piece,
            token_ids=(),
            drafted=max(drafted - self.seen_drafted, 0),
            accepted=max(accepted - self.seen_accepted, 0),
            origins=(),
            t=time.perf_counter(),
            temperature=self.temperature,
            count=max(n, 0),
            is_round=False,
        )
        self.seen_tokens += max(n, 0)
        self.seen_drafted, self.seen_accepted = (
            max(drafted, self.seen_drafted),
            max(accepted, self.seen_accepted),
        )
        return chunk

    def _piece(self, data: dict) -> str:
        """The payload's text, reasoning wrapped in <think>...</think> across payloads."""
        reasoning, text = chunk_reasoning(data), chunk_text(data)
        piece = ""
        if reasoning and not self.thinking:
            piece, self.thinking = "<think>", True
        piece += reasoning
        if text and self.thinking:
            piece, self.thinking = piece + "</think>", False
        piece += text
        if text or reasoning:
            self.content_events += 1
        return piece

    def _drafts(self) -> tuple[int, int]:
        """Drafted and accepted tokens so far: the poller's /metrics difference, else the stream's own counts."""
        if self.poller is not None:
            live = self.poller.latest
            return (
                (int(live.draft_tokens), int(live.accepted))
                if live
                else (self.seen_drafted, self.seen_accepted)
            )
        counters = self.counters
        drafted = counters.drafted if counters.drafted is not None else self.seen_drafted
        accepted = counters.accepted if counters.accepted is not None else self.seen_accepted
        return drafted, accepted


class _MetricsPoller:
    """Reads /metrics at most twice a second while a reply streams; `latest` is the difference from `before`."""

    def __init__(self, backend: RemoteBackend, before: SpecCounters) -> None:
        self.latest: SpecCounters | None = None
        self._backend = backend
        self._before = before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specchat-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(METRICS_POLL_S):
            now = spec_counters(self._backend.profile.kind, self._backend._metrics_text())
            if now is not None:
                self.latest = now.minus(self._before) or self.latest

    def stop(self) -> None:
        self._stop.set()


def build(args: EngineArgs) -> RemoteBackend:
    """The registry's constructor: the server at `args.endpoint`."""
    return RemoteBackend(
        args.endpoint,
        api_key_env=args.api_key_env,
        model=args.remote_model,
        max_context=args.max_context,
    )
