"""`specchat`: the chat TUI by default, plus generate / presets / fetch / paths / plan / bench / tune / doctor /
history / metrics.

Each subcommand is a module of this package (`tui/cli/<name>.py`) that owns its arguments (`add_arguments`) and its
run function (`run`), imported only when chosen; the chat is `tui/cli/chat.py`. Every user mistake ends as one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from tui.cli.common import EXIT_USAGE, CliError, OneLineParser, add_model_flags
from tui.keymap import keys_help

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away

# Each subcommand and its one-line help, in the order --help lists them; its module is tui.cli.<name>.
SUBCOMMANDS = {
    "generate": "answer prompts without the UI (plain text or JSON lines)",
    "presets": "list the presets (built-in and user)",
    "fetch": "fetch models into the cache: the embedded one (no names), or named ones, e.g. qwen2.5-coder-1.5b "
    "qwen2.5-coder-0.5b; prints each file",
    "paths": "print where config, presets, cache and data live",
    "plan": "memory plan: weights + KV cache + draft against a GPU budget",
    "bench": "speculative vs plain decoding vs the transformers peer, side by side",
    "tune": "sweep K, temperature, drafting and cache per task; --apply writes the winning K",
    "doctor": "validate: environment, memory, draft compatibility, baseline, context, restart",
    "history": "saved chats: list, show, export, delete",
    "metrics": "acceptance, τ, tok/s and TTFT over time, from the metrics log",
}


def command_module(command: str | None) -> ModuleType:
    """The module of a subcommand (None: the chat)."""
    return importlib.import_module(f"tui.cli.{command or 'chat'}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with `command`'s own arguments; every other subcommand is only its help line (its module is not
    imported)."""
    parser = OneLineParser(
        prog="specchat",
        description="Chat with a local LLM, with speculative decoding you can see and steer.",
        epilog=keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flags(parser)
    parser.add_argument(
        "--preset", help="auto (route each message) or a preset name: code, qa, creative, ..."
    )
    reopen = parser.add_mutually_exclusive_group()
    reopen.add_argument("--resume", action="store_true", help="continue the last chat")
    reopen.add_argument(
        "--chat", type=int, metavar="ID", help="continue the chat with this id (history list)"
    )
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser, metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        if name != command:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        add_arguments = getattr(command_module(name), "add_arguments", None)
        subparser = sub.add_parser(name, help=help_text)
        if add_arguments is not None:
            add_arguments(subparser)
    return parser


def apply_leading_flags(
    parser: argparse.ArgumentParser, leading: argparse.Namespace, args: argparse.Namespace
) -> None:
    """Flags given before the subcommand (`specchat --model X generate`) apply to it: argparse would let the
    subcommand's defaults overwrite them. A flag after the subcommand wins over the same one before it; a flag the
    subcommand does not take is a usage error (one line, exit 2), not silently ignored."""
    command = args.command
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own = {action.dest: action for action in subcommands.choices[command]._actions}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(leading, action.dest, action.default)
        if value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if action.dest not in own:
            parser.exit(
                EXIT_USAGE,
                f"specchat: error: {command} does not take {flag} (see specchat {command} --help)\n",
            )
        if getattr(args, action.dest) == own[action.dest].default:
            setattr(args, action.dest, value)


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    # Two passes, so that only the chosen subcommand's module is imported: the first finds which one the command
    # line names (the subcommands' own arguments are left over), the second parses with that one's arguments.
    chosen, _ = build_parser().parse_known_args(argv)
    parser = build_parser(chosen.command)
    args = parser.parse_args(argv)
    if args.command is not None:
        apply_leading_flags(parser, chosen, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(sys.argv[1:] if argv is None else argv)
    command = command_module(args.command)
    from engine.errors import UserError

    try:
        if args.command is None:  # the chat: take Enter as Enter from the first moment
            with command.TypeAheadEnter():
                return command.run(args)
        status = command.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        # `specchat history list | head -1`: the reader has what it wanted. Quiet, as a tool killed by SIGPIPE;
        # stdout goes to /dev/null so the interpreter's last flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (CliError, UserError) as exc:
        message = " ".join(str(exc).split())
        print(f"specchat: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
