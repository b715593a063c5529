"""The remote backend against servers that misbehave (issue 18), each a real HTTP server on 127.0.0.1.

A redirect to another origin never carries the key (the second server sees no request at all); bad data from a
server (a body that is not JSON, "abc" where a count goes, counters that sum to inf) gives figures as "–" with a
reason or one error line, never a traceback, and the text that streamed is kept; lines, labels and answers are
capped, so memory stays flat (measured with tracemalloc, which counts every Python allocation in the process).

Mutations checked by hand (each sent a test here red): no request hook (the second server got the key), JSON
errors caught without RecursionError, a 200 that is not JSON let through, int() on n_ctx, accepted > drafted
allowed, sums past 2^53/inf allowed, no cap on the position label, the SSE line, the event, the stream's bytes or
a probe answer, a CRLF split across chunks, Tabby's generic reason over the real one, no stats safety net.
"""

from __future__ import annotations

import io
import json
import threading
import tracemalloc
from collections.abc import Iterator

import pytest
from rich.console import Console

from engine.backends.remote import RemoteBackend
from engine.backends.remote import http as remote_http
from engine.backends.remote.servers import build_profile, read_spec_counters, spec_counters
from engine.backends.remote.stream import EventStreamReader, StreamCounters, StreamLimitError
from engine.config import load_settings
from engine.errors import BackendError
from engine.events import ReplyFailed, ReplyFinished
from engine.session import ChatSession
from tests.support.remote_fixture_server import (
    DATA,
    FixtureServer,
    Reply,
    Routes,
    endless_line,
    file_reply,
    redirect,
    tabby_routes,
    vllm_metrics_routes,
    vllm_routes,
    with_second_engine,
)
from tui.screens.inspector import stats_table

KEY = "sk-must-stay-home-1234"
MiB = 1 << 20


def _plain(renderable) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=240, color_system=None).print(renderable)
    return buffer.getvalue()


def _session(url: str, **kwargs) -> ChatSession:
    session = ChatSession(load_settings(), backend=RemoteBackend(url, **kwargs))
    session.load()
    return session


def _send(session: ChatSession, text: str = "What is the capital of France?"):
    return session.send(text, lambda event: None, threading.Event())


def _peak_mib(work) -> tuple[object, float]:
    """What `work()` returns and the peak of Python memory it allocated, in MiB."""
    tracemalloc.start()
    try:
        result = work()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak / MiB


def _llama_routes(props: str = "llama_server_props.json", stream: Reply | None = None) -> Routes:
    routes = Routes()
    routes.add("GET", "/v1/models", file_reply("llama_server_models.json"))
    routes.add("GET", "/props", file_reply(props))
    routes.add("GET", "/slots", file_reply("llama_server_slots.json"))
    routes.add("POST", "/v1/chat/completions", stream or file_reply("llama_server_chat_stream.sse"))
    return routes


def _edited_stream(name: str, edit) -> Reply:
    """A recorded stream with `edit(chunk)` applied to every JSON chunk."""
    events = []
    for event in (DATA / name).read_text().split("\n\n"):
        payload = event.removeprefix("data: ")
        if event.strip() and payload.strip() != "[DONE]":
            chunk = json.loads(payload)
            edit(chunk)
            event = "data: " + json.dumps(chunk)
        events.append(event)
    return Reply(body="\n\n".join(events), content_type="text/event-stream")


# --- redirects ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_at_connect_is_refused_and_the_key_never_leaves(monkeypatch, status):
    monkeypatch.setenv("SPECCHAT_TEST_KEY", KEY)
    elsewhere = vllm_routes()
    with FixtureServer(elsewhere) as other:
        routes = vllm_routes()
        routes.add("GET", "/v1/models", redirect(status, f"{other.url}/v1/models"))
        with FixtureServer(routes) as server:
            backend = RemoteBackend(server.url, api_key_env="SPECCHAT_TEST_KEY")
            with pytest.raises(BackendError) as caught:
                backend.load()
    message = str(caught.value)
    assert "redirected to another origin (http://127.0.0.1:" in message and "not followed" in message
    assert "\n" not in message and KEY not in message
    assert elsewhere.requests == []  # nothing at all went there: no key, no chat
    assert routes.requests[0][3]["x-api-key"] == KEY  # the endpoint itself did get the key
    assert routes.requests[0][3]["Accept-Encoding"] == "identity"  # no compression: the byte caps hold


