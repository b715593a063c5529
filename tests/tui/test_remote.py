"""The real chat app on the remote backend: recorded vLLM responses replayed by a local HTTP server."""

from __future__ import annotations

from engine.backends.remote import RemoteBackend
from engine.config import Settings
from tests.support.remote_fixture_server import FixtureServer, Reply, file_reply, vllm_routes
from tests.support.tui import SIZE, plain, send, status, wait_ready, wait_until
from tui.app import SpecchatApp


async def test_remote_reply_status_bar_says_k_server_and_a_failure_is_one_line():
    routes = vllm_routes()
    routes.add(
        "POST",
        "/v1/chat/completions",
        file_reply("vllm_chat_stream.sse"),
        Reply(502, '{"error": {"message": "upstream worker died", "code": 502}}'),
        file_reply("vllm_chat_stream.sse"),
    )
    with FixtureServer(routes) as server:
        app = SpecchatApp(Settings(preset="qa"), backend=RemoteBackend(server.url))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot)
            assert app.state == "ready"
            bar = status(app)
            assert "K server" in bar and "remote·vllm@127.0.0.1" in bar
            await send(pilot, "What is the capital of France?")
            reply = app.chat.chat_log.replies()[-1]
            assert reply.text.endswith("Eiffel Tower.")
            assert "qa · K server" in reply.header
            line = plain(reply.query_one(".stats"))
            assert "accept 56% (10/18)" in line and "K server" in line
            assert "accept 56%" in status(app)
            # The server fails before its first token: one line in a toast, the message back in the prompt
            # (nothing was kept), and the chat goes on.
            await send(pilot, "And of Spain?", wait=False)
            await wait_until(
                pilot, lambda: app.chat.prompt.text == "And of Spain?" and not app.chat.generating
            )
            assert len(app.chat.chat_log.replies()) == 1
            toasts = [str(n.message) for n in app._notifications]
            assert any("failed (502: upstream worker died): see the server's log" in t for t in toasts)
            await send(pilot, "And of Italy?")
            assert app.chat.chat_log.replies()[-1].text.endswith("Eiffel Tower.")
