"""`specchat history ...`, `specchat metrics ...`, `generate --save` and `--chat ID`, on a real data folder."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from engine.backends.scripted import ScriptedBackend
from engine.config import Settings
from engine.presets import load_presets
from engine.session import ChatSession
from tui.cli import main


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(folder))
    return folder


def fill(data_dir: Path) -> tuple[int, int, list]:
    """Two chats: the first with two exchanges, the second with one."""
    backend = ScriptedBackend(["Paris is the capital.", "About two million people.", "Hello!"])
    session = ChatSession(Settings(data_dir=data_dir), backend=backend, presets=load_presets(None), save=True)
    session.load()
    session.set_mode("qa")
    results = [
        session.send("What is the capital of France?", lambda e: None, threading.Event()),
        session.send("How many people live there?", lambda e: None, threading.Event()),
    ]
    first = session.chat_id
    session.new_chat()
    results.append(session.send("Say hello", lambda e: None, threading.Event()))
    assert first is not None and session.chat_id is not None
    return first, session.chat_id, results


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_history_list_show_export_delete(data_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path):
    first, second, results = fill(data_dir)
    code, out, err = run(capsys, "history", "list")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == [str(second), str(first)]  # newest first
    assert lines[1].endswith("What is the capital of France?") and "4 msgs" in lines[1]
    code, out, _ = run(capsys, "history", "list", "--json")
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == [second, first]
    code, out, _ = run(capsys, "history", "list", "--search", "million")
    assert [line.split()[0] for line in out.splitlines()] == [str(first)]

    code, out, _ = run(capsys, "history", "show", str(first))
    assert code == 0
    assert "How many people live there?" in out and "About two million people." in out
    assert (
        out.count("tok/s") == 2 and "auto" not in out.split("\n", 1)[1]
    )  # stats lines, preset chosen by hand

    code, out, _ = run(capsys, "history", "export", str(first), "--format", "json")
    record = orjson.loads(out)
    assert [m["text"] for m in record["messages"]] == [
        "What is the capital of France?",
        "Paris is the capital.",
        "How many people live there?",
        "About two million people.",
    ]
    assert record["messages"][3]["stats"]["accepted_tokens"] == results[1].stats.accepted_tokens
    target = tmp_path / "chat.md"
    code, out, err = run(capsys, "history", "export", str(first), "-o", str(target))
    assert code == 0 and out == "" and str(target) in err
    markdown = target.read_text()
    assert markdown.startswith("# What is the capital of France?") and "## Assistant" in markdown

    code, out, _ = run(capsys, "history", "delete", str(second))
    assert code == 0 and f"deleted chat {second}" in out
    code, out, _ = run(capsys, "history", "list")
    assert [line.split()[0] for line in out.splitlines()] == [str(first)]


@pytest.mark.parametrize("action", ["show", "export", "delete"])
def test_unknown_chat_id_is_one_line_and_exit_2(
    data_dir: Path, capsys: pytest.CaptureFixture[str], action: str
):
    fill(data_dir)
    code, out, err = run(capsys, "history", action, "999")
    assert code == 2 and out == ""
    assert err == "specchat: error: no chat with id 999 (see: specchat history list)\n"


def test_history_bad_id_and_empty_history(data_dir: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        main(["history", "show", "abc"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    code, out, err = run(capsys, "history", "list")
    assert code == 0 and out == "" and "no saved chats yet" in err


def test_metrics_json_csv_table_and_check(data_dir: Path, capsys: pytest.CaptureFixture[str]):
    _, _, results = fill(data_dir)
    code, out, _ = run(capsys, "metrics", "--json")
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == 3
    assert [(r["accepted_tokens"], r["drafted_tokens"]) for r in rows] == [
        (r.stats.accepted_tokens, r.stats.drafted_tokens) for r in results
    ]
    code, out, _ = run(capsys, "metrics", "--csv")
    assert out.splitlines()[0].startswith("v,timestamp,prompt_tokens") and len(out.splitlines()) == 4
    code, out, _ = run(capsys, "metrics", "--by", "preset", "--json")
    (group,) = [orjson.loads(line) for line in out.splitlines()]
    assert group["key"] == "qa" and group["replies"] == 3
    code, out, _ = run(capsys, "metrics")
    assert code == 0 and "replies" in out and "acceptance and speed per reply" in out
    code, out, _ = run(capsys, "metrics", "--check")
    assert code == 0 and out.startswith("no regressions")


def test_metrics_check_names_the_drop(data_dir: Path, capsys: pytest.CaptureFixture[str]):
    import time

    from engine.storage import metrics
    from tests.support.metrics_rows import baseline_rows, recent_rows

    shift = time.time() - 1_800_000_000.0  # the synthetic series ends now
    for row in baseline_rows(acceptance=0.7) + recent_rows(acceptance=0.5):
        metrics.append(data_dir / "metrics.jsonl", {**row, "timestamp": row["timestamp"] + shift})
    code, out, _ = run(capsys, "metrics", "--check")
    assert code == 1
    (line,) = out.splitlines()
    assert line.startswith("regression: m + ngram [qa, abc]: acceptance 70% -> 50% (20 points) since ")


@pytest.mark.parametrize("since", ["seven days", "7", "0h", "-1d"])
def test_metrics_malformed_since(data_dir: Path, capsys: pytest.CaptureFixture[str], since: str):
    code, out, err = run(capsys, "metrics", f"--since={since}")
    assert code == 2 and out == ""
    assert err.startswith("specchat: error: --since must be") and len(err.splitlines()) == 1


def test_chat_with_unknown_id_fails_before_the_app(data_dir: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = run(capsys, "--chat", "12345")
    assert code == 2 and err == "specchat: error: no chat with id 12345 (see: specchat history list)\n"


@pytest.mark.slow
def test_generate_stores_only_with_save(
    data_dir: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
):
    base = ["generate", "--model", str(tiny_model_dir), "--max-new-tokens", "6", "--temperature", "0"]
    code, _, _ = run(capsys, *base, "--prompt", "not kept")
    assert code == 0 and not (data_dir / "specchat.db").exists() and not (data_dir / "metrics.jsonl").exists()
    code, out, _ = run(capsys, *base, "--prompt", "kept", "--save", "--json")
    assert code == 0
    reply = orjson.loads(out)
    code, out, _ = run(capsys, "history", "export", "1", "--format", "json")
    record = orjson.loads(out)
    assert [m["text"] for m in record["messages"]] == ["kept", reply["text"]]
    (row,) = [orjson.loads(line) for line in (data_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert row["new_tokens"] == reply["stats"]["new_tokens"] and row["model_path"] == str(tiny_model_dir)
    assert row["backend"] == "transformers"
