"""The metrics log: one JSON line per finished reply in `$data_dir/metrics.jsonl`, and what is read from it.

A leaf (orjson, stdlib). Appending is one `write()` of one line on a file opened in append mode, so two
processes can share the log without mixing lines. Readers skip a torn or foreign line instead of failing.

The record holds every `MessageStats` field plus what a regression hunt needs: model, draft, backend, cache
modes, device, software versions, and `fingerprint`, a short hash of the model, draft and tokenizer files (so a
tokenizer file that changed, or a new draft, starts a new series).

Trends: `summarize()` groups rows by day, preset or model (acceptance is pooled: accepted / drafted over the
group; τ, tok/s and TTFT are means). `find_regressions()` applies the alert rule: the last 20 replies of a
fingerprint + preset average 8 or more acceptance points, or 15% tok/s, below the 7 days before them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from engine.errors import UserError
from engine.events import fmt, percent

METRICS_NAME = "metrics.jsonl"
RECORD_VERSION = 1

RECENT_REPLIES = 20
BASELINE_DAYS = 7
MIN_BASELINE_REPLIES = 5
ACCEPTANCE_DROP_POINTS = 8.0
TOKENS_PER_S_DROP = 0.15

# Files whose content identifies a model and its tokenizer (weights are identified by name and size: hashing
# gigabytes per start-up would be too slow).
_CONTENT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
_PACKAGES = ("specchat", "torch", "transformers", "exllamav2", "textual")

_SINCE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class MetricsError(UserError, ValueError):
    """Bad input to the metrics reader (a malformed --since); one line for the user."""


def parse_since(text: str) -> float:
    """`30m`, `12h`, `7d`, `2w` -> seconds."""
    match = _SINCE_RE.match(text or "")
    if match is None:
        raise MetricsError(f"--since must be a number and a unit m, h, d or w, e.g. 7d or 12h (got {text!r})")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise MetricsError(f"--since must be more than zero (got {text!r})")
    return seconds


# --- writing ---------------------------------------------------------------------------------------------


def fingerprint(*folders: str | Path | None) -> str:
    """12 hex digits over the model and draft folders' config/tokenizer file contents and weight file sizes.

    A name that is not a folder (the n-gram drafter, a scripted model) is hashed as the name itself.
    """
    digest = hashlib.sha256()
    for folder in folders:
        if folder is None:
            digest.update(b"\0none")
            continue
        path = Path(folder)
        if not path.is_dir():
            digest.update(b"\0name:" + str(folder).encode())
            continue
        digest.update(b"\0folder")
        for name in _CONTENT_FILES:
            file = path / name
            if file.is_file():
                digest.update(name.encode() + b"\0" + file.read_bytes())
        for file in sorted(path.iterdir()):
            if file.suffix in _WEIGHT_SUFFIXES and file.is_file():
                digest.update(f"{file.name}\0{file.stat().st_size}".encode())
    return digest.hexdigest()[:12]


def software_versions() -> dict[str, str]:
    """Installed versions of the packages that shape the numbers (read from metadata: nothing is imported)."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _lock(fd: int) -> None:
    """An exclusive advisory lock on the open log (released when it is closed); none where fcntl is missing."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


def append(path: Path, record: dict[str, Any]) -> None:
    """Add one line to the log (creating folder and file). Raises OSError when the disk refuses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # The torn-line check and the write as one step among specchat processes: another process's append that
        # crosses a page boundary shows its size before its last bytes, and the check read that line as torn (an
        # empty line in the log, seen with two processes appending at once).
        _lock(fd)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a line torn by a crash: end it, or this record would be lost with it
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(28, "short write to the metrics log")
    finally:
        os.close(fd)


# --- reading ---------------------------------------------------------------------------------------------


