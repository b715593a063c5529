"""llama.cpp's own `llama-server`, as `make llama-server` builds it (scripts/build_llama_server.sh), run on a
loopback port: the CPU peer in `specchat bench` and the real server of the remote backend's tests.

`llama_server_binary()` says where it is, or why there is none (never built / the build failed), so callers can
skip with that reason. `LlamaServer` starts it on a GGUF and waits until the model is loaded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from engine.backends.llamacpp.library import physical_cores
from engine.backends.llamacpp.native import choose_repack

VERSION = "0.3.36"  # the llama-cpp-python sdist whose llama.cpp source scripts/build_llama_server.sh builds


def draft_simple_args(draft: Path) -> tuple[str, ...]:
    """llama-server's draft-model speculation as its users start it: `-md DRAFT --spec-type draft-simple` (the
    draft inherits `-t` and the repacking choice: llama.cpp copies the target's parameters for it)."""
    return ("-md", str(draft), "--spec-type", "draft-simple", "-ngld", "0")


def server_dir() -> Path:
    explicit = os.environ.get("SPECCHAT_LLAMA_SERVER_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specchat" / f"llama-server-{VERSION}"


def llama_server_binary() -> tuple[Path | None, str]:
    """(path, "") when built, else (None, why not)."""
    folder = server_dir()
    binary = folder / "bin" / "llama-server"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary, ""
    failed = folder / "FAILED"
    if failed.is_file():
        return None, f"llama-server build failed: {failed.read_text().strip()}"
    return None, f"llama-server is not built ({binary} missing): run make llama-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """`llama-server -m GGUF --port P --metrics [--spec-type ngram-mod] [--no-repack] ...`; stop() kills it
    (SIGKILL: a crash). `--no-repack` where the CPU has AMX (llama.cpp's AMX repack crashes there)."""

    def __init__(
        self,
        gguf: Path,
        *,
        spec: bool = True,
        port: int | None = None,
        extra: tuple[str, ...] = (),
        threads: int | None = None,
        context: int = 2048,
    ):
        # None: one thread per physical core this process may use, as our own llama.cpp backend starts from.
        threads = threads or physical_cores()
        binary, why = llama_server_binary()
        if binary is None:
            raise RuntimeError(why)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics", "--slots", "-c", str(context), "-t", str(threads), "-np", "1", "--no-webui",
        ]  # fmt: skip
        if spec:
            self.args += ["--spec-type", "ngram-mod"]
        # --no-repack where llama.cpp's AMX weight repacking crashes (engine.backends.llamacpp.native).
        self.repack = choose_repack(exact=False)
        self.args += self.repack.server_args()
        self.args += list(extra)
        self.proc: subprocess.Popen | None = None
        # A file, not a pipe: nobody drains a pipe while a caller runs; closed by close().
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    def log_tail(self, chars: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]

    def start(self, timeout: float = 120.0) -> LlamaServer:
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become ready in {timeout:.0f} s")

    def kill(self) -> None:
        """Die at once, as a crashed server does (no graceful close of open streams)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self._log.close()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
