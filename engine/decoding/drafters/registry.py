"""The name map: every drafter by the name `--draft` (the config's `draft`, the settings dialog) spells it.

The CLI's help, the config's check, the settings dialog's suggestions, the backends' draft mode, the stats and the
verdict read this map; none keeps its own list. Adding a drafter is one file in this folder (a class that passes
tests/engine/decoding/drafters/test_contract.py, and a `build(context)` factory) and one entry below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.decoding.drafters.base import DraftContext, Drafter
from engine.decoding.drafters.draft_model import build as draft_model_drafter
from engine.decoding.drafters.history import build as history_drafter
from engine.decoding.drafters.history import offers as history_offers
from engine.decoding.drafters.mtp import build as mtp_drafter
from engine.decoding.drafters.ngram import build as ngram_drafter


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the `--draft` keyword, the backend's draft mode and the rounds' Chunk.drafter
    description: str  # what it is, for --help and the settings dialog (after the name)
    label: str  # what the chat and the notes call it ("n-gram": "n-gram drafting", "drafter: n-gram")
    # Typed as is (else: given as a folder, a .gguf file or a model name, never typed as `name`).
    keyword: bool = True
    # Its drafts take model steps (c > 0 in the speedup model); False: free lookups, counted apart in the stats.
    steps: bool = False
    # The drafter for the round loop (transformers, llama.cpp); None where it drafts elsewhere or never.
    build: Callable[[DraftContext], Drafter] | None = None
    # Drafters asked beside it each round where rounds are planned by cost (adaptive K, a measured verify cost).
    beside: tuple[str, ...] = ()
    # Only these engines run it (empty: every engine).
    engines: tuple[str, ...] = ()
    # The draft mode a backend reports for it (BackendInfo.draft_mode), where it is not `name`.
    mode: str = ""
    # Asked only beside another drafter, never a draft setting of its own (not offered by --draft or the dialog).
    companion: bool = False
    # Beside another drafter: whether it has anything to offer this reply (None: always); where not, it is not
    # built, so it costs nothing.
    offers: Callable[[DraftContext], bool] | None = None


_SPECS = (
    DrafterSpec(
        name="ngram",
        description="free drafts copied from earlier in the chat",
        label="n-gram",
        build=ngram_drafter,
        beside=("history",),
    ),
    DrafterSpec(name="none", description="plain decoding", label="none"),
    DrafterSpec(
        name="mtp",
        description="the model's own MTP head: a GGUF with MTP layers, or exllamav3",
        label="MTP head",
        steps=True,
        build=mtp_drafter,
        beside=("ngram", "history"),
        engines=("exllamav3", "llamacpp"),
        mode="model",
    ),
    DrafterSpec(
        name="model",
        description="a draft model folder, .gguf file or name (qwen2.5-coder-0.5b; same tokenizer family)",
        label="draft model",
        keyword=False,
        steps=True,
        build=draft_model_drafter,
        beside=("ngram", "history"),
    ),
    DrafterSpec(
        name="history",
        description="free drafts copied from what the chat already wrote: other variants, branches, past chats",
        label="history",
        build=history_drafter,
        companion=True,
        offers=history_offers,
    ),
)
DRAFTERS: dict[str, DrafterSpec] = {spec.name: spec for spec in _SPECS}
NO_DRAFTING = "none"  # the map's name for drafting off


def draft_keywords(every_engine: bool = False) -> tuple[str, ...]:
    """The names typed as they are (ngram, none, mtp), in the map's order; `every_engine`: only those that every
    engine runs (the settings dialog's suggestions)."""
    return tuple(
        s.name
        for s in DRAFTERS.values()
        if s.keyword and not s.companion and not (every_engine and s.engines)
    )


def loop_drafters(engine: str) -> tuple[str, ...]:
    """The draft settings an engine whose loop is the round loop takes: every drafter the loop can build that runs
    on `engine`, and drafting off (engine/backends/registry.py's rows for transformers and llama.cpp)."""
    return tuple(
        s.name
        for s in DRAFTERS.values()
        if s.name == NO_DRAFTING
        or (s.build is not None and not s.companion and (not s.engines or engine in s.engines))
    )


def draft_choices(every_engine: bool = False) -> str:
    """The keywords for a one-line message: "'ngram', 'none', 'mtp'"."""
    return ", ".join(f"'{name}'" for name in draft_keywords(every_engine))


def is_draft_keyword(value: str) -> bool:
    return str(value).strip().lower() in draft_keywords()


def draft_mode_of(setting: str) -> str:
    """The draft mode a backend reports for a `draft` setting: a keyword's own mode, else "model" (a draft model)."""
    spec = DRAFTERS.get(str(setting).strip().lower())
    if spec is None or not spec.keyword:
        return "model"
    return spec.mode or spec.name


def spec_of_mode(mode: str | None) -> DrafterSpec | None:
    """The map's entry behind a draft mode or a round's drafter ("server" and None: none)."""
    return DRAFTERS.get(mode) if mode else None


def drafts(mode: str | None) -> bool:
    """A draft mode in which one of the map's drafters drafts (not off, not a server's own drafting)."""
    spec = spec_of_mode(mode)
    return spec is not None and spec.name != NO_DRAFTING


def draft_help() -> str:
    """The `--draft` help: every keyword with what it is, then the draft model."""
    keywords = [s for s in DRAFTERS.values() if s.keyword and not s.companion]
    models = [s for s in DRAFTERS.values() if not s.keyword and not s.companion]
    words = [f"{s.name} ({s.description})" for s in keywords]
    return "drafting: " + ", ".join(words) + "".join(f", or {s.description}" for s in models)


def build_drafters(mode: str, context: DraftContext) -> list[Drafter]:
    """The drafters of one reply, for the round loop: the mode's own first (the primary: ties go to it), then the
    ones asked beside it where rounds are planned by cost."""
    spec = spec_of_mode(mode)
    if spec is None or spec.build is None:
        return []
    drafters = [spec.build(context)]
    if context.adaptive and context.target.costs is not None:
        beside = replace(context, beside=True)
        for name in spec.beside:
            companion = DRAFTERS[name]
            if companion.build is not None and (companion.offers is None or companion.offers(beside)):
                drafters.append(companion.build(beside))
    return drafters
