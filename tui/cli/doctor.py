"""`specchat doctor`: validate the setup (environment, memory, draft compatibility, baseline, context, restart)."""

from __future__ import annotations

import argparse
import sys

from tui.cli.common import CliError, add_model_flags, cli_settings, number_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="reply length per run (default 96)")
    parser.add_argument(
        "--ladder", help="context lengths to climb, e.g. 512,2048 (default: 512, 2k, 4k ... max_context)"
    )
    parser.add_argument(
        "--save-baseline", action="store_true", help="save this run as the baseline even if a check failed"
    )
    parser.add_argument("--no-save", action="store_true", help="compare with the baseline but save nothing")


def run(args: argparse.Namespace) -> int:
    import orjson

    from engine.benchmarks.doctor import DoctorOptions, format_report, run_doctor
    from engine.config import data_dir

    if args.max_new_tokens < 4:
        raise CliError(f"--max-new-tokens must be at least 4 (got {args.max_new_tokens})")
    ladder = number_list(args.ladder, "--ladder", int, 64, 1 << 20)
    if args.save_baseline and args.no_save:
        raise CliError("--save-baseline and --no-save contradict each other")
    settings = cli_settings(args)
    options = DoctorOptions(
        max_new_tokens=args.max_new_tokens,
        ladder=ladder,
        save_baseline=not args.no_save,
        force_save=args.save_baseline,
    )

    def step(text: str) -> None:
        print(f"specchat doctor: {text}...", file=sys.stderr, flush=True)

    report = run_doctor(settings, options, data_dir=data_dir(settings), step=step)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report.to_dict()) + b"\n")
        sys.stdout.flush()
    else:
        print(format_report(report))
    return report.exit_code