def test_a_307_mid_chat_to_another_origin_keeps_the_chat_and_key_home(monkeypatch):
    monkeypatch.setenv("SPECCHAT_TEST_KEY", KEY)
    elsewhere = vllm_routes()
    with FixtureServer(elsewhere) as other:
        routes = vllm_routes()
        with FixtureServer(routes) as server:
            session = _session(server.url, api_key_env="SPECCHAT_TEST_KEY")
            routes.add("POST", "/v1/chat/completions", redirect(307, f"{other.url}/v1/chat/completions"))
            failed = _send(session)
            # A redirect to the same host by another name is another origin too (the browser rule).
            routes.add(
                "POST", "/v1/chat/completions", redirect(307, server.url.replace("127.0.0.1", "localhost"))
            )
            again = _send(session, "And of Spain?")
    assert isinstance(failed, ReplyFailed) and isinstance(again, ReplyFailed)
    assert "redirected to another origin" in failed.message and "\n" not in failed.message
    assert "(http://localhost:" in again.message
    assert elsewhere.requests == []


def test_a_redirect_within_the_origin_is_still_followed(monkeypatch):
    monkeypatch.setenv("SPECCHAT_TEST_KEY", KEY)
    routes = vllm_routes()
    routes.add("GET", "/v1/models", redirect(308, "/v1/models/"))
    routes.add("GET", "/v1/models/", file_reply("vllm_models.json"))
    with FixtureServer(routes) as server:
        session = _session(server.url, api_key_env="SPECCHAT_TEST_KEY")
        result = _send(session)
    assert isinstance(result, ReplyFinished) and result.text.endswith("Eiffel Tower.")
    assert [p for _, p, _, _ in routes.requests[:2]] == ["/v1/models", "/v1/models/"]


# --- bad data ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "tokenize"),
    [
        (Reply(200, "<html>busy</html>", content_type="text/html"), None),
        (Reply(200, '{"prompt": "<|im_start|>user ..."}'), Reply(200, "not json at all")),
        (Reply(200, '{"prompt": "<|im_start|>user ..."}'), Reply(200, '{"tokens": [1, "two", 3]}')),
        (Reply(200, '{"prompt": 42}'), None),
        (
            Reply(200, "[" * 100_000),
            None,
        ),  # nested past the JSON parser's depth: RecursionError, not ValueError
    ],
)
def test_a_tokenizer_answer_that_is_not_json_or_not_ids_falls_back_to_the_estimate(template, tokenize):
    routes = _llama_routes()
    routes.add("POST", "/apply-template", template)
    if tokenize is not None:
        routes.add("POST", "/tokenize", tokenize)
    with FixtureServer(routes) as server:
        session = _session(server.url)
        ids = session.backend.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        result = _send(session)
    assert ids and set(ids) == {-1}  # the length estimate
    assert isinstance(result, ReplyFinished) and result.text


def test_a_200_that_is_not_json_is_one_line():
    routes = _llama_routes()
    routes.add("POST", "/apply-template", Reply(200, "<html>\n<body>oops</body>\n</html>", "text/html"))
    with FixtureServer(routes) as server:
        backend = RemoteBackend(server.url)
        backend.load()
        with pytest.raises(BackendError) as caught:
            backend._post_json("/apply-template", {"messages": []})
    message = str(caught.value)
    assert message.startswith(
        f"the server at {server.url}/apply-template answered 200 with a body that is not"
    )
    assert "\n" not in message


def test_a_context_length_that_is_not_a_number_is_ignored_with_a_note():
    props = json.loads((DATA / "llama_server_props.json").read_text())
    props["default_generation_settings"]["n_ctx"] = "abc"
    routes = _llama_routes()
    routes.add("GET", "/props", Reply(200, json.dumps(props)))
    routes.add("GET", "/slots", Reply(200, json.dumps([{"n_ctx": "abc", "speculative": False}])))
    with FixtureServer(routes) as server:
        session = _session(server.url, max_context=2048)
        result = _send(session)
    info = session.info
    assert info.max_context == 2048
    assert any("n_ctx ('abc') is not a token count" in note for note in info.notes)
    assert any("max_context 2048 assumed" in note for note in info.notes)
    assert isinstance(result, ReplyFinished)
    # The same for every server kind's field, and shapes that are not even dicts.
    for value in ("abc", -5, True, 1e308, float("nan"), [1], 10**30):
        assert (
            build_profile("vllm", models={"data": [{"id": "m", "max_model_len": value}]}).max_context is None
        )
    assert build_profile("tabbyapi", models={}, tabby_model={"parameters": ["x"]}).max_context is None
    assert (
        build_profile("llama-server", models={}, props={"default_generation_settings": 7}).max_context is None
    )


