"""The chat app on a remote server that misbehaves (issue 18): figures it cannot read are "–" in the inspector
and a capped stream is the one-line reply failure, never the worker-error dialog."""

from __future__ import annotations

from engine.backends.remote import RemoteBackend
from engine.config import Settings
from tests.support.remote_fixture_server import (
    FixtureServer,
    Reply,
    endless_line,
    vllm_metrics_routes,
    vllm_routes,
    with_second_engine,
)
from tests.support.tui import SIZE, plain, send, wait_ready, wait_until
from tui.app import SpecchatApp
from tui.screens.error import ErrorScreen
from tui.screens.inspector import InspectorScreen


async def test_metrics_at_inf_give_a_reply_with_dashes_not_an_error_dialog():
    routes = vllm_metrics_routes(with_second_engine("+Inf"))
    routes.add("POST", "/tokenize", Reply(200, "<html>not json</html>", "text/html"))
    with FixtureServer(routes) as server:
        app = SpecchatApp(Settings(preset="qa"), backend=RemoteBackend(server.url))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot)
            await send(pilot, "What is the capital of France?")
            reply = app.chat.chat_log.replies()[-1]
            assert reply.text.endswith("Eiffel Tower.") and reply.stats is not None
            assert "accept –" in plain(reply.query_one(".stats"))
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: isinstance(app.screen, InspectorScreen))
            fields = plain(app.screen.query_one("#inspector-fields"))
            assert "–  (the server's /metrics counters are not usable numbers" in fields
            assert not any(isinstance(s, ErrorScreen) for s in app.screen_stack)


async def test_an_endless_stream_line_is_the_one_line_reply_failure():
    routes = vllm_routes()
    routes.add("POST", "/v1/chat/completions", Reply(content_type="text/event-stream", chunks=endless_line))
    with FixtureServer(routes) as server:
        app = SpecchatApp(Settings(preset="qa"), backend=RemoteBackend(server.url))
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot)
            await send(pilot, "What is the capital of France?")
            await wait_until(pilot, lambda: not app.chat.generating)
            toasts = [str(n.message) for n in app._notifications]
            assert any("sent an event-stream line longer than 1 MiB in its reply" in t for t in toasts), (
                toasts
            )
            assert not any(isinstance(s, ErrorScreen) for s in app.screen_stack)
            assert app.session.turns[-1].content == "The capital of France is"  # the partial reply is kept
