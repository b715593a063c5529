"""`specchat tune`: sweep K, temperature, drafting and cache per task; `--apply` writes the winning K into the
presets.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tui.cli.common import CliError, add_model_flags, cli_settings, number_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    tsrc = parser.add_mutually_exclusive_group()
    tsrc.add_argument(
        "--prompts", type=Path, help="JSON Lines file: {'prompt', 'category'?: code|qa|creative} per line"
    )
    tsrc.add_argument(
        "--from-history", action="store_true", help="your own past messages from the conversation store"
    )
    parser.add_argument("--quick", action="store_true", help="one prompt per task, short replies, one repeat")
    parser.add_argument(
        "--tasks", default="code,qa,creative", help="tasks to tune (default: code,qa,creative)"
    )
    parser.add_argument("--k-values", help="K values to sweep (default: 0,1,2,3,4,5,6,7,8)")
    parser.add_argument("--temperatures", help="temperatures to sweep (default: 0.1,0.5,0.7,1.0,1.2)")
    parser.add_argument("--max-new-tokens", type=int, help="reply length per run (default 128, quick 48)")
    parser.add_argument("--prompts-per-task", type=int, help="prompts per task (default 3, quick 1)")
    parser.add_argument(
        "--no-cache-sweep", action="store_true", help="skip the second load in the other cache mode"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per measured row, one per line")
    parser.add_argument(
        "--output", type=Path, help="folder for the CSV and JSON results (default: data/tune)"
    )
    parser.add_argument(
        "--apply", action="store_true", help="write the winning K (and ramp) into your preset files"
    )


def run(args: argparse.Namespace) -> int:
    from engine.benchmarks.tune import (
        builtin_prompts,
        prompts_from_history,
        prompts_from_jsonl,
        run_tune,
        write_outputs,
    )
    from engine.config import data_dir
    from engine.models import progress_printer

    plan = _plan(args)
    settings = cli_settings(args)
    if args.prompts is not None:
        prompts = prompts_from_jsonl(args.prompts)
    elif args.from_history:
        prompts = prompts_from_history(data_dir(settings))
    else:
        prompts = builtin_prompts()
    result = run_tune(settings, prompts, plan, load_progress=progress_printer(settings.model))
    for note in result.notes:
        print(f"specchat: {note}", file=sys.stderr)
    csv_path, json_path = write_outputs(result, args.output or data_dir(settings) / "tune")
    _print_result(args, result)
    print(f"specchat: tune took {result.seconds:.0f} s; wrote {csv_path} and {json_path}", file=sys.stderr)
    if args.apply:
        _apply(args, result, json_path)
    return 0


def _plan(args: argparse.Namespace) -> Any:
    """The sweep the flags ask for (a TunePlan), or a CliError for a flag out of range."""
    from engine.benchmarks.tune import TASKS, TunePlan

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise CliError(f"--tasks: choose from code, qa, creative (got {args.tasks!r})")
    changes: dict[str, Any] = {"tasks": tasks}
    k_values = number_list(args.k_values, "--k-values", int, 0, 16)
    if k_values is not None:
        changes["k_values"] = tuple(sorted(set(k_values) | {0}))  # plain decoding is every speedup's base
    temperatures = number_list(args.temperatures, "--temperatures", float, 0.0, 5.0)
    if temperatures is not None:
        changes["temperatures"] = temperatures
    if args.max_new_tokens is not None:
        if args.max_new_tokens < 4:
            raise CliError(f"--max-new-tokens must be at least 4 (got {args.max_new_tokens})")
        changes["max_new_tokens"] = args.max_new_tokens
    if args.prompts_per_task is not None:
        if args.prompts_per_task < 1:
            raise CliError(f"--prompts-per-task must be at least 1 (got {args.prompts_per_task})")
        changes["prompts_per_task"] = args.prompts_per_task
    if args.no_cache_sweep:
        changes["sweep_cache"] = False
    return TunePlan.quick(**changes) if args.quick else TunePlan(**changes)


def _print_result(args: argparse.Namespace, result: Any) -> None:
    """The rows as JSON Lines (--json), or the tables and the plot."""
    import shutil

    import orjson

    from engine.benchmarks.tune import format_tables, plot

    if args.json:
        for row in result.rows:
            sys.stdout.buffer.write(orjson.dumps(row.to_dict()) + b"\n")
        sys.stdout.flush()
    else:
        print(format_tables(result))
        width = max(40, min(shutil.get_terminal_size((100, 24)).columns, 120))
        print()
        print(plot(result, width=width, color=sys.stdout.isatty()))


def _apply(args: argparse.Namespace, result: Any, json_path: Path) -> None:
    """--apply: the winning values written into the preset files, each change's diff shown."""
    import time

    from engine.benchmarks.tune.apply import apply_results
    from engine.config import presets_dir

    comment = time.strftime("%Y-%m-%d %H:%M") + f" ({result.backend}, {result.model}; {json_path.name})"
    applied = apply_results(result.decisions, presets_dir(), comment)
    out = sys.stderr if args.json else sys.stdout
    for item in applied:
        print(item.diff, end="", file=out)
        kept = f"; the previous file is kept as {item.backup}" if item.backup else ""
        print(f"specchat: wrote {item.path}{kept}", file=sys.stderr)
    if not applied:
        print("specchat: the presets already hold the winning values; nothing written", file=sys.stderr)
