"""What `specchat tune` measures on: the tasks, K values and temperatures swept (`TunePlan`), and the prompts, from
the public bench set, a JSON Lines file, or the user's own past messages (`TunePrompt`), picked per task."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import UserError
from engine.prompt_file import PromptFileError, read_prompt_file

TASKS = ("code", "qa", "creative")
K_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
TEMPERATURES = (0.1, 0.5, 0.7, 1.0, 1.2)


class TuneError(UserError):
    """Bad tune input (no prompts, a bad prompt file); one line for the user."""


@dataclass(frozen=True, slots=True)
class TunePlan:
    tasks: tuple[str, ...] = TASKS
    k_values: tuple[int, ...] = K_VALUES
    temperatures: tuple[float, ...] = TEMPERATURES
    max_new_tokens: int = 128
    prompts_per_task: int = 3
    repeats: int = 2
    sweep_drafting: bool = True
    sweep_cache: bool = True

    @classmethod
    def quick(cls, **changes: Any) -> TunePlan:
        """One prompt per task, short replies, one repeat: a first look in a minute or two."""
        return replace(cls(max_new_tokens=48, prompts_per_task=1, repeats=1), **changes)


@dataclass(frozen=True, slots=True)
class TunePrompt:
    task: str
    text: str


def prompts_from_jsonl(path: Path) -> list[TunePrompt]:
    """{"prompt": ..., "category"?: code|qa|creative} per line; a line without a category is routed."""
    from engine.router import route

    try:
        records = read_prompt_file(path)
    except PromptFileError as exc:
        raise TuneError(str(exc)) from None
    prompts = []
    for number, obj in records:
        task = obj.get("category")
        if task is None:
            task = route(obj["prompt"]).preset
        elif task not in TASKS:
            raise TuneError(f"{path}:{number}: category must be code, qa or creative (got {task!r})")
        prompts.append(TunePrompt(task, obj["prompt"]))
    return prompts


def builtin_prompts() -> list[TunePrompt]:
    """The public bench set: tuning never sees the held-out prompts that `specchat bench` reports on."""
    from engine.benchmarks.runner import load_prompt_set

    return [TunePrompt(p["category"], p["prompt"]) for p in load_prompt_set("public")]


def prompts_from_history(data_dir: Path, limit: int = 200) -> list[TunePrompt]:
    """The user's own messages from the conversation store, newest first, routed as the chat routes them."""
    from engine.router import route
    from engine.storage.store import DB_NAME, Store

    if not (data_dir / DB_NAME).is_file():
        raise TuneError(f"no conversation history yet ({data_dir / DB_NAME}): chat first or use --prompts")
    store = Store.open(data_dir)
    try:
        texts = store.user_messages(limit)
    finally:
        store.close()
    prompts = [TunePrompt(route(text).preset, text) for text in texts if text.strip()]
    if not prompts:
        raise TuneError("the conversation history has no messages of yours yet: chat first or use --prompts")
    return prompts


def pick_prompts(prompts: Sequence[TunePrompt], plan: TunePlan) -> dict[str, list[str]]:
    """Up to `prompts_per_task` prompts for each planned task that has any (in the given order)."""
    chosen: dict[str, list[str]] = {}
    for task in plan.tasks:
        texts = [p.text for p in prompts if p.task == task][: plan.prompts_per_task]
        if texts:
            chosen[task] = texts
    if not chosen:
        raise TuneError("no prompts for the tasks asked for (" + ", ".join(plan.tasks) + ")")
    return chosen
