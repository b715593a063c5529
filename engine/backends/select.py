"""Backend selection: "auto" takes exllamav2 where it can run (a CUDA GPU, a built extension), else transformers.

`create_backend(settings)` returns the backend (not yet loaded) and one line saying which one and why, for the
loading screen and `specchat doctor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.backends.base import Backend, BackendError, ProgressCallback, resolve_cache_mode


def _model_dir(settings: Any) -> Path:
    if settings.model is not None:
        return Path(settings.model)
    from engine.models import ensure_embedded_model

    return Path(ensure_embedded_model())


def _exllamav2(settings: Any, model_dir: Path) -> Backend:
    from engine.backends.exl2 import ExLlamaV2Backend

    return ExLlamaV2Backend(
        model_dir,
        draft=settings.draft,
        cache_mode=resolve_cache_mode(settings.cache_mode, "exllamav2"),
        draft_cache_mode=resolve_cache_mode(settings.draft_cache_mode, "exllamav2"),
        max_context=settings.max_context,
        gpu_split=settings.gpu_split,
    )


def _transformers(settings: Any, model_dir: Path) -> Backend:
    from engine.backends.hf import TransformersBackend

    extra = {}
    device = getattr(settings, "device", "auto")
    if device and device != "auto":  # an explicit device is the transformers backend's business
        extra["device"] = device
    return TransformersBackend(
        model_dir,
        draft=settings.draft,
        cache_mode=resolve_cache_mode(settings.cache_mode, "transformers"),
        draft_cache_mode=resolve_cache_mode(settings.draft_cache_mode, "transformers"),
        max_context=settings.max_context,
        **extra,
    )


def create_backend(settings: Any, progress: ProgressCallback | None = None) -> tuple[Backend, str]:
    """The backend `settings.backend` asks for ("auto", "exllamav2" or "transformers"), and why it was chosen.

    `settings` needs: model (Path | None: the embedded model), draft, backend, cache_mode, draft_cache_mode,
    max_context, gpu_split. BackendError (one line) where exllamav2 is asked for by name and cannot run here.
    `progress` hears about the first start's build of exllamav2's CUDA extension, which the probe may trigger.
    """
    from engine.backends.exl2 import probe_exllamav2

    choice = settings.backend
    if choice not in ("auto", "exllamav2", "transformers"):
        raise BackendError(f"unknown backend {choice!r}: use auto, exllamav2 or transformers")
    if choice == "transformers":
        return _transformers(settings, _model_dir(settings)), "transformers: chosen in settings"
    usable, reason = probe_exllamav2(progress)
    if choice == "exllamav2":
        if not usable:
            raise BackendError(f"exllamav2 is unusable here: {reason}; use --backend transformers")
        return _exllamav2(settings, _model_dir(settings)), f"exllamav2: chosen in settings ({reason})"
    if usable:
        return _exllamav2(settings, _model_dir(settings)), f"auto: {reason} -> exllamav2"
    return _transformers(
        settings, _model_dir(settings)
    ), f"auto: exllamav2 unusable ({reason}) -> transformers"
