"""What every benchmark shares: the shipped prompt sets, the presets the chat uses, and one timed reply.

`bench`, `tune`, `doctor` and the llama.cpp / remote peers run our loop the same way through `timed_reply`
(a request built the way the chat builds it, the acceptance counted as the chat counts it) and read the same
prompt sets, shipped in this package as data (`prompts.jsonl`, the public set the drafter's priors were measured
on; `prompts_heldout.jsonl`, never used to tune anything).
"""

from __future__ import annotations

import threading
import time
from importlib import resources
from pathlib import Path

from engine.decoding.acceptance import AcceptanceAccounting
from engine.events import Chunk, Done
from engine.prompt_file import PromptFileError, read_prompt_file
from engine.request import GenerationRequest, HistoryCorpus, SamplerSettings

PROMPT_SETS = {"public": "prompts.jsonl", "heldout": "prompts_heldout.jsonl"}
BENCH_CATEGORIES = ("code", "qa", "creative")
SAMPLING_SEED = 1234


def load_prompt_set(path: Path | str | None = None) -> list[dict[str, str]]:
    """A prompt set: None or "public", "heldout", or a JSON Lines file of {"category", "prompt"} objects."""
    if path is None or str(path) in PROMPT_SETS:
        shipped = resources.files(__package__) / PROMPT_SETS[str(path or "public")]
        with resources.as_file(shipped) as real:  # package data: a real file even from a zipped install
            return load_prompt_set(real)
    prompts = []
    for number, obj in read_prompt_file(Path(path)):  # PromptFileError: one line for the user
        if obj.get("category") not in BENCH_CATEGORIES:
            raise PromptFileError(
                f"{path}:{number}: each line needs a category of code, qa or creative (got {obj.get('category')!r})"
            )
        prompts.append(obj)
    return prompts


def keep_load_threads(backend) -> None:
    """The benchmark's other variants adopt `backend`'s load-time thread choice: it does not measure again on
    its own a minute later where its load kept fewer threads than it measured (threads.py `adopt_measured`). A
    stall later still drops each backend to one thread and rechecks it on its own, as before."""
    backend.thread_control.recheck = None


def chat_presets() -> dict:
    """The presets the chat would use (the built-ins and the user's presets folder): what the benchmarks run."""
    from engine.presets import load_presets

    return load_presets(None)


def timed_reply(
    backend,
    prompt_ids: list[int],
    k: int,
    max_new: int,
    sampler: SamplerSettings | None = None,
    k_mode: str = "adaptive",
    key: str = "",
    history: HistoryCorpus | None = None,
    seed: int = SAMPLING_SEED,
) -> tuple[list[int], float, AcceptanceAccounting, Done]:
    """One reply through our round loop: (token ids, seconds, its acceptance accounting, the final Done).

    Greedy unless `sampler` is given; drafting with up to `k` tokens (none when k is 0), adaptive or fixed K, the
    adaptive estimates kept under `key`; the seed is fixed, so sampled runs repeat. `history`: the history
    drafter's corpus, as the session hands it in (engine/session/history.py).
    """
    request = GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        sampler=sampler or SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=seed,
        k_mode=k_mode,
        tuning_key=key,
        history=history,
    )
    t0 = time.perf_counter()
    accounting = AcceptanceAccounting(t_start=t0)
    ids: list[int] = []
    done = None
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            accounting.add(event)
            ids.extend(event.token_ids)
        else:
            done = event
    return ids, time.perf_counter() - t0, accounting, done
