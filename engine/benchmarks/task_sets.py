"""The prompt splits of `specchat bench --tasks`: which files make a split, which families they hold, `--families`.

Each split is two files shipped beside this module (and a third, `prompts_repeat*.jsonl`, of the repeat family's
scripted conversations: engine.benchmarks.repeat): the long-input families (`prompts_long*.jsonl`: summarize,
passages, code_edit, translate, chat) and the code family (`prompts_code*.jsonl`: function completions, "complete
this function" from a signature and docstring, and rewrites, "rewrite this function with type hints / as a
dataclass / with error handling", each reported as its own half). `tune` is the split to tune on; `heldout` was
never tuned on, and is the one to report.
"""

from __future__ import annotations

from pathlib import Path

from engine.prompt_file import read_prompt_file

FAMILIES = ("summarize", "passages", "code_edit", "translate", "chat", "code_complete", "code_rewrite")
# Families of scripted multi-step conversations rather than prompts (engine.benchmarks.repeat: regenerations,
# repeated tasks, edited questions, for the history drafter), in their own files.
CONVERSATION_FAMILIES = ("repeat",)
# Names `--families` takes beside the families themselves: a family's halves, and the context rows.
FAMILY_GROUPS = {"code": ("code_complete", "code_rewrite")}
CONTEXT = "context"
TASK_SETS = {
    "tune": ("prompts_long.jsonl", "prompts_code.jsonl"),
    "heldout": ("prompts_long_heldout.jsonl", "prompts_code_heldout.jsonl"),
}
# How the table names a family's row (the code family's two halves).
ROW_NAMES = {"code_complete": "code: complete", "code_rewrite": "code: rewrite"}


def task_files(name: str | Path) -> list[Path]:
    """The files a split ("tune", "heldout") reads, or the one JSON Lines file given."""
    if str(name) in TASK_SETS:
        here = Path(__file__).resolve().parent
        return [here / file for file in TASK_SETS[str(name)]]
    return [Path(name)]


def load_task_set(name: str | Path) -> list[dict]:
    """A task split ("tune", "heldout") or a JSON Lines file of {"category", "prompt"[, "messages"]} objects."""
    items = []
    for path in task_files(name):
        for _, obj in read_prompt_file(path):
            messages = obj.get("messages") or [{"role": "user", "content": obj["prompt"]}]
            items.append({"category": str(obj.get("category", "other")), "messages": list(messages)})
    return items


def parse_families(text: str | None) -> tuple[tuple[str, ...] | None, bool]:
    """`--families summarize,code,context` -> (the families to run, whether to run the context rows).

    None runs every family and the context rows. A group (`code`) stands for its halves; `context` names the
    context rows, which run only when named once a filter is given. An unknown name: ValueError, one line."""
    if text is None:
        return None, True
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = (*FAMILIES, *CONVERSATION_FAMILIES, *FAMILY_GROUPS, CONTEXT)
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"choose from {', '.join(known)} (got {text!r})")
    chosen: list[str] = []
    for name in names:
        for family in FAMILY_GROUPS.get(name, (name,)):
            if family != CONTEXT and family not in chosen:
                chosen.append(family)
    return tuple(chosen), CONTEXT in names