def read(path: Path, since_s: float | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """Rows of the log, oldest first; with `since_s`, only those of the last `since_s` seconds."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    cutoff = (now if now is not None else time.time()) - since_s if since_s is not None else None
    rows = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line torn by a crash mid-write: skip it, keep the rest
        if not isinstance(row, dict) or not isinstance(row.get("timestamp"), int | float):
            continue
        if cutoff is not None and row["timestamp"] < cutoff:
            continue
        rows.append(row)
    rows.sort(key=lambda r: r["timestamp"])
    return rows


@dataclass(frozen=True, slots=True)
class Summary:
    key: str
    replies: int
    drafted: int
    accepted: int
    acceptance: float | None  # pooled: accepted / drafted
    tau: float | None
    tokens_per_s: float | None
    ttft_s: float | None
    first: float
    last: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _mean(values: Iterable[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return sum(numbers) / len(numbers) if numbers else None


def summarize_rows(key: str, rows: Sequence[dict[str, Any]]) -> Summary:
    drafted = sum(int(r.get("drafted_tokens") or 0) for r in rows)
    accepted = sum(int(r.get("accepted_tokens") or 0) for r in rows)
    return Summary(
        key=key,
        replies=len(rows),
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else None,
        tau=_mean(r.get("mean_accepted_length") for r in rows),
        tokens_per_s=_mean(r.get("decode_tokens_per_s") for r in rows),
        ttft_s=_mean(r.get("ttft_s") for r in rows),
        first=min(r["timestamp"] for r in rows),
        last=max(r["timestamp"] for r in rows),
    )


def group_key(row: dict[str, Any], by: str) -> str:
    if by == "day":
        return time.strftime("%Y-%m-%d", time.localtime(row["timestamp"]))
    if by == "preset":
        return str(row.get("preset", "?"))
    if by == "model":
        draft = row.get("draft") or "none"
        return f"{row.get('model', '?')} + {draft}"
    raise MetricsError(f"--by must be day, preset or model (got {by!r})")


def summarize(rows: Sequence[dict[str, Any]], by: str = "day") -> list[Summary]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(group_key(row, by), []).append(row)
    summaries = [summarize_rows(key, group) for key, group in groups.items()]
    return sorted(summaries, key=lambda s: s.first)


def recent_average(
    rows: Sequence[dict[str, Any]],
    preset: str,
    count: int = RECENT_REPLIES,
    *,
    model: str | None = None,
    backend: str | None = None,
) -> Summary | None:
    """The last `count` replies of a preset (on `model` and `backend` where given), summarized: the
    inspector's "recent average". Another model's or engine's speed is no yardstick for this reply."""
    mine = [
        r
        for r in rows
        if r.get("preset") == preset
        and (model is None or r.get("model") == model)
        and (backend is None or r.get("backend") == backend)
    ][-count:]
    return summarize_rows(preset, mine) if mine else None


def acceptance_seed(
    rows: Sequence[dict[str, Any]],
    preset: str,
    *,
    model: str,
    draft: str,
    backend: str,
    count: int = RECENT_REPLIES,
) -> tuple[float, ...]:
    """Per-position acceptance r_i of a preset's last `count` drafting replies on this model, draft and backend
    (each reply weighted by its drafted tokens): where adaptive K starts. Empty when there are none."""
    mine = [
        r
        for r in rows
        if r.get("preset") == preset
        and r.get("model") == model
        and str(r.get("draft") or "") == draft
        and r.get("backend") == backend
        and int(r.get("drafted_tokens") or 0) > 0
        and isinstance(r.get("per_position_acceptance"), list)
    ][-count:]
    sums: list[float] = []
    weights: list[float] = []
    for row in mine:
        weight = float(row["drafted_tokens"])
        # A draft model's reply with n-gram rounds beside it: the draft model's own rounds (lookup's long copies
        # would seed its K too high).
        rates = row.get("model_per_position_acceptance")
        for i, rate in enumerate(rates if isinstance(rates, list) else row["per_position_acceptance"]):
            if not isinstance(rate, int | float):
                break
            if i >= len(sums):
                sums.append(0.0)
                weights.append(0.0)
            sums[i] += weight * min(max(float(rate), 0.0), 1.0)
            weights[i] += weight
    return tuple(total / weight for total, weight in zip(sums, weights, strict=True) if weight > 0)


# --- regressions -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Regression:
    fingerprint: str
    preset: str
    model: str
    draft: str
    since: float  # timestamp of the first of the recent replies
    what: str  # "acceptance" or "tok/s"
    baseline: float
    recent: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since))
        if self.what == "acceptance":
            change = f"acceptance {self.baseline * 100:.0f}% -> {self.recent * 100:.0f}% ({(self.baseline - self.recent) * 100:.0f} points)"
        else:
            change = f"tok/s {self.baseline:.1f} -> {self.recent:.1f} ({(1 - self.recent / self.baseline) * 100:.0f}% slower)"
        return f"{self.model} + {self.draft or 'none'} [{self.preset}, {self.fingerprint}]: {change} since {when}"


