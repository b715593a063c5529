"""A real HTTP server on a loopback port that replays recorded server responses (tests/support/data/remote).

Used where no real server can run here (vLLM, TabbyAPI need GPUs) and for failures a real llama-server does not
produce on demand (a 503, a stream cut after N events). The client side is the real thing: httpx over a socket.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import paths

DATA = paths.DATA / "remote"


@dataclass
class Reply:
    status: int = 200
    body: str = ""
    content_type: str = "application/json"
    # For event streams: send only this many events, then cut the connection (None: all of them).
    cut_after: int | None = None
    cut_cleanly: bool = False  # end the HTTP body properly at the cut (a server that just stops sending)
    delay: float = 0.0  # seconds between events (a server generating at its own pace)
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Location for a redirect
    # A body made on the fly and sent chunked as it comes (a misbehaving server's endless line, a huge page);
    # the client hanging up part way is expected.
    chunks: Callable[[], Iterable[bytes]] | None = None


def redirect(status: int, location: str) -> Reply:
    return Reply(status, "", headers={"Location": location})


def file_reply(name: str) -> Reply:
    text = (DATA / name).read_text(encoding="utf-8")
    if name.endswith(".sse"):
        return Reply(body=text, content_type="text/event-stream")
    if name.endswith(".txt"):
        return Reply(body=text, content_type="text/plain; version=0.0.4")
    return Reply(body=text)


@dataclass
class Routes:
    """(method, path) -> replies, served in turn (the last one repeats)."""

    table: dict[tuple[str, str], list[Reply]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict | None, dict[str, str]]] = field(default_factory=list)

    def add(self, method: str, path: str, *replies: Reply) -> None:
        self.table[(method, path)] = list(replies)

    def next(self, method: str, path: str) -> Reply | None:
        replies = self.table.get((method, path))
        if not replies:
            return None
        return replies.pop(0) if len(replies) > 1 else replies[0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routes: Routes

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _serve(self, method: str) -> None:
        body = None
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                body = None
        path = self.path.split("?", 1)[0]
        self.routes.requests.append((method, path, body, dict(self.headers)))
        reply = self.routes.next(method, path)
        if reply is None:
            reply = Reply(404, json.dumps({"error": {"message": f"no route {path}", "code": 404}}))
        if reply.chunks is not None:
            self._chunked(reply)
            return
        if reply.content_type.startswith("text/event-stream"):
            self._stream(reply)
            return
        data = reply.body.encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _chunked(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            for data in reply.chunks():
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client hung up (what a capped client does): nothing to report
            pass

    def _stream(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [e for e in reply.body.split("\n\n") if e.strip()]
        for index, event in enumerate(events):
            if reply.cut_after is not None and index >= reply.cut_after:
                self.close_connection = True
                if reply.cut_cleanly:
                    break
                self.wfile.flush()
                self.connection.shutdown(2)  # the server "dies": no closing chunk
                return
            if reply.delay and index:
                time.sleep(reply.delay)
            data = (event + "\n\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hangs up mid-stream (the cancel tests) is expected: no traceback in the test log.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FixtureServer:
    def __init__(self, routes: Routes) -> None:
        handler = type("Handler", (_Handler,), {"routes": routes})
        self.routes = routes
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # serve_forever polls for shutdown every poll_interval (0.5 s by default): each server closed cost half a second.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self) -> FixtureServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def vllm_routes(metrics: bool = True) -> Routes:
    routes = Routes()
    routes.add("GET", "/v1/models", file_reply("vllm_models.json"))
    routes.add("GET", "/version", file_reply("vllm_version.json"))
    routes.add("POST", "/tokenize", file_reply("vllm_tokenize.json"))
    routes.add("POST", "/v1/chat/completions", file_reply("vllm_chat_stream.sse"))
    if metrics:
        # load reads once; then the reply's before, then polls and the after reading.
        routes.add(
            "GET",
            "/metrics",
            file_reply("vllm_metrics_before.txt"),
            file_reply("vllm_metrics_before.txt"),
            file_reply("vllm_metrics_after.txt"),
        )
    return routes


def tabby_routes() -> Routes:
    routes = Routes()
    routes.add("GET", "/.well-known/serviceinfo", file_reply("tabby_serviceinfo.json"))
    routes.add("GET", "/v1/models", file_reply("tabby_models.json"))
    routes.add("GET", "/v1/model", file_reply("tabby_model.json"))
    routes.add("GET", "/props", file_reply("tabby_props.json"))
    routes.add("POST", "/v1/chat/completions", file_reply("tabby_chat_stream.sse"))
    return routes


# --- servers that misbehave ---------------------------------------------------------------------------------

MiB = 1 << 20


def vllm_metrics_routes(after: str) -> Routes:
    """vLLM's routes whose /metrics reads the before-page twice, then `after`."""
    routes = vllm_routes(metrics=False)
    routes.add(
        "GET",
        "/metrics",
        file_reply("vllm_metrics_before.txt"),
        file_reply("vllm_metrics_before.txt"),
        Reply(200, after, content_type="text/plain; version=0.0.4"),
    )
    return routes


def with_second_engine(value: str) -> str:
    """vLLM's after-page with a second engine whose counters are `value` (summed over engines by the client)."""
    text = (DATA / "vllm_metrics_after.txt").read_text()
    extra = [
        line.replace('engine="0"', 'engine="1"').rsplit(" ", 1)[0] + f" {value}"
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_") and "_total{" in line
    ]
    return text + "\n".join(extra) + "\n"


def first_events(n: int) -> bytes:
    """The first `n` events of the recorded vLLM reply stream."""
    events = (DATA / "vllm_chat_stream.sse").read_text().split("\n\n")
    return ("\n\n".join(events[:n]) + "\n\n").encode()


def endless_line(total: int = 50 * MiB, piece: int = 64 * 1024) -> Iterator[bytes]:
    """A reply stream whose fifth event is one line of `total` bytes that never ends."""
    yield first_events(4)  # the role chunk, "The", " capital of France", " is"
    yield b"data: "
    block = b"x" * piece
    for _ in range(total // piece):
        yield block
