"""The metrics log: --since parsing, reading a log with a torn line, trends, the regression rule, fingerprints."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from engine.storage import metrics
from engine.storage.metrics import MetricsError
from tests.support.metrics_rows import DAY, NOW, baseline_rows, recent_rows, row


def series(baseline: list[dict], recent: list[dict]) -> list[dict]:
    return baseline + recent


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 7 * DAY), ("12h", 43200), ("30m", 1800), ("2w", 14 * DAY)]
)
def test_parse_since(text: str, seconds: float):
    assert metrics.parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7 days", "-3d", "0d", "1y"])
def test_parse_since_rejects_malformed(text: str):
    with pytest.raises(MetricsError, match="--since"):
        metrics.parse_since(text)


def test_read_skips_torn_lines_and_filters_by_time(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    metrics.append(path, row(NOW - 10 * DAY))
    metrics.append(path, row(NOW - 1 * DAY, acceptance=0.5))
    with path.open("ab") as f:
        f.write(b'{"timestamp": 17000, "drafted_tok')  # a write cut short by a crash
        f.write(b"\n[1, 2]\n")
    metrics.append(path, row(NOW - 60, acceptance=0.7))
    with path.open("ab") as f:
        f.write(b'{"timestamp": 1800000000, "accep')  # killed mid-write, no newline
    metrics.append(path, row(NOW - 30, acceptance=0.8))  # still its own line
    rows = metrics.read(path)
    assert [r["acceptance_rate"] for r in rows] == [0.6, 0.5, 0.7, 0.8]
    assert [r["acceptance_rate"] for r in metrics.read(path, 7 * DAY, now=NOW)] == [0.5, 0.7, 0.8]
    assert metrics.read(tmp_path / "absent.jsonl") == []


def test_an_append_waits_for_another_process_holding_the_log(tmp_path: Path):
    # Two specchat processes append to one log; the torn-line check and the write must be one step (without the
    # lock, a check that read another append half done ended its "torn" line: an empty line in the log).
    import fcntl
    import threading

    path = tmp_path / "metrics.jsonl"
    metrics.append(path, row(NOW - 60))
    before = path.read_bytes()
    with path.open("rb") as other:  # its own open file: as another process's
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        writer = threading.Thread(target=metrics.append, args=(path, row(NOW, acceptance=0.7)))
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and path.read_bytes() == before
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
        writer.join(5)
    assert not writer.is_alive()
    assert [r["acceptance_rate"] for r in metrics.read(path)] == [0.6, 0.7]
    assert b"\n\n" not in path.read_bytes()


def test_summaries_pool_acceptance_and_average_the_rest():
    rows = [
        {**row(NOW, tps=40.0), "drafted_tokens": 10, "accepted_tokens": 9, "preset": "code"},
        {**row(NOW + 1, tps=60.0), "drafted_tokens": 90, "accepted_tokens": 9, "preset": "code"},
        row(NOW + 2, preset="qa"),
    ]
    by_preset = {s.key: s for s in metrics.summarize(rows, "preset")}
    code = by_preset["code"]
    assert code.replies == 2 and code.acceptance == pytest.approx(18 / 100)  # not the mean of 0.9 and 0.1
    assert code.tokens_per_s == pytest.approx(50.0)
    assert by_preset["qa"].replies == 1
    table = metrics.format_table(metrics.summarize(rows, "preset"), "preset")
    assert "code" in table and "18%" in table
    with pytest.raises(MetricsError):
        metrics.summarize(rows, "week")


def test_regression_on_an_8_point_acceptance_drop_not_on_7():
    found = metrics.find_regressions(series(baseline_rows(acceptance=0.60), recent_rows(acceptance=0.52)))
    assert [(r.what, r.preset, r.fingerprint) for r in found] == [("acceptance", "qa", "abc")]
    assert found[0].since == NOW - DAY
    assert "60% -> 52%" in found[0].describe() and "8 points" in found[0].describe()
    assert (
        metrics.find_regressions(series(baseline_rows(acceptance=0.60), recent_rows(acceptance=0.53))) == []
    )


def test_regression_on_a_15_percent_speed_drop_not_on_14():
    found = metrics.find_regressions(series(baseline_rows(tps=100.0), recent_rows(0.6, tps=85.0)))
    assert [r.what for r in found] == ["tok/s"]
    assert metrics.find_regressions(series(baseline_rows(tps=100.0), recent_rows(0.6, tps=86.0))) == []


def test_regression_rule_needs_a_baseline_and_keeps_series_apart():
    # A drop in another fingerprint's series does not count against this one.
    mixed = baseline_rows(acceptance=0.6) + recent_rows(acceptance=0.3, fp="other")
    assert metrics.find_regressions(mixed) == []
    # Baseline older than 7 days before the recent replies: no comparison.
    old = [{**r, "timestamp": r["timestamp"] - 10 * DAY} for r in baseline_rows()]
    assert metrics.find_regressions(old + recent_rows(acceptance=0.2)) == []
    # Cancelled replies are left out of both windows.
    cancelled = [{**r, "stop_reason": "cancelled"} for r in recent_rows(acceptance=0.1)]
    assert metrics.find_regressions(baseline_rows() + cancelled) == []


def test_fingerprint_follows_tokenizer_and_draft(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 10}')
    (model / "tokenizer.json").write_text('{"v": 1}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    base = metrics.fingerprint(model, "ngram")
    assert base == metrics.fingerprint(model, "ngram") and len(base) == 12
    assert metrics.fingerprint(model, "none") != base
    (model / "tokenizer.json").write_text('{"v": 2}')
    changed = metrics.fingerprint(model, "ngram")
    assert changed != base
    (model / "model.safetensors").write_bytes(b"\0" * 65)
    assert metrics.fingerprint(model, "ngram") != changed
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert metrics.fingerprint(copy, "ngram") == metrics.fingerprint(model, "ngram")  # content, not the path


def test_csv_and_plot():
    rows = [row(NOW + i, acceptance=0.5 + i / 100, per_position_acceptance=[1.0, 0.5]) for i in range(5)]
    text = metrics.to_csv(rows)
    header, first, *_ = text.splitlines()
    assert header.split(",")[:3] == ["timestamp", "fingerprint", "preset"]
    assert '"[1.0,0.5]"' in first
    drawn = metrics.plot(rows, width=60, height=12)
    assert "acceptance %" in drawn and "tok/s" in drawn and len(drawn.splitlines()) >= 10
    assert orjson.dumps(metrics.summarize(rows, "day")[0].to_dict())
