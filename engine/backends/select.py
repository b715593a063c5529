"""Backend selection, read from the registry (engine/backends/registry.py): `--backend NAME` builds that engine where
it can run here; `--backend auto` takes the remote engine where an endpoint is set, else walks the engines in the
registry's order, keeps those that load the model's format (and run the drafter asked for), and builds the first
whose probe says it runs here, an engine marked `fallback` (transformers) only after the others.

So on a GPU an EXL3 folder (and `--draft mtp`) runs on exllamav3, EXL2/GPTQ on exllamav2, FP16 folders on exllamav2
where it runs, else exllamav3; a GGUF model on llama.cpp; without a GPU the embedded model runs on llama.cpp (its
GGUF) where the bindings import, else transformers. A format only one engine loads is a one-line error where that
engine cannot run here.

`create_backend(settings)` returns the backend (not yet loaded) and one line saying which one and why, for the
loading screen and `specchat doctor`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.backends import registry
from engine.backends.base import Backend, EngineArgs, ProgressCallback
from engine.backends.registry import Engine
from engine.errors import BackendError

# How a reason names a format that decides the engine, and what the engine runs of it.
FORMAT_PHRASES = {
    "gguf": ("a GGUF model", "GGUF files"),
    "exl3": ("an EXL3 folder", "EXL3 weights"),
    "exl2": ("an EXL2 folder", "EXL2 weights"),
    "gptq": ("a GPTQ folder", "GPTQ weights"),
    "endpoint": ("an endpoint is set", "servers"),
}
MTP_PHRASES = ("--draft mtp", "an MTP head")


def is_gguf_path(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" or (path.is_dir() and any(path.glob("*.gguf")))


def uses_embedded_model(settings: Any) -> bool:
    if settings.model is None:
        return True
    from engine.models import embedded_model_dir

    try:
        return Path(settings.model).expanduser().resolve() == embedded_model_dir().resolve()
    except OSError:
        return False


def uses_remote(settings: Any) -> bool:
    """Whether `settings` pick the remote backend (no local model is needed then)."""
    return settings.backend == "remote" or (
        settings.backend == "auto" and bool(getattr(settings, "endpoint", None))
    )


def model_format(settings: Any) -> str:
    """The format of the model `settings` name (registry.FORMATS): the embedded model, a GGUF file or folder, else
    the folder's weights ("exl3", "exl2", "gptq", "fp16")."""
    if uses_embedded_model(settings):
        return "embedded"
    path = Path(settings.model)
    if is_gguf_path(path):
        return "gguf"
    from engine.models import folder_format

    return folder_format(path) or "fp16"


def _args(settings: Any, fmt: str) -> EngineArgs:
    args = EngineArgs.from_settings(settings)
    # The embedded model as each engine loads it (llama.cpp its GGUF, the others the converted folder).
    return replace(args, model=None) if fmt == "embedded" else args


def _wants_mtp(settings: Any) -> bool:
    return getattr(settings, "draft", None) == "mtp"


def _only_mtp_error() -> BackendError:
    names = [row for row in registry.ENGINES if "mtp" in row.drafters]
    return BackendError(
        f"--draft mtp drafts with the model's own MTP head, which only {' and '.join(r.name for r in names)} "
        f"runs: use --backend {names[0].name} (or auto on a GPU)"
    )


def create_backend(settings: Any, progress: ProgressCallback | None = None) -> tuple[Backend, str]:
    """The backend `settings.backend` asks for ("auto" or an engine's name), and why.

    `settings` needs: model (Path | None: the embedded model), draft, backend, cache_mode, draft_cache_mode,
    max_context, gpu_split (and endpoint, threads, device where set). BackendError (one line) where an engine is
    asked for by name and cannot run here. `progress` hears about the first start's build of a CUDA extension,
    which a probe may trigger.
    """
    choice = settings.backend
    if choice == "auto" and getattr(settings, "endpoint", None):
        row = next(row for row in registry.ENGINES if "endpoint" in row.loads)
        return registry.build(row, EngineArgs.from_settings(settings)), (
            f"auto: {FORMAT_PHRASES['endpoint'][0]} -> {row.label}"
        )
    if choice == "auto":
        return _auto(settings, progress)
    try:
        row = registry.engine(choice)
    except registry.UnknownEngine:
        names = ["auto", *(row.name for row in registry.ENGINES)]
        raise BackendError(
            f"unknown backend {choice!r}: use {', '.join(names[:-1])} or {names[-1]}"
        ) from None
    return _named(row, settings, progress)


