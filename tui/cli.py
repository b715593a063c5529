"""`specchat` command line: the chat TUI by default, plus generate / presets / fetch / bench / paths.

Every user mistake ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2

KEYS_HELP = """\
keys in the chat (binding id in brackets; remap under [keymap] in config.toml, e.g. "reply.cancel" = "ctrl+g"):
  enter             send the message; ctrl+j (shift+enter where reported) adds a new line
  f1 f2 f3 f4       preset auto / code / qa / creative, for the next reply
                    [preset.auto] [preset.code] [preset.qa] [preset.creative]
  ctrl+o            preset picker, user presets too [preset.pick]; ctrl+p: command palette
  escape            stop the reply: partial text kept, the prompt comes back if nothing arrived [reply.cancel]
  ctrl+r            regenerate the last reply (the old one stays as a variant) [reply.regenerate]
  alt+left/right    page the last reply's older / newer variants [reply.older_variant] [reply.newer_variant]
  ctrl+e            edit and resend the last message [reply.edit_last]
  ctrl+y / ctrl+b   copy the reply / its last code block [reply.copy] [reply.copy_code]
  ctrl+s            statistics inspector of the selected reply [reply.inspect]
  alt+up / alt+down select a reply, or click it [reply.previous] [reply.next]
  on a reply        enter: stats, ctrl+y: copy, ctrl+b: copy code, f5: help; typing goes to the prompt
                    [message.inspect] [message.copy] [message.copy_code] [message.help]
  pageup/pagedown   scroll the chat from the prompt (shift+pageup/pagedown too) [chat.page_up] [chat.page_down]
  f6                colour text the draft got right [view.draft_highlight]
  f5                help [help.show]     ctrl+l  back to the prompt [prompt.focus]
  ctrl+n            new chat; the last one stays in the history [chat.new]  ctrl+q  quit [app.quit]
  ctrl+h or f7      saved chats: search, open, rename, delete, export [chat.history]
                    (f7 where the terminal sends ctrl+h as backspace)
  f12               settings for this chat: model and draft (reloaded, the chat stays), system prompt,
                    K, temperature, top_p, ramp, drafting [settings.open]