def _draft_fields(draft_n, accepted):
    def edit(chunk):
        timings = chunk.get("timings")
        if isinstance(timings, dict) and "draft_n" in timings:
            timings["draft_n"], timings["draft_n_accepted"] = draft_n, accepted

    return edit


@pytest.mark.parametrize(
    ("draft_n", "accepted", "reason"),
    [
        (8, "abc", "draft_n_accepted ('abc') is not a count"),
        ("8", 4, "draft_n ('8') is not a count"),
        (8, -1, "draft_n_accepted (-1) is not a count"),
        (8, 1e308, "is not a count"),
        (4, 8, "more accepted (8) than drafted (4)"),
    ],
)
def test_llama_server_draft_counts_that_are_not_counts_show_dashes_and_keep_the_text(
    draft_n, accepted, reason
):
    stream = _edited_stream("llama_server_chat_stream.sse", _draft_fields(draft_n, accepted))
    with FixtureServer(_llama_routes(stream=stream)) as server:
        result = _send(_session(server.url))
    assert isinstance(result, ReplyFinished)
    assert result.text.startswith("The")
    stats = result.stats
    assert reason in stats.unavailable["drafted_tokens"] and reason in stats.unavailable["acceptance_rate"]
    assert stats.acceptance_rate is None and stats.alpha is None
    table = _plain(stats_table(stats))
    assert "drafted / accepted  –  (the server" in table and "acceptance rate  –  (" in table


def test_tabby_draft_fields_that_are_not_counts_show_dashes():
    def edit(chunk):
        if chunk.get("usage"):
            chunk["usage"].update(draft_accept=3, draft_reject="many")

    routes = tabby_routes()
    routes.add("POST", "/v1/chat/completions", _edited_stream("tabby_chat_stream.sse", edit))
    with FixtureServer(routes) as server:
        result = _send(_session(server.url))
    assert isinstance(result, ReplyFinished) and result.text == "The capital of France is Paris."
    assert "draft_reject ('many') is not a count" in result.stats.unavailable["drafted_tokens"]
    # Good values still count (and a null reject is none rejected).
    counters = StreamCounters()
    counters.read({"choices": [{}], "usage": {"draft_accept": 3, "draft_reject": None}})
    assert (counters.drafted, counters.accepted, counters.problems) == (3, 3, {})


@pytest.mark.parametrize("value", ["1e308", "+Inf", "NaN"])
def test_metrics_that_sum_to_inf_show_dashes_with_a_reason_and_keep_the_text(value):
    page = with_second_engine(value)
    if value == "1e308":  # two engines at 1e308: each finite, their sum inf (and inf - inf is NaN)
        page = with_second_engine("1e308").replace('engine="0"', 'engine="2"') + with_second_engine("1e308")
    with FixtureServer(vllm_metrics_routes(page)) as server:
        result = _send(_session(server.url))
    assert isinstance(result, ReplyFinished)
    assert result.text == "The capital of France is Paris. It is known for the Eiffel Tower."
    reason = result.stats.unavailable["drafted_tokens"]
    assert "/metrics counters are not usable numbers" in reason
    assert result.stats.acceptance_rate is None and result.stats.new_tokens == 17
    assert "drafted / accepted  –  (the server's /metrics" in _plain(stats_table(result.stats))


def test_metrics_counters_that_go_back_or_overflow_give_no_difference():
    counters, why = read_spec_counters("vllm", "vllm:spec_decode_num_drafts_total 1e308\n" * 2)
    assert counters is None and "past 2^53 (or to inf)" in why
    good = spec_counters("vllm", (DATA / "vllm_metrics_before.txt").read_text())
    bigger = spec_counters("vllm", (DATA / "vllm_metrics_after.txt").read_text())
    assert bigger.minus(good) is not None and good.minus(bigger) is None


def test_a_huge_position_label_costs_no_memory():
    page = (DATA / "vllm_metrics_after.txt").read_text() + (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="10000000"} 1.0\n'
    )
    counters, peak = _peak_mib(lambda: spec_counters("vllm", page))
    assert counters.per_position == (37, 27, 16)  # the absurd position is skipped
    assert peak < 1, f"{peak:.1f} MiB"
    # Through the backend: the reply finishes with the real per-position figures.
    with FixtureServer(vllm_metrics_routes(page)) as server:
        result, peak = _peak_mib(lambda: _send(_session(server.url)))
    assert isinstance(result, ReplyFinished) and len(result.stats.per_position_acceptance) == 3
    assert peak < 16, f"{peak:.1f} MiB"


# --- caps --------------------------------------------------------------------------------------------------