def _named(row: Engine, settings: Any, progress: ProgressCallback | None) -> tuple[Backend, str]:
    """The engine asked for by name, where it runs here and loads the model."""
    if _wants_mtp(settings) and "mtp" not in row.drafters:
        raise _only_mtp_error()
    if "endpoint" in row.loads:
        if not getattr(settings, "endpoint", None):
            raise BackendError(f"--backend {row.name} needs --endpoint URL (the server's base URL)")
        return registry.build(row, EngineArgs.from_settings(settings)), f"{row.label}: chosen in settings"
    fmt = model_format(settings)
    if fmt not in row.loads and fmt in ("gguf", "fp16"):
        # GGUF files and Hugging Face folders are each one kind of engine's: say which runs this one.
        loaders = [other for other in registry.ENGINES if fmt in other.loads]
        if fmt == "gguf":
            raise BackendError(
                f"{settings.model} is a GGUF model: only the {loaders[0].label} backend runs it; "
                f"use --backend {loaders[0].name}"
            )
        raise BackendError(
            f"{row.label} needs a .gguf model file, and {settings.model} is not one; "
            f"use --backend {next(o.name for o in loaders if o.fallback)} for a Hugging Face folder"
        )
    usable, reason = registry.probe(row, progress)
    if not usable:
        raise BackendError(f"{row.label} is unusable here: {reason}; {registry.unusable_hint(row)}")
    return registry.build(row, _args(settings, fmt)), f"{row.label}: chosen in settings" + (
        f" ({reason})" if reason else ""
    )


def _auto(settings: Any, progress: ProgressCallback | None) -> tuple[Backend, str]:
    """The first engine in the registry's order that loads the model (and the drafter) and runs here."""
    fmt = model_format(settings)
    mtp = _wants_mtp(settings)
    rows = [row for row in registry.ENGINES if fmt in row.loads and "endpoint" not in row.loads]
    if mtp:
        # the engines whose MTP drafting loads this format (a GGUF: llama.cpp; a folder: exllamav3)
        rows = [row for row in rows if "mtp" in row.drafters]
        if not rows:
            raise _only_mtp_error()
    if not rows:
        raise BackendError(f"no engine loads {settings.model}")
    rows = [row for row in rows if not row.fallback] + [row for row in rows if row.fallback]
    # Why the first candidate is the one: a format (or drafter) only it runs.
    what, runs = MTP_PHRASES if mtp else FORMAT_PHRASES.get(fmt, ("", ""))
    sole = len(rows) == 1
    skipped: list[tuple[str, str]] = []  # (label, reason) of the engines passed over
    for row in rows:
        usable, reason = registry.probe(row, progress)
        if not usable:
            if sole:
                raise BackendError(
                    f"{what} needs {row.label} (only it runs {runs}), but it is unusable here: {reason}"
                )
            skipped.append((row.label, reason))
            continue
        said = what if sole else "embedded model as GGUF" if fmt == "embedded" and "gguf" in row.loads else ""
        parts = [*_passed_over(skipped), " and ".join(p for p in (said, reason) if p)]
        why = "; ".join(p for p in parts if p)
        return registry.build(row, _args(settings, fmt)), f"auto: {why} -> {row.label}"
    raise BackendError(f"no engine runs {settings.model} here: " + "; ".join(_passed_over(skipped)))


def _passed_over(skipped: list[tuple[str, str]]) -> list[str]:
    """ "name unusable (reason)" for each engine passed over, in the order they were tried."""
    return [f"{label} unusable ({reason})" for label, reason in skipped]
