"""Loading a chat's model: the files it needs fetched first (the embedded model, a named model not fetched yet), the
engine chosen, built and loaded; where a bad model path came from; a model or draft checked as it is typed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from engine.backends.base import Backend
from engine.config import Settings, env_name, settings_with
from engine.errors import SpecchatError, UserError
from engine.events import BackendInfo

ProgressCallback = Callable[[str, float | None], None]


def fetch_model_files(settings: Settings, progress: ProgressCallback | None = None) -> Settings:
    """`settings` with the model fetched where it is not there yet: the embedded model where none is set, a named
    model's files. Fetched before the engine is built, so the download and conversion show progress (a remote
    server needs no model)."""
    from engine.backends.select import uses_remote

    if settings.model is None and not uses_remote(settings):
        from engine.models import ensure_embedded_model

        settings = settings.model_copy(update={"model": ensure_embedded_model(progress)})
    if not uses_remote(settings):  # a named model (qwen2.5-coder-1.5b) not fetched yet
        from engine.models.named import ensure_named_files

        ensure_named_files(settings, progress)
    return settings


@dataclasses.dataclass
class Replacement:
    """A model loaded to take over a chat: its backend, why that engine, its info, the chat's settings with the new
    model and draft, and the model folder as loaded (the embedded model's cache folder where none was set)."""

    backend: Backend
    reason: str
    info: BackendInfo
    settings: Settings
    model_dir: str


def load_replacement(
    settings: Settings,
    model: str | Path | None,
    draft: str,
    progress: ProgressCallback | None = None,
    options: Mapping[str, Any] | None = None,
) -> Replacement:
    """A new backend for `settings` with `model` (None: the embedded model, fetched and converted on its first use)
    and `draft`, and any other engine `options` (a form's text by setting name, checked as the config file's),
    loaded. Any failure is a UserError in one line (out of memory too); a backend that fails half-loaded is closed
    (what it holds is freed) before the failure goes on."""
    from engine.backends.select import create_backend
    from engine.models import check_draft_choice, check_model_path
    from engine.models.named import ensure_named_files

    model_path = check_model_path(model) if model not in (None, "") else None
    draft = check_draft_choice(draft)
    settings = settings_with(settings, options or {}).model_copy(update={"model": model_path, "draft": draft})
    backend: Backend | None = None
    try:
        loading = settings
        if settings.model is None:
            from engine.models import ensure_embedded_model

            loading = settings.model_copy(update={"model": ensure_embedded_model(progress)})
        ensure_named_files(loading, progress)  # a named model or draft not fetched yet
        backend, reason = create_backend(loading, progress)
        backend.load(progress)
        info = backend.info
    except (UserError, MemoryError) as exc:
        if backend is not None:
            with contextlib.suppress(Exception):  # half-loaded: free what it holds
                backend.close()
        if isinstance(exc, MemoryError):
            raise SpecchatError(
                "out of memory loading the new model: the current one stays loaded; "
                "try a smaller model or lower max_context"
            ) from exc
        raise
    return Replacement(backend, reason, info, settings, str(loading.model))


@contextlib.contextmanager
def load_errors(settings: Settings) -> Iterator[None]:
    """Loading `settings`' model: a bad path says where it came from (the error keeps its type and title), out of
    memory is a one-line error."""
    try:
        yield
    except UserError as exc:
        source = model_source(settings)
        if source:
            exc.args = (source + str(exc), *exc.args[1:])
        raise
    except MemoryError as exc:
        raise SpecchatError(
            "out of memory loading the model: lower max_context or use a smaller model"
        ) from exc


def model_source(settings: Settings) -> str:
    """'SPECCHAT_MODEL: ' when the model folder was set through that variable, so a bad path names its source."""
    value = os.environ.get(env_name("model"))
    model = settings.model
    if value and model is not None and Path(value).expanduser() == Path(model):
        return f"{env_name('model')}: "
    return ""


def check_model_choice(model: str | Path | None = None, draft: str | None = None) -> None:
    """ModelError (one line) unless `model` (None: not checked) holds a model and `draft` (None: not checked) is a
    drafter's name or a draft model. Reads file headers only: fit to run as a path is typed."""
    from engine.models import check_draft_choice, check_model_path

    if model is not None:
        check_model_path(model)
    if draft is not None:
        check_draft_choice(draft)
