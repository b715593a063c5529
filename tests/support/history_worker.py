"""A real specchat chat process for the store's fault tests (run by
tests/engine/storage/test_store_across_processes.py).

    python -m tests.support.history_worker DATA_DIR MODE [COUNT]

MODE "long": one short exchange, then a long reply streamed at 40 tokens/s; every chunk is reported on stdout as
a JSON line {"t": wall time, "chars": reply length so far} so the test knows what existed when it killed us.
MODE "many": COUNT quick exchanges in one chat, started when DATA_DIR/go appears (two run at once).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import orjson

from engine.backends.scripted import ScriptedBackend, scripted_words
from engine.config import Settings
from engine.events import Chunk
from engine.presets import load_presets
from engine.session import ChatSession

FIRST_REPLY = "The first answer is short."
LONG_REPLY = scripted_words(600, width=10)


def report(record: dict) -> None:
    sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    sys.stdout.flush()


def main() -> int:
    data_dir, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "long":
        backend = ScriptedBackend([FIRST_REPLY, LONG_REPLY], tokens_per_s=40)
    else:
        backend = ScriptedBackend(["reply one two three four five six seven"])
    session = ChatSession(Settings(data_dir=data_dir), backend=backend, presets=load_presets(None), save=True)
    session.load()
    session.set_mode("qa")
    if mode == "long":
        session.send("first question", lambda e: None, threading.Event())
        report({"first_done": True, "chat_id": session.chat_id})
        chars = 0

        def on_event(event: object) -> None:
            nonlocal chars
            if isinstance(event, Chunk):
                chars += len(event.text)
                report({"t": time.time(), "chars": chars})

        session.send("second question, answered at length", on_event, threading.Event())
        report({"finished": True})
        return 0
    tag = sys.argv[4] if len(sys.argv) > 4 else "w"
    report({"ready": True})
    while not (data_dir / "go").exists():  # start together with the other process: maximum overlap
        time.sleep(0.01)
    for i in range(int(sys.argv[3])):
        session.send(f"{tag} message {i}", lambda e: None, threading.Event())
    report({"chat_id": session.chat_id, "notices": session.take_notices()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