"""


class CliError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", help="drafting: ngram, none, or a draft model folder (same tokenizer family)")
    p.add_argument(
        "--backend",
        choices=["auto", "exllamav2", "transformers", "llamacpp", "remote"],
        help="inference engine (remote: an OpenAI-compatible server at --endpoint)",
    )
    p.add_argument(
        "--endpoint",
        help="remote server's base URL (llama-server, vLLM, TabbyAPI), e.g. http://127.0.0.1:8080",
    )
    p.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the remote server's API key"
    )
    p.add_argument("--remote-model", metavar="NAME", help="model to ask the remote server for")
    p.add_argument(
        "--cache-mode",
        choices=["auto", "fp16", "q8", "q6", "q4"],
        help="KV cache precision (default auto: q8 on exllamav2, full precision on transformers)",
    )
    p.add_argument(
        "--draft-cache-mode", choices=["auto", "fp16", "q8", "q6", "q4"], help="draft model's KV cache"
    )
    p.add_argument("--max-context", type=int, help="context length in tokens")
    p.add_argument("--system-prompt", help="system prompt for the conversation")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible replies)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specchat",
        description="Chat with a local LLM, with speculative decoding you can see and steer.",
        epilog=KEYS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_flags(parser)
    parser.add_argument(
        "--preset", help="auto (route each message) or a preset name: code, qa, creative, ..."
    )
    reopen = parser.add_mutually_exclusive_group()
    reopen.add_argument("--resume", action="store_true", help="continue the last chat")
    reopen.add_argument(
        "--chat", type=int, metavar="ID", help="continue the chat with this id (history list)"
    )
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser, metavar="COMMAND")

    gen = sub.add_parser("generate", help="answer prompts without the UI (plain text or JSON lines)")
    _add_model_flags(gen)
    src = gen.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument(
        "--prompt-file", type=Path, help="JSON Lines file, one object with a 'prompt' field per line"
    )
    gen.add_argument("--preset", help="auto, code, qa, creative or a user preset name")
    gen.add_argument("--k", type=int, help="draft tokens per round (0..16), overrides the preset")
    gen.add_argument(
        "--temperature", type=float, help="sampling temperature, overrides the preset (and its ramp)"
    )
    gen.add_argument("--max-new-tokens", type=int, help="reply length limit, overrides the preset")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt, one per line")
    gen.add_argument(
        "--save", action="store_true", help="keep each prompt and reply in the history and the metrics log"
    )

    sub.add_parser("presets", help="list the presets (built-in and user)")
    sub.add_parser("fetch", help="fetch and convert the embedded model; prints its folder and its GGUF file")
    sub.add_parser("paths", help="print where config, presets, cache and data live")
    plan = sub.add_parser("plan", help="memory plan: weights + KV cache + draft against a GPU budget")
    _add_model_flags(plan)
    plan.add_argument("--budget-gb", type=float, help="GPU memory to plan against, in GiB (e.g. 24)")
    plan.add_argument(
        "--bpw", type=float, help="bits per weight of a quantized model (e.g. 4.0 for EXL2 4bpw)"
    )
    bench = sub.add_parser(
        "bench", help="speculative vs plain decoding vs the transformers peer, side by side"
    )
    _add_model_flags(bench)
    bench.add_argument("--quick", action="store_true", help="short replies, fewer repeats")
    bench.add_argument("--ui", action="store_true", help="also run the UI streaming benchmark")
    bench.add_argument(
        "--remote",
        metavar="URL",
        help="run the prompts through this OpenAI-compatible server instead (with and without its drafting "
        "where it can be switched per request)",
    )
    bench.add_argument(
        "--prompts",
        default="heldout",
        help="prompt set: heldout (default: never tuned on), public, or a JSON Lines file",
    )

    tune = sub.add_parser(
        "tune", help="sweep K, temperature, drafting and cache per task; --apply writes the winning K"
    )
    _add_model_flags(tune)
    tsrc = tune.add_mutually_exclusive_group()
    tsrc.add_argument(
        "--prompts", type=Path, help="JSON Lines file: {'prompt', 'category'?: code|qa|creative} per line"
    )
    tsrc.add_argument(
        "--from-history", action="store_true", help="your own past messages from the conversation store"
    )
    tune.add_argument("--quick", action="store_true", help="one prompt per task, short replies, one repeat")
    tune.add_argument("--tasks", default="code,qa,creative", help="tasks to tune (default: code,qa,creative)")
    tune.add_argument("--k-values", help="K values to sweep (default: 0,1,2,3,4,5,6,7,8)")
    tune.add_argument("--temperatures", help="temperatures to sweep (default: 0.1,0.5,0.7,1.0,1.2)")
    tune.add_argument("--max-new-tokens", type=int, help="reply length per run (default 128, quick 48)")
    tune.add_argument("--prompts-per-task", type=int, help="prompts per task (default 3, quick 1)")
    tune.add_argument(
        "--no-cache-sweep", action="store_true", help="skip the second load in the other cache mode"
    )
    tune.add_argument("--json", action="store_true", help="one JSON object per measured row, one per line")
    tune.add_argument("--output", type=Path, help="folder for the CSV and JSON results (default: data/tune)")
    tune.add_argument(
        "--apply", action="store_true", help="write the winning K (and ramp) into your preset files"
    )

    doctor = sub.add_parser(
        "doctor", help="validate: environment, memory, draft compatibility, baseline, context, restart"
    )
    _add_model_flags(doctor)
    doctor.add_argument("--json", action="store_true", help="the report as one JSON object")
    doctor.add_argument("--max-new-tokens", type=int, default=96, help="reply length per run (default 96)")
    doctor.add_argument(
        "--ladder", help="context lengths to climb, e.g. 512,2048 (default: 512, 2k, 4k ... max_context)"
    )
    doctor.add_argument(
        "--save-baseline", action="store_true", help="save this run as the baseline even if a check failed"
    )
    doctor.add_argument("--no-save", action="store_true", help="compare with the baseline but save nothing")

    history = sub.add_parser("history", help="saved chats: list, show, export, delete")
    hsub = history.add_subparsers(dest="history_command", parser_class=OneLineParser, metavar="ACTION")
    hsub.required = True
    hlist = hsub.add_parser("list", help="chats, most recent first")
    hlist.add_argument("--json", action="store_true", help="one JSON object per chat, one per line")
    hlist.add_argument("--search", default="", help="only chats whose title or text contains this")
    hshow = hsub.add_parser("show", help="print a chat with its stats lines")
    hshow.add_argument("id", type=int)
    hexport = hsub.add_parser("export", help="a chat as Markdown or JSON")
    hexport.add_argument("id", type=int)
    hexport.add_argument("--format", choices=["md", "json"], default="md", help="md (default) or json")
    hexport.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    hdelete = hsub.add_parser("delete", help="delete a chat and its messages")
    hdelete.add_argument("id", type=int)

    met = sub.add_parser("metrics", help="acceptance, τ, tok/s and TTFT over time, from the metrics log")
    met.add_argument("--since", default="7d", help="how far back: 30m, 12h, 7d (default), 2w")
    met.add_argument(
        "--by", choices=["day", "preset", "model"], help="group rows (default: day, in the table)"
    )
    fmt = met.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON lines: one per reply (or per group with --by)")
    fmt.add_argument("--csv", action="store_true", help="CSV: one row per reply (or per group with --by)")
    met.add_argument(
        "--check", action="store_true", help="exit 1 naming any regression (acceptance or tok/s drop)"
    )
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives (None: not given)."""
    return {
        "model": getattr(args, "model", None),
        "draft": getattr(args, "draft", None),
        "backend": getattr(args, "backend", None),
        "cache_mode": getattr(args, "cache_mode", None),
        "draft_cache_mode": getattr(args, "draft_cache_mode", None),
        "max_context": getattr(args, "max_context", None),
        "system_prompt": getattr(args, "system_prompt", None),
        "seed": getattr(args, "seed", None),
        "preset": getattr(args, "preset", None),
        "endpoint": getattr(args, "endpoint", None),
        "api_key_env": getattr(args, "api_key_env", None),
        "remote_model": getattr(args, "remote_model", None),
    }


