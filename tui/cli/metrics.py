"""`specchat metrics`: acceptance, τ, tok/s and TTFT over time from the metrics log; `--check` names regressions."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", default="7d", help="how far back: 30m, 12h, 7d (default), 2w")
    parser.add_argument(
        "--by", choices=["day", "preset", "model"], help="group rows (default: day, in the table)"
    )
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON lines: one per reply (or per group with --by)")
    fmt.add_argument("--csv", action="store_true", help="CSV: one row per reply (or per group with --by)")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 naming any regression (acceptance or tok/s drop)"
    )


def run(args: argparse.Namespace) -> int:
    import shutil

    import orjson

    from engine.config import data_dir, load_settings
    from engine.storage import metrics

    since = metrics.parse_since(args.since)  # MetricsError: one line, exit 2
    path = data_dir(load_settings()) / metrics.METRICS_NAME
    rows = metrics.read(path, since)
    if args.check:
        # The baseline reaches 7 days behind the recent replies: read enough of the log for it.
        found = metrics.find_regressions(metrics.read(path))
        for regression in found:
            print(f"regression: {regression.describe()}")
        if not found:
            print(f"no regressions ({len(rows)} replies in the last {args.since})")
        return 1 if found else 0
    summaries = metrics.summarize(rows, args.by) if args.by else None
    if args.json:
        out = [s.to_dict() for s in summaries] if summaries is not None else rows
        for row in out:
            sys.stdout.buffer.write(orjson.dumps(row) + b"\n")
        sys.stdout.flush()
        return 0
    if args.csv:
        out = [s.to_dict() for s in summaries] if summaries is not None else rows
        sys.stdout.write(metrics.to_csv(out) if out else "")
        return 0
    if not rows:
        print(f"no replies in the metrics log for the last {args.since} ({path})")
        return 0
    by = args.by or "day"
    print(metrics.format_table(summaries or metrics.summarize(rows, by), by))
    if len(rows) >= 2:
        width = max(40, min(shutil.get_terminal_size((100, 24)).columns, 120))
        print()
        print(metrics.plot(rows, width=width, color=sys.stdout.isatty()))
    return 0
