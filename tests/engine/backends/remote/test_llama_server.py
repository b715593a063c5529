"""The remote backend against llama.cpp's real `llama-server` (built by `make llama-server`), on the embedded
model's GGUF with n-gram drafting (`--spec-type ngram-mod`) and `--metrics`, on a loopback port.

These skip, saying why, only where the binary is missing (the build failed, or was never run).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from engine.backends.remote import RemoteBackend
from engine.backends.remote.servers import spec_counters
from engine.benchmarks.llama_server import LlamaServer, free_port, llama_server_binary
from engine.config import load_settings
from engine.errors import BackendError
from engine.events import Chunk, ReplyFailed, ReplyFinished
from tests.support.threads import fixed_threads
from tui.formatting import stats_line

pytestmark = pytest.mark.slow

BINARY, WHY = llama_server_binary()
needs_server = pytest.mark.skipif(BINARY is None, reason=WHY)

# Small drafts, so the 135M model accepts some (llama-server's ngram-mod default drafts 48..64 tokens).
SMALL_DRAFTS = ("--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "4")
# A reply that repeats itself: ngram-mod drafts from the text generated so far (and from earlier requests).
REPEATING = (
    "Copy this text exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the "
    "lazy dog. The quick brown fox jumps over the lazy dog."
)


@pytest.fixture(scope="module")
def gguf():
    from engine.models import ensure_embedded_gguf

    return ensure_embedded_gguf()


def _session(url: str):
    from engine.session import ChatSession

    session = ChatSession(load_settings(), backend=RemoteBackend(url))
    session.load()
    session.set_mode("code")
    session.set_overrides(temperature=0.0, max_new_tokens=96)
    return session


def _metrics(url: str):
    return spec_counters("llama-server", httpx.get(f"{url}/metrics", timeout=5).text)


@needs_server
def test_reply_streams_with_the_servers_draft_counts_live_and_in_the_stats_line(gguf):
    with LlamaServer(gguf, extra=SMALL_DRAFTS) as server:
        session = _session(server.url)
        info = session.info
        assert info.backend == "remote" and info.device.startswith("llama-server@")
        assert info.draft_mode == "server" and info.k_by_server  # this llama.cpp ignores per-request K
        assert info.max_context == 2048
        before = _metrics(server.url)
        live_seen: list[int] = []
        chunks: list[Chunk] = []

        def on_event(event):
            if isinstance(event, Chunk):
                chunks.append(event)
                if session.live.acceptance_rate is not None and session.active is not None:
                    live_seen.append(len(chunks))  # which chunk first knew the acceptance

        result = session.send(REPEATING, on_event, threading.Event())
        after = _metrics(server.url)
    assert isinstance(result, ReplyFinished) and result.text.strip()
    stats = result.stats
    assert stats.drafted_tokens > 0
    # The reply's draft counts are the server's: its /metrics counters moved by exactly as much.
    delta = after.minus(before)
    assert (stats.drafted_tokens, stats.accepted_tokens) == (int(delta.draft_tokens), int(delta.accepted))
    assert stats.alpha is not None  # rounds came from /metrics
    assert len(chunks) > 3 and sum(c.n_tokens for c in chunks) == stats.new_tokens
    # Live: the acceptance was known while the reply still streamed (from per-token timings).
    assert live_seen and live_seen[0] < len(chunks) - 3, "acceptance known only at the end, not live"
    line = stats_line(stats)
    assert f"({stats.accepted_tokens}/{stats.drafted_tokens})" in line and "K server" in line


@needs_server
def test_the_servers_k_changes_what_it_drafts_and_is_not_claimed(gguf):
    """This llama.cpp takes no per-request K (server-schema.cpp keeps speculative.n_max under #if 0): the
    server's own --spec-ngram-mod-n-max bounds each draft, and specchat sends none and claims none."""
    per_round = {}
    for n_max in (2, 8):
        extra = ("--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(n_max))
        with LlamaServer(gguf, extra=extra) as server:
            session = _session(server.url)
            before = _metrics(server.url)
            result = session.send(REPEATING, lambda _e: None, threading.Event())
            delta = _metrics(server.url).minus(before)
        assert isinstance(result, ReplyFinished)
        assert result.stats.num_draft_tokens == 0 and result.stats.k_by_server
        assert delta.drafts > 0
        per_round[n_max] = delta.draft_tokens / delta.drafts
    assert per_round[2] <= 2.0
    assert per_round[8] > per_round[2]


@needs_server
def test_killed_server_mid_reply_is_one_line_partial_kept_and_the_chat_goes_on(gguf):
    port = free_port()
    server = LlamaServer(gguf, port=port, extra=SMALL_DRAFTS).start()
    try:
        session = _session(server.url)
        session.set_overrides(temperature=0.0, max_new_tokens=400)
        killed = threading.Event()

        def on_event(event):
            if isinstance(event, Chunk) and session.live.new_tokens >= 12 and not killed.is_set():
                killed.set()
                server.kill()

        result = session.send("Write a long story about a lighthouse keeper.", on_event, threading.Event())
        assert killed.is_set()
        assert isinstance(result, ReplyFailed)
        assert "\n" not in result.message
        assert result.message.startswith(f"the server at {server.url} dropped the connection mid-reply")
        assert result.partial_text.strip() and session.turns[-1].content == result.partial_text
        # While it is down: one line, and the question goes back to the prompt (nothing lost).
        down = session.send("Are you there?", lambda _e: None, threading.Event())
        assert isinstance(down, ReplyFailed) and down.message.startswith("cannot reach the server")
        assert down.undone
        server.stop()
        server = LlamaServer(gguf, port=port, extra=SMALL_DRAFTS).start()
        again = session.send("What is 2 + 2?", lambda _e: None, threading.Event())
        assert isinstance(again, ReplyFinished) and again.text.strip()
    finally:
        server.close()


@needs_server
def test_api_key_is_read_from_the_environment_and_401_is_clear(gguf, monkeypatch):
    with LlamaServer(gguf, extra=("--api-key", "sk-local-test")) as server:
        with pytest.raises(BackendError, match="refused the request \\(401.*--api-key-env"):
            RemoteBackend(server.url).load()
        monkeypatch.setenv("SPECCHAT_TEST_KEY", "sk-local-test")
        backend = RemoteBackend(server.url, api_key_env="SPECCHAT_TEST_KEY")
        backend.load()
        assert backend.info.backend == "remote"
        backend.close()


@needs_server
def test_generate_command_runs_on_the_remote_backend(gguf, capsys, tmp_path, monkeypatch):
    from tui.cli import main

    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path))
    with LlamaServer(gguf, extra=SMALL_DRAFTS) as server:
        start = time.monotonic()
        code = main(
            [
                "generate", "--backend", "remote", "--endpoint", server.url, "--prompt", "Say hello.",
                "--max-new-tokens", "16", "--json",
            ]
        )  # fmt: skip
        assert time.monotonic() - start < 120
    captured = capsys.readouterr()
    assert code == 0, captured.err
    import json

    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["text"].strip() and record["stats"]["backend"] == "remote"
    assert record["stats"]["k_by_server"] is True
    assert "llama-server: sends temperature" in captured.err