def _settings(args: argparse.Namespace, check_paths: bool = True):
    from engine.config import load_settings

    settings = load_settings(**_overrides(args))
    if not check_paths:
        return settings
    if settings.model is not None and not Path(settings.model).exists():
        raise CliError(f"model folder not found: {settings.model}")
    draft = settings.draft
    if draft not in ("ngram", "none") and not Path(draft).exists():
        raise CliError(f"draft must be ngram, none or a model folder; folder not found: {draft}")
    return settings


def _read_prompts(args: argparse.Namespace) -> list[str]:
    from engine.prompt_file import PromptFileError, read_prompt_file

    if args.prompt is not None:
        prompts = [args.prompt]
    elif args.prompt_file is not None:
        try:
            prompts = [obj["prompt"] for _, obj in read_prompt_file(args.prompt_file)]
        except PromptFileError as exc:
            raise CliError(str(exc)) from None
    else:
        raise CliError("generate needs --prompt TEXT or --prompt-file FILE")
    for i, prompt in enumerate(prompts, start=1):
        if not prompt.strip():
            raise CliError("empty prompt" + (f" (line {i} of the file)" if len(prompts) > 1 else ""))
    return prompts


def _validate_generate(args: argparse.Namespace) -> None:
    if args.k is not None and not 0 <= args.k <= 16:
        raise CliError(f"--k must be between 0 and 16 (got {args.k})")
    if args.temperature is not None and args.temperature < 0:
        raise CliError(f"--temperature must be >= 0 (got {args.temperature})")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")


