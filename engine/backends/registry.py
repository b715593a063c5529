"""The engines specchat runs, one row each. Every list of engines derives from `ENGINES`: the config's backend type
and the CLI's `--backend` choices, what cache mode "auto" means, `specchat doctor`'s engine checks and the order in
which `--backend auto` tries them (engine/backends/select.py).

A leaf, as harlequin's adapter entry points: a row names its package's probe and build as "module:function"
strings, imported only when called, so `engine.config` reads the names without importing an engine (the layering
test holds it to that). Adding an engine is one package under engine/backends/ and one row here
(docs/development.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.decoding.drafters.registry import loop_drafters

if TYPE_CHECKING:
    from engine.backends.base import Backend, EngineArgs, ProgressCallback

# The model formats a row may load (engine.models.folders.model_format says which one a path is); "embedded" is the
# built-in model, which every local engine runs (llama.cpp as GGUF), "endpoint" a server's URL.
FORMATS = ("gguf", "exl3", "exl2", "gptq", "fp16", "embedded", "endpoint")


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine: what it is called, how to build and probe it, and what it supports."""

    name: str  # as --backend spells it
    label: str  # as the backend calls itself (BackendInfo.backend, the status bar, `auto`'s reason)
    build: str  # "module:function": EngineArgs -> Backend, not loaded yet
    probe: (
        str | None
    )  # "module:function": (progress=None) -> (usable, reason); None: runs wherever specchat runs
    loads: tuple[str, ...]  # model formats (FORMATS)
    drafters: tuple[
        str, ...
    ]  # draft settings it takes ("ngram", "model", "mtp", "none"); () the server's own
    cache_modes: tuple[str, ...]  # cache modes it keeps as asked (others fall back, with a note)
    default_cache_mode: str  # what cache_mode "auto" means
    gpu: bool = False  # needs a CUDA GPU
    # `auto` takes it only where no other engine that loads the model is usable here.
    fallback: bool = False
    check: str | None = None  # the name of its `specchat doctor` check; None: nothing to check
    distribution: str | None = None  # the pip package, whose version doctor shows
    # "module:name" of doctor's advice where a GPU is there but the package is not installed
    install_hint: str | None = None
    # "module:name" of the advice after "NAME is unusable here: reason;" where --backend asks for it
    unusable_hint: str | None = None
    # "module:function" of what doctor adds to a usable probe's reason (llama.cpp: which build it is)
    detail: str | None = None


ENGINES: tuple[Engine, ...] = (
    Engine(
        name="exllamav2",
        label="exllamav2",
        build="engine.backends.exllamav2.backend:build",
        probe="engine.backends.exllamav2.library:probe_exllamav2",
        unusable_hint="engine.backends.exllamav2.library:UNUSABLE_HINT",
        loads=("exl2", "gptq", "fp16", "embedded"),
        drafters=("ngram", "model", "none"),
        cache_modes=("fp16", "q8", "q6", "q4"),
        default_cache_mode="q8",  # a quarter of FP16's memory at a small cost in acceptance
        gpu=True,
        check="exllamav2",
        distribution="exllamav2",
    ),
    Engine(
        name="exllamav3",
        label="exllamav3",
        build="engine.backends.exllamav3.backend:build",
        probe="engine.backends.exllamav3.library:probe_exllamav3",
        unusable_hint="engine.backends.exllamav3.library:UNUSABLE_HINT",
        loads=("exl3", "fp16", "embedded"),
        drafters=("ngram", "model", "mtp", "none"),
        cache_modes=("fp16", "q8", "q6", "q4"),
        default_cache_mode="q8",
        gpu=True,
        check="exllamav3",
        distribution="exllamav3",
        install_hint="engine.backends.exllamav3.library:INSTALL_HINT",
    ),
    Engine(
        name="transformers",
        label="transformers",
        build="engine.backends.transformers.backend:build",
        probe=None,
        loads=("fp16", "embedded"),
        drafters=loop_drafters("transformers"),
        cache_modes=("fp16", "q8"),
        # Full precision on the CPU: only that cache gives the model's own greedy text (an int8 cache changed it
        # on 6 prompts in 12).
        default_cache_mode="fp16",
        fallback=True,
    ),
    Engine(
        name="llamacpp",
        label="llama.cpp",
        build="engine.backends.llamacpp.backend:build",
        probe="engine.backends.llamacpp.library:probe_llamacpp",
        unusable_hint="engine.backends.llamacpp.library:UNUSABLE_HINT",
        loads=("gguf", "embedded"),
        drafters=loop_drafters("llamacpp"),
        cache_modes=("fp16", "q8", "q4"),
        default_cache_mode="fp16",  # llama.cpp's own default
        check="llama_cpp",
        distribution="llama-cpp-python",
        detail="engine.backends.llamacpp.library:build_note",
    ),
    Engine(
        name="remote",
        label="remote",
        build="engine.backends.remote.backend:build",
        probe=None,
        loads=("endpoint",),
        drafters=(),
        cache_modes=(),
        default_cache_mode="fp16",
    ),
)

NAMES: tuple[str, ...] = tuple(engine.name for engine in ENGINES)
CHOICES: tuple[str, ...] = ("auto", *NAMES)  # what --backend and the config's `backend` take


class UnknownEngine(KeyError):
    """No engine by that name."""


def engine(name: str) -> Engine:
    """The row of `name` as --backend spells it; UnknownEngine where there is none."""
    for row in ENGINES:
        if row.name == name:
            return row
    raise UnknownEngine(name)


def resolve_cache_mode(mode: str | None, backend: str) -> str:
    """The cache mode an engine runs for a setting that may be "auto": its default. `backend` is its name or its
    label (a backend's `name` attribute: "llama.cpp"); an engine not in the registry (the scripted one) gets fp16."""
    if mode not in (None, "", "auto"):
        return mode
    row = next((row for row in ENGINES if backend in (row.name, row.label)), None)
    return row.default_cache_mode if row is not None else "fp16"


def entry_point(spec: str) -> Any:
    """What a "module:name" string names, imported now."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def probe(row: Engine, progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """(usable, reason): whether `row` can run here. Engines without a probe always can (reason "")."""
    if row.probe is None:
        return True, ""
    return entry_point(row.probe)(progress)


def unusable_hint(row: Engine) -> str:
    """What to do where `row` is asked for by name and cannot run here."""
    return entry_point(row.unusable_hint) if row.unusable_hint else "use --backend auto"


def build(row: Engine, args: EngineArgs) -> Backend:
    """The backend of `row` for `args`, not loaded yet."""
    return entry_point(row.build)(args)
