"""Real processes against one data folder: kill -9 in the middle of a reply, and two chats writing at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from engine.storage.store import Store
from tests.support import paths
from tests.support.history_worker import FIRST_REPLY, LONG_REPLY

REPO = paths.ROOT


def start_worker(data_dir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.history_worker", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )


def test_kill_9_mid_reply_loses_at_most_the_last_second(tmp_path: Path):
    proc = start_worker(tmp_path, "long")
    assert proc.stdout is not None
    lines: list[dict] = []
    first_chunk_t = None
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            raw = proc.stdout.readline()
            assert raw, f"worker ended early: {proc.stderr.read().decode() if proc.stderr else ''}"
            record = orjson.loads(raw)
            lines.append(record)
            if "t" in record:
                first_chunk_t = first_chunk_t or record["t"]
                # Just before the 8th half-second flush: a slower flush cadence (say every 2 s) would have
                # written last at 2.0 s and miss what streamed by 2.8 s.
                if time.time() - first_chunk_t > 3.8:
                    break
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    lines += [orjson.loads(line) for line in rest.splitlines() if line.strip()]
    assert not any("finished" in r for r in lines), "the reply ended before the kill: the test proves nothing"
    # What had streamed one second before the kill must be on disk.
    owed = max((r["chars"] for r in lines if "t" in r and r["t"] <= killed_at - 1.0), default=0)
    assert owed > 0

    store = Store.open(tmp_path)
    (chat,) = store.chats()
    messages = store.conversation(chat.id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0].text == "first question" and messages[2].text == "second question, answered at length"
    assert messages[1].text == FIRST_REPLY and messages[1].stop_reason == "end_of_turn"
    reply = messages[3]
    assert reply.interrupted  # no stop reason: the process died while it streamed
    assert LONG_REPLY.startswith(reply.text)
    assert len(reply.text) >= owed, f"saved {len(reply.text)} chars, {owed} had streamed 1 s before the kill"
    assert len(reply.text) < len(LONG_REPLY)
    # The metrics log holds the finished first reply only, as one intact line.
    rows = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert [r["message_id"] for r in rows] == [messages[1].id]


def test_two_processes_share_one_data_folder(tmp_path: Path):
    count = 40
    procs = [start_worker(tmp_path, "many", str(count), tag) for tag in ("alpha", "beta")]
    for proc in procs:
        assert proc.stdout is not None and orjson.loads(proc.stdout.readline()) == {"ready": True}
    (tmp_path / "go").touch()
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert orjson.loads(out.splitlines()[-1])["notices"] == []  # nobody fell back to memory
    store = Store.open(tmp_path)
    chats = store.chats()
    assert len(chats) == 2
    for chat in chats:
        messages = store.conversation(chat.id)
        assert len(messages) == 2 * count
        tag = messages[0].text.split()[0]
        assert [m.text for m in messages if m.role == "user"] == [f"{tag} message {i}" for i in range(count)]
        assert all(m.stop_reason == "end_of_turn" for m in messages if m.role == "assistant")
    rows = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert len(rows) == 2 * count