def test_a_50_mb_event_line_without_a_newline_is_cut_at_the_cap_and_the_text_kept():
    routes = vllm_routes()
    routes.add("POST", "/v1/chat/completions", Reply(content_type="text/event-stream", chunks=endless_line))
    with FixtureServer(routes) as server:
        session = _session(server.url)
        result, peak = _peak_mib(lambda: _send(session))
        again = _send(session, "Go on")  # the connection's end is clean: the next reply works
    assert isinstance(result, ReplyFailed)
    assert result.partial_text == "The capital of France is"
    assert result.message == (
        f"the server at {server.url} sent an event-stream line longer than 1 MiB in its reply: "
        "not read further (the partial reply is kept; see the server's log)"
    )
    assert peak < 16, f"{peak:.1f} MiB"
    assert isinstance(again, ReplyFailed)  # the same endless server again, the same line


def test_a_stream_past_the_byte_cap_stops_with_one_line(monkeypatch):
    monkeypatch.setattr(remote_http, "MAX_STREAM_BYTES", 1 * MiB)
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "la "}}]})

    def forever() -> Iterator[bytes]:
        for _ in range(50_000):  # ~3 MiB of well-formed events that never finish
            yield f"data: {chunk}\n\n".encode()

    routes = vllm_routes()
    routes.add("POST", "/v1/chat/completions", Reply(content_type="text/event-stream", chunks=forever))
    with FixtureServer(routes) as server:
        result = _send(_session(server.url))
    assert isinstance(result, ReplyFailed) and result.partial_text.startswith("la la ")
    assert "sent more than 1 MiB in its reply" in result.message and "\n" not in result.message


def test_a_50_mb_probe_answer_is_refused_with_bounded_memory():
    def huge() -> Iterator[bytes]:
        yield b'{"data": [{"id": "'
        for _ in range(50 * 16):
            yield b"m" * (64 * 1024)

    routes = vllm_routes()
    routes.add("GET", "/v1/models", Reply(chunks=huge))
    with FixtureServer(routes) as server:
        backend = RemoteBackend(server.url)
        (error, peak) = _peak_mib(lambda: pytest.raises(BackendError, backend.load))
    assert "/v1/models kept sending more than 8 MiB: not read further" in str(error.value)
    assert peak < 40, f"{peak:.1f} MiB"  # the 8 MiB cap, and bytes copies of it


# --- the event-stream reader -------------------------------------------------------------------------------


def test_event_stream_reader_splits_on_every_line_end_across_chunks():
    stream = (
        b'data: {"a": 1}\r\n\r\n: a comment\ndata: two\ndata: lines\r\rdata: crlf\r\ndata: joined\r\n\r\n'
        b"id: 7\nevent: x\ndata: last\r"
    )
    for size in (1, 2, 3, 7, len(stream)):
        reader = EventStreamReader()
        events: list[str] = []
        for i in range(0, len(stream), size):
            events += reader.feed(stream[i : i + size])
        events += reader.close()
        assert events == ['{"a": 1}', "two\nlines", "crlf\njoined", "last"], size


def test_event_stream_reader_caps_a_line_and_an_event():
    reader = EventStreamReader(max_line=100, max_data=250)
    assert reader.feed(b"data: " + b"x" * 94) == []  # exactly the cap: fine
    with pytest.raises(StreamLimitError, match="line longer than 100 bytes"):
        reader.feed(b"y")
    reader = EventStreamReader(max_line=100, max_data=250)
    with pytest.raises(StreamLimitError, match="event of more than"):
        for _ in range(5):
            reader.feed(b"data: " + b"x" * 60 + b"\n")


def test_figures_that_fail_in_an_unforeseen_way_still_keep_the_reply(monkeypatch):
    def broken(*args):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(RemoteBackend, "_read_server_stats", broken)
    with FixtureServer(vllm_routes()) as server:
        result = _send(_session(server.url))
    assert isinstance(result, ReplyFinished) and result.text.endswith("Eiffel Tower.")
    assert (
        result.stats.unavailable["drafted_tokens"] == "the server's figures could not be read (OverflowError)"
    )
    assert result.stats.new_tokens == 17  # the chunks counted by the client


def test_a_connection_dropped_before_any_text_does_not_claim_a_partial_reply() -> None:
    import httpx

    from engine.backends.remote import RemoteBackend

    backend = RemoteBackend("http://127.0.0.1:9")
    before = backend._fail(httpx.ReadError("peer closed"), "/v1/chat/completions")
    during = backend._fail(httpx.ReadError("peer closed"), "/v1/chat/completions", " mid-reply")
    assert "dropped the connection" in str(before) and "partial reply" not in str(before)
    assert "dropped the connection mid-reply" in str(during) and "the partial reply is kept" in str(during)
