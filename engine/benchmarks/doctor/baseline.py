"""`specchat doctor`'s regression check: the baseline run against the last saved baseline of the same fingerprint
(model + draft + tokenizer files), backend, cache and drafting, by the rule of `specchat metrics --check`; a run
without failures is saved as the new baseline (`<data dir>/doctor/<fingerprint>.json`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from engine.benchmarks.doctor.report import DoctorOptions, DoctorReport
from engine.benchmarks.ladder import MIN_DRAFTED_TO_JUDGE
from engine.storage.metrics import ACCEPTANCE_DROP_POINTS, TOKENS_PER_S_DROP

# What must match for a saved baseline to be compared with this run.
SAME_RUN_KEYS = ("backend", "cache_mode", "draft_mode", "k", "max_new_tokens")


def compare_baseline(previous: dict[str, Any] | None, now: dict[str, Any]) -> tuple[str, str]:
    """(status, reason): the regression rule against the last saved baseline."""
    if previous is None:
        return "pass", "no earlier baseline for this fingerprint, backend, cache and drafting"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(previous.get("timestamp", 0)))
    problems = []
    before_acc, now_acc = previous.get("acceptance"), now.get("acceptance")
    if (
        before_acc is not None
        and now_acc is not None
        and min(previous.get("drafted", 0), now.get("drafted", 0)) >= MIN_DRAFTED_TO_JUDGE
    ):
        drop = round((before_acc - now_acc) * 100, 6)
        if drop >= ACCEPTANCE_DROP_POINTS:
            problems.append(
                f"acceptance {before_acc * 100:.0f}% -> {now_acc * 100:.0f}% ({drop:.0f} points, "
                f"rule: a drop of {ACCEPTANCE_DROP_POINTS:.0f}+ points fails)"
            )
    before_tps, now_tps = previous.get("tokens_per_s"), now.get("tokens_per_s")
    if before_tps and now_tps is not None:
        slower = round(1 - now_tps / before_tps, 6)
        if slower >= TOKENS_PER_S_DROP:
            problems.append(
                f"tok/s {before_tps:.1f} -> {now_tps:.1f} ({slower * 100:.0f}% slower, "
                f"rule: {TOKENS_PER_S_DROP * 100:.0f}%+ fails)"
            )
    if problems:
        return "fail", f"since the baseline of {when}: " + "; ".join(problems)
    return "pass", f"within the rules of the baseline of {when}"


def read_baselines(path: Path) -> list[dict[str, Any]]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def check_regression(
    report: DoctorReport,
    options: DoctorOptions,
    data_dir: Path,
    info,
    k: int,
    max_new: int,
    base: dict[str, Any],
) -> None:
    """This run's baseline (`base`, the baseline check's figures) against the last saved one; saved as the next
    where nothing failed (or `--force-save`)."""
    entry = {
        "timestamp": time.time(),
        "backend": info.backend,
        "cache_mode": info.cache_mode,
        "draft_mode": info.draft_mode,
        "k": k,
        "max_new_tokens": max_new,
        "acceptance": base["acceptance"],
        "drafted": base["drafted"],
        "tau": base["tau"],
        "tokens_per_s": base["tokens_per_s"],
        "ttft_s": base["ttft_s"],
    }
    path = data_dir / "doctor" / f"{report.fingerprint}.json"
    report.baseline_file = str(path)
    history = read_baselines(path)
    previous = next(
        (e for e in reversed(history) if all(e.get(key) == entry[key] for key in SAME_RUN_KEYS)),
        None,
    )
    status, reason_text = compare_baseline(previous, entry)
    report.add("regression", status, reason_text, previous=previous, now=entry)
    if options.force_save or (options.save_baseline and report.ok):
        history.append(entry)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(orjson.dumps(history, option=orjson.OPT_INDENT_2) + b"\n")
            report.baseline_saved = True
        except OSError as exc:
            report.add("regression", "warn", f"could not save the baseline to {path}: {exc.strerror or exc}")