def find_regressions(rows: Sequence[dict[str, Any]]) -> list[Regression]:
    """The alert rule, per fingerprint + preset: the last 20 replies against the 7 days before the first of them.

    Needs all 20 recent replies and at least 5 baseline replies; cancelled replies are left out.
    """
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("stop_reason") == "cancelled":
            continue
        series.setdefault((str(row.get("fingerprint", "")), str(row.get("preset", ""))), []).append(row)
    found = []
    for (print_, preset), group in series.items():
        group.sort(key=lambda r: r["timestamp"])
        if len(group) < RECENT_REPLIES + MIN_BASELINE_REPLIES:
            continue
        recent = group[-RECENT_REPLIES:]
        since = recent[0]["timestamp"]
        baseline = [
            r for r in group[:-RECENT_REPLIES] if since - BASELINE_DAYS * 86400 <= r["timestamp"] < since
        ]
        if len(baseline) < MIN_BASELINE_REPLIES:
            continue
        before, now = summarize_rows("baseline", baseline), summarize_rows("recent", recent)
        last = recent[-1]
        common = {
            "fingerprint": print_,
            "preset": preset,
            "model": str(last.get("model", "?")),
            "draft": str(last.get("draft") or ""),
            "since": since,
        }
        if (
            before.acceptance is not None
            and now.acceptance is not None
            # rounded: 0.60 - 0.52 is 7.999... points in binary floating point
            and round((before.acceptance - now.acceptance) * 100, 6) >= ACCEPTANCE_DROP_POINTS
        ):
            found.append(
                Regression(**common, what="acceptance", baseline=before.acceptance, recent=now.acceptance)
            )
        if (
            before.tokens_per_s
            and now.tokens_per_s is not None
            and round(1 - now.tokens_per_s / before.tokens_per_s, 6) >= TOKENS_PER_S_DROP
        ):
            found.append(
                Regression(**common, what="tok/s", baseline=before.tokens_per_s, recent=now.tokens_per_s)
            )
    return found


# --- output ----------------------------------------------------------------------------------------------

CSV_SKIP = ("per_position_acceptance", "model_per_position_acceptance", "acceptance_histogram", "versions")


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as CSV: nested fields (versions, lists) as compact JSON in one cell."""
    columns: list[str] = []
    for row in rows:
        for name in row:
            if name not in columns:
                columns.append(name)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: orjson.dumps(v).decode() if isinstance(v, dict | list) else v for k, v in row.items()}
        )
    return out.getvalue()


def format_table(summaries: Sequence[Summary], by: str) -> str:
    def cell(value: float | None, pattern: str) -> str:
        return fmt(value, "{:" + pattern + "}")

    width = max([len(by), *(len(s.key) for s in summaries)])
    header = f"{by:<{width}}  {'replies':>7}  {'accept':>6}  {'τ':>5}  {'tok/s':>7}  {'TTFT s':>7}"
    lines = [header]
    for s in summaries:
        accept = percent(s.acceptance)
        lines.append(
            f"{s.key:<{width}}  {s.replies:>7}  {accept:>6}  {cell(s.tau, '.2f'):>5}  "
            f"{cell(s.tokens_per_s, '.1f'):>7}  {cell(s.ttft_s, '.2f'):>7}"
        )
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], width: int = 80, height: int = 18, color: bool = False) -> str:
    """Acceptance (%) and tok/s per reply, oldest to newest, as a terminal plot (plotext)."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    xs = list(range(1, len(rows) + 1))
    acceptance = [
        (r.get("acceptance_rate") or 0.0) * 100 if r.get("acceptance_rate") is not None else 0.0 for r in rows
    ]
    speed = [float(r.get("decode_tokens_per_s") or 0.0) for r in rows]
    plt.plot(xs, acceptance, label="acceptance %", marker="braille")
    plt.plot(xs, speed, label="tok/s", marker="braille", yside="right")
    plt.xlabel("reply (oldest → newest)")
    plt.title("acceptance and speed per reply")
    drawn = plt.build()
    return drawn if color else plt.uncolorize(drawn)