def cmd_generate(args: argparse.Namespace) -> int:
    import orjson

    from engine.events import ReplyFailed
    from engine.models import print_progress
    from engine.session import ChatSession

    _validate_generate(args)
    prompts = _read_prompts(args)
    settings = _settings(args)
    session = ChatSession(settings, save=args.save)
    session.set_overrides(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    session.load(print_progress)
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


def cmd_presets(args: argparse.Namespace) -> int:
    from engine.config import load_settings, presets_dir
    from engine.presets import load_presets

    load_settings()
    skipped: dict[str, str] = {}
    presets = load_presets(presets_dir(), skipped=skipped)
    for problem in skipped.values():  # one bad file does not hide the others
        print(f"specchat: skipped a preset file: {problem}", file=sys.stderr)
    width = max(len(n) for n in presets)
    for name, p in presets.items():
        ramp = f" ramp {p.ramp_start:g}->{p.temperature:g} over {p.ramp_tokens}" if p.ramp_tokens else ""
        draft = f"K{'≤' if p.k_mode == 'adaptive' else '='}{p.k}" if p.drafting and p.k else "draft off"
        print(f"{name:<{width}}  {draft:<9} T={p.temperature:<4g}{ramp:<26}  {p.description}  [{p.source}]")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from engine.models import ensure_embedded_gguf, ensure_embedded_model, print_progress

    print(ensure_embedded_model(print_progress))
    print(ensure_embedded_gguf(print_progress))  # what the llama.cpp backend runs
    return 0


def cmd_paths(args: argparse.Namespace) -> int:
    from engine.config import config_file_path, data_dir, load_settings, presets_dir
    from engine.models import embedded_gguf_path, embedded_model_dir

    print(f"config file   {config_file_path()}")
    print(f"user presets  {presets_dir()}")
    print(f"model cache   {embedded_model_dir()}")
    print(f"model GGUF    {embedded_gguf_path('f16')}  (llama.cpp's default; Q4_1: {embedded_gguf_path()})")
    print(f"data          {data_dir(load_settings())}  (specchat.db, metrics.jsonl)")
    return 0


def _open_store():
    from engine.config import data_dir, load_settings
    from engine.storage.store import Store

    store = Store.open(data_dir(load_settings()))
    for notice in store.take_notices():
        print(f"specchat: {notice}", file=sys.stderr)
    return store


def cmd_history(args: argparse.Namespace) -> int:
    import orjson

    from engine.storage.store import export_json, export_markdown
    from tui.formatting import stored_stats_line

    store = _open_store()
    action = args.history_command
    if action == "list":
        chats = store.chats(args.search)
        for chat in chats:
            if args.json:
                record = {
                    "id": chat.id,
                    "title": chat.title,
                    "created_at": chat.created_at,
                    "updated_at": chat.updated_at,
                    "messages": chat.message_count,
                    "model": chat.model,
                }
                sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
            else:
                when = _local_time(chat.updated_at)
                print(f"{chat.id:>5}  {when}  {chat.message_count:>4} msgs  {chat.title}")
        if not chats and not args.json:
            print(
                "no saved chats yet" + (f" matching {args.search!r}" if args.search else ""), file=sys.stderr
            )
        sys.stdout.flush()
        return 0
    chat = store.chat(args.id)  # StoreError (exit 2) for an unknown id
    if action == "delete":
        store.delete_chat(chat.id)
        print(f"deleted chat {chat.id}: {chat.title}")
        return 0
    messages = store.conversation(chat.id)
    if action == "show":
        print(f"chat {chat.id} · {chat.title} · {_local_time(chat.created_at)}")
        for message in messages:
            print(f"\n[{'you' if message.role == 'user' else message.role}]")
            print(message.text)
            line = stored_stats_line(message)
            if line:
                print(f"  ({line})")
        return 0
    data = (
        export_json(chat, messages)
        if args.format == "json"
        else export_markdown(chat, messages, stored_stats_line).encode("utf-8")
    )
    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        args.output.write_bytes(data)
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    print(f"wrote chat {chat.id} to {args.output}", file=sys.stderr)
    return 0


def _local_time(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def cmd_metrics(args: argparse.Namespace) -> int:
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


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from engine.memory_plan import MemoryPlanError, format_bytes, plan_memory
    from engine.models import ensure_embedded_model, validate_model_folder
    from engine.request import resolve_cache_mode

    settings = _settings(args)
    gguf_bits: dict[str, float] = {}

    def read_config(path: Path) -> dict:
        if path.suffix.lower() == ".gguf":  # a llama.cpp model: its shape and bits per weight from the file
            from engine.models import gguf_config

            config, gguf_bits[str(path)] = gguf_config(path)
            return config
        return json.loads((validate_model_folder(path) / "config.json").read_text(encoding="utf-8"))

    model_dir = Path(settings.model) if settings.model else validate_model_folder(ensure_embedded_model())
    draft_config = None
    if settings.draft not in ("ngram", "none"):
        draft_config = read_config(Path(settings.draft))
    if args.budget_gb is not None and args.budget_gb <= 0:
        raise CliError(f"--budget-gb must be positive (got {args.budget_gb})")
    budget = int(args.budget_gb * 2**30) if args.budget_gb else None
    try:
        plan = plan_memory(
            read_config(model_dir),
            resolve_cache_mode(settings.cache_mode, "exllamav2"),
            settings.max_context,
            draft_config,
            resolve_cache_mode(settings.draft_cache_mode, "exllamav2"),
            budget_bytes=budget,
            bits_per_weight=args.bpw or gguf_bits.get(str(model_dir)),
            draft_bits_per_weight=gguf_bits.get(str(settings.draft)),
        )
    except MemoryPlanError as exc:
        raise CliError(str(exc)) from exc
    print(f"model          {model_dir}")
    print(f"weights        {format_bytes(plan.weights_bytes)}")
    print(
        f"KV cache       {format_bytes(plan.kv_cache_bytes)}  ({plan.cache_mode}, {plan.max_context} tokens)"
    )
    if draft_config is not None:
        print(f"draft weights  {format_bytes(plan.draft_weights_bytes)}")
        print(f"draft KV cache {format_bytes(plan.draft_kv_cache_bytes)}  ({plan.draft_cache_mode})")
    print(f"total          {format_bytes(plan.total_bytes)}")
    if plan.headroom_bytes is not None:
        verdict = "fits" if plan.fits else "does NOT fit"
        print(
            f"budget         {format_bytes(plan.budget_bytes)}: {verdict}, headroom {format_bytes(plan.headroom_bytes)}"
        )
    if plan.advice:
        print(f"advice         {plan.advice}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.benchmarks.bench import run_bench
    from engine.benchmarks.llamacpp import bench_llamacpp_if_usable
    from engine.benchmarks.runner import load_prompt_set

    settings = _settings(args)
    prompt_set = args.prompts
    if prompt_set not in ("heldout", "public") and not Path(prompt_set).is_file():
        raise CliError(f"--prompts: no such prompt set or file: {prompt_set}")
    from engine.prompt_file import PromptFileError

    try:
        load_prompt_set(prompt_set)  # a bad file is one line now, not a traceback minutes into the run
    except PromptFileError as exc:
        raise CliError(str(exc)) from None
    if args.remote:
        from engine.benchmarks.remote import run_remote_bench

        run_remote_bench(settings, args.remote, quick=args.quick, prompt_set=prompt_set)
        return 0
    if settings.backend != "llamacpp" and not str(settings.model or "").lower().endswith(".gguf"):
        run_bench(settings, quick=args.quick, prompt_set=prompt_set)
    bench_llamacpp_if_usable(settings, quick=args.quick, prompt_set=prompt_set)
    if settings.backend in ("auto", "transformers", "llamacpp"):
        from engine.benchmarks.answers import run_answer_check

        run_answer_check(settings, load_prompt_set(prompt_set))
    if args.ui:
        from tui.ui_bench import run_ui_bench

        run_ui_bench()
    return 0


def _number_list(text: str | None, flag: str, kind: type, low: float, high: float) -> tuple | None:
    if text is None:
        return None
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CliError(f"{flag} must be a comma-separated list of numbers (got {text!r})") from None
    if not values or any(not low <= v <= high for v in values):
        raise CliError(f"{flag}: each value must be between {low:g} and {high:g} (got {text!r})")
    return values


def cmd_tune(args: argparse.Namespace) -> int:
    import shutil

    import orjson

    from engine.benchmarks.tune import (
        TASKS,
        TunePlan,
        builtin_prompts,
        format_tables,
        plot,
        prompts_from_history,
        prompts_from_jsonl,
        run_tune,
        write_outputs,
    )
    from engine.benchmarks.tune_apply import apply_results
    from engine.config import data_dir, presets_dir
    from engine.models import print_progress

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise CliError(f"--tasks: choose from code, qa, creative (got {args.tasks!r})")
    changes: dict[str, Any] = {"tasks": tasks}
    k_values = _number_list(args.k_values, "--k-values", int, 0, 16)
    if k_values is not None:
        changes["k_values"] = tuple(sorted(set(k_values) | {0}))  # plain decoding is every speedup's base
    temperatures = _number_list(args.temperatures, "--temperatures", float, 0.0, 5.0)
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
    plan = TunePlan.quick(**changes) if args.quick else TunePlan(**changes)
    settings = _settings(args)
    if args.prompts is not None:
        prompts = prompts_from_jsonl(args.prompts)
    elif args.from_history:
        prompts = prompts_from_history(data_dir(settings))
    else:
        prompts = builtin_prompts()
    result = run_tune(settings, prompts, plan, load_progress=print_progress)
    for note in result.notes:
        print(f"specchat: {note}", file=sys.stderr)
    csv_path, json_path = write_outputs(result, args.output or data_dir(settings) / "tune")
    if args.json:
        for row in result.rows:
            sys.stdout.buffer.write(orjson.dumps(row.to_dict()) + b"\n")
        sys.stdout.flush()
    else:
        print(format_tables(result))
        width = max(40, min(shutil.get_terminal_size((100, 24)).columns, 120))
        print()
        print(plot(result, width=width, color=sys.stdout.isatty()))
    print(f"specchat: tune took {result.seconds:.0f} s; wrote {csv_path} and {json_path}", file=sys.stderr)
    if args.apply:
        import time

        comment = time.strftime("%Y-%m-%d %H:%M") + f" ({result.backend}, {result.model}; {json_path.name})"
        applied = apply_results(result.decisions, presets_dir(), comment)
        out = sys.stderr if args.json else sys.stdout
        for item in applied:
            print(item.diff, end="", file=out)
            kept = f"; the previous file is kept as {item.backup}" if item.backup else ""
            print(f"specchat: wrote {item.path}{kept}", file=sys.stderr)
        if not applied:
            print("specchat: the presets already hold the winning values; nothing written", file=sys.stderr)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import orjson

    from engine.benchmarks.doctor import DoctorOptions, format_report, run_doctor
    from engine.config import data_dir

    if args.max_new_tokens < 4:
        raise CliError(f"--max-new-tokens must be at least 4 (got {args.max_new_tokens})")
    ladder = _number_list(args.ladder, "--ladder", int, 64, 1 << 20)
    if args.save_baseline and args.no_save:
        raise CliError("--save-baseline and --no-save contradict each other")
    settings = _settings(args)
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


def cmd_chat(args: argparse.Namespace) -> int:
    from engine.config import (
        ConfigError,
        Settings,
        config_file_path,
        display_path,
        env_name,
        load_settings_dropping_bad,
    )
    from engine.errors import SpecchatError
    from engine.presets import PresetError
    from engine.session import ChatSession
    from tui.app import run_app

    # The chat shows problems in the app and stays open: a bad config field (or an unknown preset) is left out
    # and the rest of the file applies, a bad preset file is skipped (the session says which); a file that is
    # not TOML at all opens on the defaults. A missing model or draft folder fails the load, in the app.
    session, problems = None, []
    try:
        settings, problems = load_settings_dropping_bad(**_overrides(args))
        try:
            # Loads the presets and checks the preset mode against them; opens the history store.
            session = ChatSession(settings, save=True)
        except SpecchatError as exc:
            if settings.preset == "auto":
                raise
            where = (
                "command line"
                if args.preset is not None
                else env_name("preset")
                if env_name("preset") in os.environ
                else display_path(config_file_path())
            )
            problems.append(f"{where}: preset: {exc} (ignored: auto is used)")
            settings = settings.model_copy(update={"preset": "auto"})
            session = ChatSession(settings, save=True)
    except (ConfigError, PresetError, SpecchatError) as exc:
        session, settings = None, Settings.model_construct()
        problems = [f"{exc} (opened on the defaults)"]
    startup_error = " ".join("; ".join(problems).split()) or None
    open_chat = None
    if session is not None and (args.resume or args.chat is not None):
        assert session.recorder is not None
        if args.chat is not None:
            open_chat = session.recorder.store.chat(args.chat).id  # StoreError: one line, exit 2
        else:
            open_chat = session.last_chat_id()
            if open_chat is None:
                print("specchat: no saved chat to resume: starting a new one", file=sys.stderr)
    run_app(settings, startup_error=startup_error, session=session, open_chat=open_chat)
    return 0


COMMANDS = {
    None: cmd_chat,
    "generate": cmd_generate,
    "presets": cmd_presets,
    "fetch": cmd_fetch,
    "paths": cmd_paths,
    "plan": cmd_plan,
    "bench": cmd_bench,
    "history": cmd_history,
    "metrics": cmd_metrics,
    "tune": cmd_tune,
    "doctor": cmd_doctor,
}


class TypeAheadEnter:
    """Keep an Enter typed before the app takes the terminal an Enter.

    Until Textual puts the terminal in raw mode (after a second or two of imports), the terminal driver turns
    Enter (CR) into a newline (LF, which the prompt reads as ctrl+j: a new line instead of sending). Turning off
    that translation first thing keeps a question typed at once, Enter included, a question sent. The original
    settings come back on exit.
    """

    def __init__(self) -> None:
        self._saved: list | None = None

    def __enter__(self) -> TypeAheadEnter:
        try:
            import termios

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                attrs = termios.tcgetattr(fd)
                attrs[0] &= ~termios.ICRNL  # iflag: CR stays CR
                termios.tcsetattr(fd, termios.TCSANOW, attrs)
        except (ImportError, OSError, ValueError):  # no termios (Windows), or not a real terminal
            self._saved = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            import termios

            with contextlib.suppress(OSError, ValueError):
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSANOW, self._saved)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.errors import UserError

    try:
        if args.command is None:  # the chat: take Enter as Enter from the first moment
            with TypeAheadEnter():
                return COMMANDS[args.command](args)
        return COMMANDS[args.command](args)
    except (CliError, UserError) as exc:
        message = " ".join(str(exc).split())
        print(f"specchat: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
