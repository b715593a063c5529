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

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away

KEYS_HELP = """\
keys in the chat (binding id in brackets; remap under [keymap] in config.toml, e.g. "reply.cancel" = "ctrl+g"):
  enter             send the message; ctrl+j (shift+enter where reported) adds a new line
  f1 f2 f3 f4       preset auto / code / qa / creative, for the next reply
                    [preset.auto] [preset.code] [preset.qa] [preset.creative]
  ctrl+o            preset picker, user presets too [preset.pick]; ctrl+p: command palette
  escape            stop the reply: partial text kept, the prompt comes back if nothing arrived [reply.cancel]
  ctrl+r            regenerate the last reply (the old one stays as a variant) [reply.regenerate]
  alt+left/right    page the older / newer variants of the last reply, or the branches of a selected message
                    [reply.older_variant] [reply.newer_variant]
  ctrl+e            edit the selected (or last) message; enter resends it as a new branch, esc cancels
                    [reply.edit_last]
  alt+c             continue the last reply where its token limit cut it [reply.continue]
  ctrl+f            find text in the chat; again: the match before [chat.find]
  ctrl+t            attach a text file (a picker); or type /attach PATH ... in the prompt [prompt.attach]
  ctrl+y / ctrl+b   copy the reply / its code blocks, one per press [reply.copy] [reply.copy_code]
  ctrl+s            statistics inspector of the selected reply [reply.inspect]
  alt+up / alt+down select a message (yours or a reply), or click a reply [reply.previous] [reply.next]
  on a reply        enter: stats, ctrl+y: copy, ctrl+b: copy code, f5: help; typing goes to the prompt
                    [message.inspect] [message.copy] [message.copy_code] [message.help]
  pageup/pagedown   scroll the chat from the prompt (shift+pageup/pagedown too) [chat.page_up] [chat.page_down]
  f6                colour text the draft got right [view.draft_highlight]
  f5                help [help.show]     ctrl+l  back to the prompt [prompt.focus]
  f10               compose the message in $VISUAL / $EDITOR (vi if unset) [prompt.editor]
  ctrl+u / alt+a    clear the prompt (ctrl+z brings it back) / select all of it [prompt.clear] [prompt.select_all]
                    an unsent prompt is kept across ctrl+q and comes back at the next start
  ctrl+n            new chat; the last one stays in the history [chat.new]  ctrl+q  quit [app.quit]
  ctrl+h or f7      saved chats: search, open, rename, delete, export [chat.history]
                    (f7 where the terminal sends ctrl+h as backspace)
  f12               settings for this chat: model and draft (reloaded, the chat stays), system prompt,
                    K, temperature, top_p, ramp, drafting [settings.open]
"""

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
        epilog=KEYS_HELP,
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
