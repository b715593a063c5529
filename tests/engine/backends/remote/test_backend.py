"""The remote backend against recorded vLLM / TabbyAPI responses replayed by a real local HTTP server, and its
failure lines (down, 401, 404, 5xx, a stream cut mid-reply). The real llama-server tests are in
tests/engine/backends/remote/test_llama_server.py."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from engine.backends.remote import RemoteBackend
from engine.backends.remote.servers import detect_kind, spec_counters
from engine.config import ConfigError, load_settings
from engine.decoding.acceptance import solve_alpha
from engine.endpoint import insecure_warning, normalize_endpoint
from engine.errors import BackendError
from engine.events import Chunk, ReplyFailed, ReplyFinished
from engine.session import ChatSession
from tests.support.remote_fixture_server import (
    DATA,
    FixtureServer,
    Reply,
    Routes,
    file_reply,
    tabby_routes,
    vllm_routes,
)
from tui.formatting import stats_line
from tui.screens.inspector import position_bars, stats_table
from tui.widgets.status_bar import collect_status, render_status


def _plain(renderable) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(renderable)
    return buffer.getvalue()


def _session(url: str, **kwargs) -> ChatSession:
    session = ChatSession(load_settings(), backend=RemoteBackend(url, **kwargs))
    session.load()
    return session


def _send(session: ChatSession, text: str = "What is the capital of France?"):
    events: list[object] = []
    result = session.send(text, events.append, threading.Event())
    return result, events


# --- endpoints and probing -------------------------------------------------------------------------------


def test_endpoint_is_normalized_and_bad_ones_are_refused():
    assert normalize_endpoint("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080"
    assert normalize_endpoint(" https://gpu.example:8000 ") == "https://gpu.example:8000"
    with pytest.raises(ValueError, match="not an http"):
        normalize_endpoint("127.0.0.1:8080")
    with pytest.raises(ValueError, match="environment variable"):
        normalize_endpoint("http://user:sk-secret@host:8080")


def test_plain_http_to_another_host_warns():
    assert insecure_warning("http://10.0.0.7:8000") is not None
    assert "unencrypted" in insecure_warning("http://gpu.lan:8000")
    assert insecure_warning("http://127.0.0.1:8080") is None
    assert insecure_warning("http://localhost:8080") is None
    assert insecure_warning("https://gpu.lan:8000") is None


def test_server_kind_from_probe_answers():
    import json

    def load(name):
        return json.loads((DATA / name).read_text())

    # TabbyAPI also serves /props: its serviceinfo must win.
    tabby = detect_kind(
        load("tabby_serviceinfo.json"), load("tabby_props.json"), None, load("tabby_models.json")
    )
    assert tabby == "tabbyapi"
    assert detect_kind(None, None, load("vllm_version.json"), load("vllm_models.json")) == "vllm"
    assert detect_kind(None, load("llama_server_props.json"), None, load("llama_server_models.json")) == (
        "llama-server"
    )
    assert detect_kind(None, None, None, {"data": [{"id": "x", "owned_by": "someone"}]}) == "other"


def test_vllm_metrics_counters_and_their_difference():
    before = spec_counters("vllm", (DATA / "vllm_metrics_before.txt").read_text())
    after = spec_counters("vllm", (DATA / "vllm_metrics_after.txt").read_text())
    assert (before.drafts, before.draft_tokens, before.accepted) == (40, 120, 70)
    assert before.per_position == (32, 24, 14)
    delta = after.minus(before)
    assert (delta.drafts, delta.draft_tokens, delta.accepted, delta.per_position) == (6, 18, 10, (5, 3, 2))
    # A server restarted between the readings: counters went back, no difference is claimed.
    assert before.minus(after) is None
    assert spec_counters("vllm", "# no speculation here\nvllm:num_requests_running 0.0\n") is None


# --- vLLM (recorded) ---------------------------------------------------------------------------------------


def test_vllm_reply_takes_its_speculation_figures_from_metrics():
    with FixtureServer(vllm_routes()) as server:
        session = _session(server.url)
        info = session.info
        assert info.k_by_server and info.max_context == 8192 and info.backend == "remote"
        result, events = _send(session)
    assert isinstance(result, ReplyFinished)
    assert result.text == "The capital of France is Paris. It is known for the Eiffel Tower."
    stats = result.stats
    # Exactly the /metrics differences (after - before) and the stream's usage: nothing estimated.
    assert (stats.drafted_tokens, stats.accepted_tokens, stats.new_tokens) == (18, 10, 17)
    assert stats.prompt_tokens == 24
    assert stats.rounds == 7  # 17 tokens - 10 accepted drafts
    assert stats.per_position_acceptance == pytest.approx([5 / 6, 3 / 6, 2 / 6])
    # α from the server's rounds: 6 drafting rounds of K=3 that emitted 10 accepted + 6 own tokens.
    assert stats.alpha == pytest.approx(solve_alpha(16 / 6, 3))
    assert stats.k_by_server and stats.num_draft_tokens == 0
    assert stats.predicted_speedup is None and "predicted_speedup" in stats.unavailable
    line = stats_line(stats)
    assert "accept 56% (10/18)" in line and "K server" in line
    # Chunks carry token counts, not ids (the server sends none).
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert sum(c.n_tokens for c in chunks) == 17 and all(c.token_ids == () for c in chunks)


def test_vllm_live_acceptance_comes_from_polled_metrics_during_the_stream():
    routes = vllm_routes(metrics=False)
    slow = file_reply("vllm_chat_stream.sse")
    slow.delay = 0.25  # ~3 s of streaming: the poller (every 0.5 s) reads /metrics mid-reply
    routes.add("POST", "/v1/chat/completions", slow)
    routes.add(
        "GET",
        "/metrics",
        file_reply("vllm_metrics_before.txt"),  # load
        file_reply("vllm_metrics_before.txt"),  # the reply's "before"
        file_reply("vllm_metrics_mid.txt"),  # first poll: part of the reply's drafts
        file_reply("vllm_metrics_after.txt"),
    )
    with FixtureServer(routes) as server:
        session = _session(server.url)
        result, events = _send(session)
    chunks = [e for e in events if isinstance(e, Chunk)]
    firsts = [i for i, c in enumerate(chunks) if c.drafted]
    assert firsts and firsts[0] < len(chunks) - 2  # drafts showed up while the reply streamed
    assert sum(c.drafted for c in chunks) == 18 and sum(c.accepted for c in chunks) == 10
    assert (result.stats.drafted_tokens, result.stats.accepted_tokens) == (18, 10)
    metric_reads = [r for r in routes.requests if r[1] == "/metrics"]
    assert len(metric_reads) <= 2 + 3.5 / 0.5 + 1  # at most twice a second while streaming


def test_vllm_request_sends_what_the_server_honours():
    routes = vllm_routes()
    with FixtureServer(routes) as server:
        session = _session(server.url)
        session.set_overrides(temperature=0.3, top_p=0.9)
        _send(session)
    body = next(b for m, p, b, _ in routes.requests if p == "/v1/chat/completions")
    assert body["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    # K is the server's: neither llama-server's per-request fields nor a claimed K.
    assert not any(key.startswith("speculative") for key in body)
    assert "timings_per_token" not in body


# --- TabbyAPI (recorded) -----------------------------------------------------------------------------------


def test_tabbyapi_reply_shows_dashes_with_reasons():
    with FixtureServer(tabby_routes()) as server:
        session = _session(server.url)
        assert session.info.max_context == 16384
        result, _ = _send(session)
    assert isinstance(result, ReplyFinished) and result.text == "The capital of France is Paris."
    stats = result.stats
    assert stats.new_tokens == 7 and stats.prompt_tokens == 31  # from the usage chunk
    assert "does not send them" in stats.unavailable["drafted_tokens"]
    assert stats.acceptance_rate is None and stats.mean_accepted_length is None
    table = _plain(stats_table(stats))
    assert "drafted / accepted  –  (TabbyAPI logs draft_accept / draft_reject" in table
    assert "K server" in table
    assert "–  (the server does not report drafts per position)" in _plain(position_bars(stats))
    assert "accept –" in stats_line(stats)


# --- failures ----------------------------------------------------------------------------------------------


def test_a_server_that_is_down_gives_one_clear_line():
    from engine.benchmarks.llama_server import free_port

    backend = RemoteBackend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendError) as caught:
        backend.load()
    message = str(caught.value)
    assert message.startswith("cannot reach the server at http://127.0.0.1:") and "start it" in message
    assert "\n" not in message


def test_401_names_the_key_variable_and_the_key_is_sent_from_the_environment(monkeypatch):
    routes = vllm_routes()
    refusal = Reply(401, '{"error": {"message": "Invalid API Key", "code": 401}}')
    routes.add("GET", "/v1/models", refusal)
    monkeypatch.setenv("SPECCHAT_TEST_KEY", "sk-wrong")
    with (
        FixtureServer(routes) as server,
        pytest.raises(BackendError, match=r"refused the request \(401: Invalid API Key\).*SPECCHAT_TEST_KEY"),
    ):
        RemoteBackend(server.url, api_key_env="SPECCHAT_TEST_KEY").load()
    assert routes.requests[0][3]["Authorization"] == "Bearer sk-wrong"


def test_api_key_setting_is_a_variable_name_never_the_key():
    assert load_settings(api_key_env="$OPENAI_API_KEY").api_key_env == "OPENAI_API_KEY"
    assert load_settings(endpoint="http://gpu.lan:8000/v1/").endpoint == "http://gpu.lan:8000"
    with pytest.raises(ConfigError, match="name of an environment variable"):
        load_settings(api_key_env="sk-live-1234")


def test_unset_key_variable_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("SPECCHAT_UNSET_KEY", raising=False)
    with (
        FixtureServer(vllm_routes()) as server,
        pytest.raises(BackendError, match=r"\$SPECCHAT_UNSET_KEY is empty or unset"),
    ):
        RemoteBackend(server.url, api_key_env="SPECCHAT_UNSET_KEY").load()


def test_wrong_path_is_a_404_line():
    with (
        FixtureServer(vllm_routes()) as server,
        pytest.raises(BackendError, match="no OpenAI-compatible API"),
    ):
        RemoteBackend(server.url + "/proxy").load()


def test_a_5xx_mid_chat_is_one_line_and_the_chat_goes_on():
    routes = vllm_routes()
    with FixtureServer(routes) as server:
        session = _session(server.url)
        first, _ = _send(session)
        assert isinstance(first, ReplyFinished)
        routes.add(
            "POST",
            "/v1/chat/completions",
            Reply(503, '{"error": {"message": "model is overloaded", "code": 503}}'),
            file_reply("vllm_chat_stream.sse"),
        )
        failed, _ = _send(session, "And of Spain?")
        assert isinstance(failed, ReplyFailed)
        assert failed.message == (
            f"the server at {server.url} failed (503: model is overloaded): see the server's log"
        )
        again, _ = _send(session, "And of Italy?")
    assert isinstance(again, ReplyFinished)


def test_a_stream_cut_mid_reply_keeps_the_partial_text():
    routes = vllm_routes()
    cut = file_reply("vllm_chat_stream.sse")
    cut.cut_after = 4  # the role chunk, "The", " capital of France", " is"
    routes.add("POST", "/v1/chat/completions", cut, file_reply("vllm_chat_stream.sse"))
    with FixtureServer(routes) as server:
        session = _session(server.url)
        failed, _ = _send(session)
        assert isinstance(failed, ReplyFailed)
        assert failed.partial_text == "The capital of France is"
        assert (
            "dropped the connection mid-reply" in failed.message and "partial reply is kept" in failed.message
        )
        assert session.turns[-1].content == "The capital of France is"  # kept in the conversation
        again, _ = _send(session, "Go on")
    assert isinstance(again, ReplyFinished)
    assert again.text.startswith("The capital")


def test_a_stream_that_ends_without_finishing_is_a_failure_not_a_reply():
    routes = vllm_routes()
    short = file_reply("vllm_chat_stream.sse")
    short.cut_after, short.cut_cleanly = 4, True
    routes.add("POST", "/v1/chat/completions", short)
    with FixtureServer(routes) as server:
        failed, _ = _send(_session(server.url))
    assert isinstance(failed, ReplyFailed) and failed.partial_text == "The capital of France is"
    assert "ended the stream without finishing the reply" in failed.message


def test_cancel_stops_the_stream_and_keeps_what_came():
    routes = vllm_routes()
    slow = file_reply("vllm_chat_stream.sse")
    slow.delay = 0.2
    routes.add("POST", "/v1/chat/completions", slow)
    with FixtureServer(routes) as server:
        session = _session(server.url)
        cancel = threading.Event()

        def on_event(event):
            if isinstance(event, Chunk) and "France" in event.text:
                cancel.set()

        result = session.send("What is the capital of France?", on_event, cancel)
    assert isinstance(result, ReplyFinished) and result.cancelled
    assert result.text == "The capital of France"
    assert result.stats.stop_reason == "cancelled"


def test_a_server_that_does_not_stream_is_one_line():
    routes = vllm_routes()
    routes.add("POST", "/v1/chat/completions", Reply(200, '{"choices": [{"message": {"content": "hi"}}]}'))
    with FixtureServer(routes) as server:
        failed, _ = _send(_session(server.url))
    assert isinstance(failed, ReplyFailed)
    assert failed.message.startswith(
        f"the server at {server.url}/v1/chat/completions answered without streaming"
    )


def test_status_bar_says_k_server():
    with FixtureServer(vllm_routes()) as server:
        session = _session(server.url)
        session.set_mode("qa")
        idle = render_status(collect_status(session, "idle")).plain
        _send(session)
        after = render_status(collect_status(session, "idle")).plain
    assert "K server" in idle
    assert "K server" in after and "accept 56%" in after


# --- command line ------------------------------------------------------------------------------------------


def test_generate_remote_without_endpoint_is_one_line_exit_2(capsys):
    from tui.cli import main

    assert main(["generate", "--backend", "remote", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err == "specchat: error: --backend remote needs --endpoint URL (the server's base URL)\n"


def test_generate_remote_bad_endpoint_is_one_line_exit_2(capsys):
    from tui.cli import main

    assert main(["generate", "--backend", "remote", "--endpoint", "localhost:8080", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: command line: endpoint:") and err.count("\n") == 1


def test_generate_remote_json_and_the_key_is_never_written(capsys, tmp_path, monkeypatch):
    import json

    from tui.cli import main

    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SPECCHAT_TEST_KEY", "sk-never-stored-42")
    with FixtureServer(vllm_routes()) as server:
        code = main(
            [
                "generate", "--endpoint", server.url, "--api-key-env", "SPECCHAT_TEST_KEY",
                "--prompt", "What is the capital of France?", "--json", "--save",
            ]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)
    assert record["text"].endswith("Eiffel Tower.") and record["stats"]["drafted_tokens"] == 18
    assert record["token_ids"] == []  # the server sent text, not ids
    assert "auto: an endpoint is set -> remote" in captured.err
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"sk-never-stored-42" not in written and b"sk-never-stored-42" not in captured.out.encode()
    assert written  # the history and metrics log were written


def test_bench_remote_prints_the_servers_figures_and_says_k_is_fixed():
    from engine.benchmarks.remote import run_remote_bench

    out = io.StringIO()
    with FixtureServer(vllm_routes()) as server:
        results = run_remote_bench(load_settings(), server.url, quick=True, out=out)
    text = out.getvalue()
    assert list(results) == ["server"]  # vLLM fixes its drafting: one run, not a made-up plain one
    fig = results["server"]
    assert fig.replies >= 3 and fig.drafted == 18 and fig.accepted == 10  # the first reply moved the counters
    assert (
        "vllm: sends temperature" in text and "server " in text and "(10/18 drafts, server's count)" in text
    )
    assert "start it once without drafting" in text


# --- llama-server (recorded; the real one is in tests/engine/backends/remote/test_llama_server.py) -------------------------------


def _llama_routes(props: str) -> Routes:
    routes = Routes()
    routes.add("GET", "/v1/models", file_reply("llama_server_models.json"))
    routes.add("GET", "/props", file_reply(props))
    routes.add("GET", "/slots", file_reply("llama_server_slots.json"))
    routes.add("POST", "/v1/chat/completions", file_reply("llama_server_chat_stream.sse"))
    return routes


def test_llama_server_that_takes_k_per_request_gets_the_presets_k():
    routes = _llama_routes("llama_server_props_k_per_request.json")
    with FixtureServer(routes) as server:
        session = _session(server.url)
        assert not session.info.k_by_server
        session.set_mode("code")
        result, _ = _send(session, "Copy this text exactly: The quick brown fox.")
        session.set_overrides(k=0)
        _send(session, "Again without drafting")
    bodies = [b for _, p, b, _ in routes.requests if p == "/v1/chat/completions"]
    k = session.presets["code"].k
    assert (bodies[0]["speculative.n_max"], bodies[0]["speculative.n_min"]) == (k, 0)
    assert bodies[0]["timings_per_token"] is True
    assert bodies[1]["speculative.n_max"] == 0  # drafting off for that request
    stats = result.stats
    assert stats.num_draft_tokens == k and not stats.k_by_server
    # The recorded stream's own counts (its last timings: draft_n 8, draft_n_accepted 4, predicted_n 31).
    assert (stats.drafted_tokens, stats.accepted_tokens, stats.new_tokens) == (8, 4, 31)
    assert f"K {k}" in stats_line(stats) and "K server" not in stats_line(stats)


def test_llama_server_that_fixes_k_gets_no_k_fields():
    routes = _llama_routes("llama_server_props.json")
    with FixtureServer(routes) as server:
        session = _session(server.url)
        assert session.info.k_by_server and session.info.model == "SmolLM2-135M-Instruct.Q4_1.gguf"
        _send(session)
    body = next(b for _, p, b, _ in routes.requests if p == "/v1/chat/completions")
    assert not any(key.startswith("speculative") for key in body)