@needs_server
def test_bench_peer_runs_llama_cpps_own_server_plain_and_ngram(gguf):
    import io

    from engine.benchmarks.remote import bench_llama_server_peer

    out = io.StringIO()
    prompts = [{"category": "code", "prompt": REPEATING}]
    results = bench_llama_server_peer(gguf, prompts, 48, out, threads=fixed_threads(), context=1024)
    text = out.getvalue()
    assert results is not None, text
    plain, ngram = results["llama-server plain"], results["llama-server ngram"]
    assert plain.tokens > 0 and ngram.tokens > 0
    assert plain.drafted == 0 and ngram.drafted > 0  # only the --spec-type ngram-mod server drafts
    assert "llama-server plain" in text and "llama-server ngram vs plain:" in text


@needs_server
def test_the_server_answers_on_a_quantized_gguf():
    # The embedded model's Q4_1 GGUF: weights llama.cpp's AMX path repacks (and crashes on, on some Xeons);
    # LlamaServer passes --no-repack there. The child-process check first, so a crash fails this test alone.
    from engine.models import ensure_embedded_gguf
    from tests.support.native_guard import survives

    q4_1 = ensure_embedded_gguf(precision="q4_1")
    survives(q4_1)
    with LlamaServer(q4_1, spec=True) as server:
        assert server.proc is not None and server.proc.poll() is None
        session = _session(server.url)
        session.set_mode("qa")
        session.set_overrides(temperature=0.0, max_new_tokens=24)
        # Greedy: the Q4_1 model answers this phrasing right (the bare "What is the capital of France?" it does not).
        question = "What is the capital city of France? Answer in one sentence."
        result = session.send(question, lambda event: None, threading.Event())
    assert isinstance(result, ReplyFinished) and "Paris" in result.text, result
