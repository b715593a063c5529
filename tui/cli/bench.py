"""`specchat bench`: speculative vs plain decoding vs the peers, side by side in one run (engine.benchmarks)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.cli.common import CliError, add_model_flags, cli_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--quick", action="store_true", help="short replies, fewer repeats")
    parser.add_argument("--ui", action="store_true", help="also run the UI streaming benchmark")
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="run the prompts through this OpenAI-compatible server instead (with and without its drafting "
        "where it can be switched per request)",
    )
    parser.add_argument(
        "--prompts",
        default="heldout",
        help="prompt set: heldout (default: never tuned on), public, or a JSON Lines file",
    )
    parser.add_argument(
        "--tasks",
        metavar="SPLIT",
        help="instead: the task families (summarize, passages, code_edit, translate, chat, code: function "
        "completions and rewrites; repeat: regenerations, repeated tasks and edits, with and without the history "
        "drafter) and the context rows, ours against llama-server on the same GGUF (with --draft "
        "a GGUF: our draft model and its draft-simple too; with --draft mtp: our MTP head and its draft-mtp): "
        "heldout, tune, or a JSON Lines file",
    )
    parser.add_argument(
        "--families",
        metavar="NAMES",
        help="with --tasks: only these families, comma-separated (code = its completions and rewrites; add "
        "'context' for the context rows)",
    )


def run(args: argparse.Namespace) -> int:
    from engine.benchmarks.bench import run_bench
    from engine.benchmarks.llamacpp import bench_llamacpp_if_usable
    from engine.benchmarks.runner import load_prompt_set
    from engine.decoding.drafters import is_draft_keyword

    settings = cli_settings(args)
    if args.families and not args.tasks:
        raise CliError("--families goes with --tasks")
    if args.tasks:
        return _run_tasks(settings, args)
    prompt_set = args.prompts
    if prompt_set not in ("heldout", "public") and not Path(prompt_set).is_file():
        raise CliError(f"--prompts: no such prompt set or file: {prompt_set}")
    from engine.prompt_file import PromptFileError

    try:
        load_prompt_set(prompt_set)  # a bad file is one line now, not a traceback minutes into the run
    except PromptFileError as exc:
        raise CliError(str(exc)) from None
    from engine.backends.select import is_gguf_path

    if not is_draft_keyword(settings.draft) and settings.model and is_gguf_path(Path(settings.model)):
        # A GGUF draft-model pair: ours (plain, draft, n-gram) and llama-server's, side by side.
        from engine.benchmarks.pair import run_pair_bench

        prompts = load_prompt_set(prompt_set)
        if args.quick:  # two prompts per category
            prompts = [
                p for c in ("code", "qa", "creative") for p in [q for q in prompts if q["category"] == c][:2]
            ]
        run_pair_bench(
            Path(settings.model),
            Path(settings.draft),
            prompts,
            max_new=64 if args.quick else 128,
            repeats=1 if args.quick else 2,
            threads=settings.threads,
            max_context=settings.max_context,
        )
        return 0
    if args.remote:
        from engine.benchmarks.remote import run_remote_bench

        run_remote_bench(settings, args.remote, quick=args.quick, prompt_set=prompt_set)
        return 0
    if not loads(settings.backend, "gguf") and not str(settings.model or "").lower().endswith(".gguf"):
        run_bench(settings, quick=args.quick, prompt_set=prompt_set)
    bench_llamacpp_if_usable(settings, quick=args.quick, prompt_set=prompt_set)
    if settings.backend == "auto" or runs_on_the_cpu(settings.backend):
        from engine.benchmarks.answers import run_answer_check

        run_answer_check(settings, load_prompt_set(prompt_set))
    if args.ui:
        from tui.ui_bench import run_chat_vs_generate, run_ui_bench

        run_chat_vs_generate(settings, quick=args.quick)
        run_ui_bench()
    return 0


def loads(backend: str, model_format: str) -> bool:
    """Whether the engine `--backend` names loads that model format, by its row in the registry (`auto`: no one
    engine, so no)."""
    from engine.backends import registry

    return backend != "auto" and model_format in registry.engine(backend).loads


def runs_on_the_cpu(backend: str) -> bool:
    """Whether the engine `--backend` names runs a local model on the CPU (no GPU, no server): the engines the
    answer check compares with the model's own fp32 answers."""
    from engine.backends import registry

    row = registry.engine(backend)
    return not row.gpu and "endpoint" not in row.loads


def _run_tasks(settings, args: argparse.Namespace) -> int:
    from engine.backends.llamacpp import probe_llamacpp
    from engine.backends.select import is_gguf_path, uses_embedded_model
    from engine.benchmarks.task_sets import parse_families
    from engine.benchmarks.tasks import CONTEXT_ROWS, TASK_SETS, run_task_bench
    from engine.decoding.drafters import is_draft_keyword

    if args.tasks not in TASK_SETS and not Path(args.tasks).is_file():
        raise CliError(f"--tasks: choose heldout or tune, or give a JSON Lines file (got {args.tasks!r})")
    try:
        families, context_rows = parse_families(args.families)
    except ValueError as exc:
        raise CliError(f"--families: {exc}") from None
    draft = None
    if not is_draft_keyword(settings.draft):
        if not is_gguf_path(Path(settings.draft)):
            raise CliError("--tasks runs on llama.cpp: give a GGUF draft model (or --draft ngram)")
        draft = Path(settings.draft)
    usable, reason = probe_llamacpp()
    if not usable:
        raise CliError(f"--tasks runs on llama.cpp: {reason}")
    if uses_embedded_model(settings):
        from engine.models import ensure_embedded_gguf, print_progress

        path = ensure_embedded_gguf(print_progress)
    elif is_gguf_path(Path(settings.model)):
        path = Path(settings.model)
    else:
        raise CliError("--tasks runs on llama.cpp: give a GGUF model (or none, for the embedded one)")
    result = run_task_bench(
        path,
        args.tasks,
        draft=draft,
        mtp=str(settings.draft).strip().lower() == "mtp",
        max_new=64 if args.quick else 128,
        repeats=1 if args.quick else 2,
        threads=getattr(settings, "threads", None),
        context=settings.max_context,
        families=families,
        context_rows=CONTEXT_ROWS if context_rows else (),
    )
    # A drafting mode whose output left our plain's is a broken promise, not a slow figure: exit non-zero.
    return 1 if not result or result["mismatches"] else 0
