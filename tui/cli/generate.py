"""`specchat generate`: answer prompts without the UI, as plain text or JSON lines (one object per prompt)."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from tui.cli.common import CliError, add_model_flags, cli_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        help="the prompt text; - reads it from stdin (so does no --prompt with stdin a pipe or file: "
        "echo hi | specchat generate)",
    )
    src.add_argument(
        "--prompt-file", type=Path, help="JSON Lines file, one object with a 'prompt' field per line"
    )
    parser.add_argument("--preset", help="auto, code, qa, creative or a user preset name")
    parser.add_argument("--k", type=int, help="draft tokens per round (0..16), overrides the preset")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature, overrides the preset (and its ramp)"
    )
    parser.add_argument("--max-new-tokens", type=int, help="reply length limit, overrides the preset")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt, one per line")
    parser.add_argument(
        "--save", action="store_true", help="keep each prompt and reply in the history and the metrics log"
    )


def _read_prompts(args: argparse.Namespace) -> list[str]:
    from engine.prompt_file import PromptFileError, read_prompt_file

    piped = sys.stdin is not None and not sys.stdin.isatty()
    from_stdin = args.prompt == "-" or (args.prompt is None and args.prompt_file is None and piped)
    if from_stdin:
        prompts = [_read_stdin()]
    elif args.prompt is not None:
        prompts = [args.prompt]
    elif args.prompt_file is not None:
        try:
            prompts = [obj["prompt"] for _, obj in read_prompt_file(args.prompt_file)]
        except PromptFileError as exc:
            raise CliError(str(exc)) from None
    else:
        raise CliError(
            "generate needs --prompt TEXT, --prompt-file FILE or text piped in (echo hi | specchat generate)"
        )
    for i, prompt in enumerate(prompts, start=1):
        if not prompt.strip() and from_stdin:
            raise CliError(
                "empty prompt on stdin (generate takes --prompt TEXT, --prompt-file FILE or text piped in)"
            )
        if not prompt.strip():
            raise CliError("empty prompt" + (f" (line {i} of the file)" if len(prompts) > 1 else ""))
    return prompts


def _read_stdin() -> str:
    """The prompt piped in (`echo hi | specchat generate`, `--prompt - < file`), without its final line break."""
    try:
        text = sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"stdin is not UTF-8 text (byte {exc.start}): pipe a text file") from None
    return text.removesuffix("\n").removesuffix("\r")


def _validate_generate(args: argparse.Namespace) -> None:
    if args.k is not None and not 0 <= args.k <= 16:
        raise CliError(f"--k must be between 0 and 16 (got {args.k})")
    if args.temperature is not None and args.temperature < 0:
        raise CliError(f"--temperature must be >= 0 (got {args.temperature})")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")


def run(args: argparse.Namespace) -> int:
    import orjson

    from engine.events import ReplyFailed
    from engine.models import progress_printer
    from engine.session import ChatSession

    _validate_generate(args)
    prompts = _read_prompts(args)
    settings = cli_settings(args)
    session = ChatSession(settings, save=args.save)
    session.set_overrides(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    # Progress lines name the model being loaded, not the embedded one.
    session.load(progress_printer(settings.model))
    info = session.info
    assert info is not None
    # Which backend and why, and any notice (q4 mapped to q8 ...): stderr, so --json output stays clean.
    for note in (session.backend_reason, *info.notes):
        if note and note != "given":
            print(f"specchat: {note}", file=sys.stderr)
    status = 0
    for prompt in prompts:
        session.new_chat()
        result = session.send(prompt, on_event=lambda _e: None, cancel=threading.Event())
        for notice in session.take_notices():
            print(f"specchat: {notice}", file=sys.stderr)
        if isinstance(result, ReplyFailed):
            print(f"specchat: error: {result.message}", file=sys.stderr)
            status = 1
            continue
        if args.json:
            record = {
                "text": result.text,
                "model": session.model_dir or info.model,
                # A remote server without a tokenizer endpoint has no ids (the context was estimated).
                "prompt_token_ids": [i for i in session.last_prompt_ids if i >= 0],
                "token_ids": list(result.token_ids),
                "stats": result.stats.to_dict(),
            }
            sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
            sys.stdout.flush()
        else:
            print(result.text, flush=True)
    return status
