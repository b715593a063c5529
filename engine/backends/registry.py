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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.decoding.drafters.registry import draft_help, draft_keywords, loop_drafters
from engine.request import CACHE_MODES

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


# ------------------------------------------------------------------------------------------ engine options


@dataclass(frozen=True, slots=True)
class DialogField:
    """How the chat's settings dialog (F12, tui/screens/settings.py) shows an option: a text field with its label
    and placeholder, and a button that picks a folder or file. Empty is a value where the option's default is None."""

    label: str
    placeholder: str | Callable[[], str]  # a function where it is made from another table
    picker: str  # the title of the folder picker the button opens


@dataclass(frozen=True, slots=True)
class EngineOption:
    """One setting an engine is built from, declared once; everything else derives from the row: the `Settings`
    field (engine/config.py: its type, default, bounds, and so the config key `name` and the environment variable
    SPECCHAT_NAME), the `EngineArgs` field (engine/backends/base.py), the command line's flag (tui/cli/common.py:
    --name-with-dashes, its help, its choices and type read from `type`) and, where it has a `dialog`, its row in
    the settings dialog (tui/chat_settings.py's `engine_fields`)."""

    name: str  # the Settings field, the config.toml key, the EngineArgs field
    type: Any  # the setting's type as pydantic checks it (a Literal gives the flag its choices)
    default: Any
    help: str | Callable[[], str] = ""  # the flag's help (a function where it is made from another table)
    flag: bool = True  # the command line takes it as --name-with-dashes; False: config and environment only
    metavar: str | None = None
    ge: int | None = None  # the least value the setting takes
    # The engines that read it (the registry's names); () every engine.
    engines: tuple[str, ...] = ()
    # EngineArgs carries it (backend, which picks the engine, is not an argument of one).
    engine_arg: bool = True
    # The EngineArgs value of a setting's value, where the two differ (a list setting is a tuple argument).
    to_arg: Callable[[Any], Any] | None = None
    # The settings dialog shows it (the field's id settings-NAME; the dialog's result holds it under `name`).
    dialog: DialogField | None = None

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


CacheMode = Literal[("auto", *CACHE_MODES)]  # type: ignore[valid-type]
LOCAL = ("exllamav2", "exllamav3", "transformers", "llamacpp")

# In the order of the command line's --help (and of Settings' fields).
ENGINE_OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "model",
        Path | None,  # None: the embedded SmolLM2-135M-Instruct; a model name (qwen2.5-coder-1.5b) too
        None,
        "model folder, .gguf file or name (qwen2.5-coder-1.5b; default: the embedded SmolLM2-135M-Instruct)",
        engines=LOCAL,
        dialog=DialogField(
            "model",
            "a model folder or .gguf file (empty: the embedded model)",
            "Pick the model folder or .gguf file",
        ),
    ),
    # a drafter's name (engine/decoding/drafters/registry.py), a draft model folder or name
    EngineOption(
        "draft",
        str,
        "ngram",
        draft_help,
        engines=LOCAL,
        # The drafters every engine runs (what the field completes that is not a model name), or a folder.
        dialog=DialogField(
            "draft",
            lambda: ", ".join(draft_keywords(every_engine=True)) + ", or a draft model folder",
            "Pick the draft model",
        ),
    ),
    EngineOption(
        "backend",
        Literal[CHOICES],  # type: ignore[valid-type]
        "auto",
        "inference engine (remote: an OpenAI-compatible server at --endpoint)",
        engine_arg=False,
    ),
    # The remote backend: an OpenAI-compatible server's base URL, the NAME of the environment variable that holds
    # its API key (the key itself is never stored), and the model to ask for (default: its first).
    EngineOption(
        "endpoint",
        str | None,
        None,
        "remote server's base URL (llama-server, vLLM, TabbyAPI), e.g. http://127.0.0.1:8080",
        engines=("remote",),
    ),
    EngineOption(
        "api_key_env",
        str | None,
        None,
        "environment variable holding the remote server's API key",
        metavar="VAR",
        engines=("remote",),
    ),
    EngineOption(
        "remote_model",
        str | None,
        None,
        "model to ask the remote server for",
        metavar="NAME",
        engines=("remote",),
    ),
    EngineOption(
        "cache_mode",
        CacheMode,
        "auto",  # each engine's default_cache_mode
        "KV cache precision (default auto: q8 on exllamav2/exllamav3, full precision on transformers)",
        engines=LOCAL,
    ),
    EngineOption("draft_cache_mode", CacheMode, "auto", "draft model's KV cache", engines=LOCAL),
    EngineOption("max_context", int, 4096, "context length in tokens", ge=256),
    EngineOption(
        "threads",
        int | None,
        None,
        "llama.cpp CPU threads (default: the physical cores)",
        flag=False,
        ge=1,
        engines=("llamacpp",),
    ),
    EngineOption(
        "device",
        str,
        "auto",
        "transformers' device",
        flag=False,
        engines=("transformers",),
        to_arg=lambda value: value or "auto",
    ),
    EngineOption(
        "gpu_split",
        list[float] | None,
        None,
        "GB per GPU for exllamav2's manual split",
        flag=False,
        engines=("exllamav2", "exllamav3"),
        to_arg=lambda value: tuple(value) if value is not None else None,
    ),
)


def engine_arg_options() -> tuple[EngineOption, ...]:
    """The options `EngineArgs` carries, in the table's order."""
    return tuple(option for option in ENGINE_OPTIONS if option.engine_arg)


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
