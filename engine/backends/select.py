"""Backend selection: "auto" takes exllamav2 where it can run (a CUDA GPU, a built extension), llama.cpp for GGUF
models (a .gguf file, or the embedded model, whose GGUF is kept) where its bindings import, else transformers.
On a GPU, "auto" picks the engine the folder's format needs: EXL3 folders (and `--draft mtp`) run on exllamav3,
EXL2/GPTQ on exllamav2, FP16 folders on exllamav2 where it runs, else exllamav3. Without a GPU it stays on the CPU
backends (an EXL3 folder, which only exllamav3 loads, is then a one-line error).

`create_backend(settings)` returns the backend (not yet loaded) and one line saying which one and why, for the
loading screen and `specchat doctor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.backends.base import Backend, ProgressCallback
from engine.errors import BackendError
from engine.request import resolve_cache_mode


def _model_dir(settings: Any) -> Path:
    if settings.model is not None:
        return Path(settings.model)
    from engine.models import ensure_embedded_model

    return Path(ensure_embedded_model())


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


def _llamacpp(settings: Any) -> Backend:
    from engine.backends.llamacpp import LlamaCppBackend

    if uses_embedded_model(settings):
        from engine.models import EMBEDDED_MODEL_NAME, ensure_embedded_gguf

        path, name = ensure_embedded_gguf(), EMBEDDED_MODEL_NAME
    else:
        path, name = Path(settings.model), None
    return LlamaCppBackend(
        path,
        draft=settings.draft,
        cache_mode=settings.cache_mode,
        draft_cache_mode=settings.draft_cache_mode,
        max_context=settings.max_context,
        threads=getattr(settings, "threads", None),
        model_name=name,
    )


def _remote(settings: Any) -> Backend:
    from engine.backends.remote import RemoteBackend

    return RemoteBackend(
        settings.endpoint,
        api_key_env=getattr(settings, "api_key_env", None),
        model=getattr(settings, "remote_model", None),
        max_context=settings.max_context,
    )


def uses_remote(settings: Any) -> bool:
    """Whether `settings` pick the remote backend (no local model is needed then)."""
    return settings.backend == "remote" or (
        settings.backend == "auto" and bool(getattr(settings, "endpoint", None))
    )


def _exllamav2(settings: Any, model_dir: Path) -> Backend:
    from engine.backends.exllamav2 import ExLlamaV2Backend

    return ExLlamaV2Backend(
        model_dir,
        draft=settings.draft,
        cache_mode=resolve_cache_mode(settings.cache_mode, "exllamav2"),
        draft_cache_mode=resolve_cache_mode(settings.draft_cache_mode, "exllamav2"),
        max_context=settings.max_context,
        gpu_split=settings.gpu_split,
    )


def _exllamav3(settings: Any, model_dir: Path) -> Backend:
    from engine.backends.exllamav3 import ExLlamaV3Backend

    return ExLlamaV3Backend(
        model_dir,
        draft=settings.draft,
        cache_mode=resolve_cache_mode(settings.cache_mode, "exllamav3"),
        draft_cache_mode=resolve_cache_mode(settings.draft_cache_mode, "exllamav3"),
        max_context=settings.max_context,
        gpu_split=settings.gpu_split,
    )


def _folder_format(settings: Any) -> str:
    """The model folder's format ("exl3", "exl2", "gptq", "fp16"); the embedded model is FP16."""
    if settings.model is None:
        return "fp16"
    from engine.backends.exllamav3.folder import folder_format

    return folder_format(Path(settings.model)) or "fp16"


def _transformers(settings: Any, model_dir: Path) -> Backend:
    from engine.backends.transformers import TransformersBackend

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
    """The backend `settings.backend` asks for ("auto", "exllamav2", "exllamav3", "transformers", "llamacpp"), and why.

    `settings` needs: model (Path | None: the embedded model), draft, backend, cache_mode, draft_cache_mode,
    max_context, gpu_split. BackendError (one line) where a backend is asked for by name and cannot run here.
    `progress` hears about the first start's build of exllamav2's CUDA extension, which the probe may trigger.
    """
    choice = settings.backend
    if choice not in ("auto", "exllamav2", "exllamav3", "transformers", "llamacpp", "remote"):
        raise BackendError(
            f"unknown backend {choice!r}: use auto, exllamav2, exllamav3, transformers, llamacpp or remote"
        )
    mtp = getattr(settings, "draft", None) == "mtp"
    if mtp and (
        choice not in ("auto", "exllamav3")
        or (settings.model is not None and is_gguf_path(Path(settings.model)))
    ):
        raise BackendError(
            "--draft mtp drafts with the model's own MTP head, which only exllamav3 runs: "
            "use --backend exllamav3 (or auto on a GPU)"
        )
    endpoint = getattr(settings, "endpoint", None)
    if choice == "remote" or (choice == "auto" and endpoint):
        if not endpoint:
            raise BackendError("--backend remote needs --endpoint URL (the server's base URL)")
        return _remote(settings), (
            "remote: chosen in settings" if choice == "remote" else "auto: an endpoint is set -> remote"
        )
    from engine.backends.exllamav2 import probe_exllamav2
    from engine.backends.llamacpp import probe_llamacpp

    gguf = settings.model is not None and is_gguf_path(Path(settings.model))
    if choice == "llamacpp":
        usable, reason = probe_llamacpp()
        if not usable:
            raise BackendError(
                f"llama.cpp is unusable here: {reason}; run make install or use --backend auto"
            )
        if not gguf and not uses_embedded_model(settings):
            raise BackendError(
                f"llama.cpp needs a .gguf model file, and {settings.model} is not one; "
                "use --backend transformers for a Hugging Face folder"
            )
        return _llamacpp(settings), f"llama.cpp: chosen in settings ({reason})"
    if gguf:
        if choice != "auto":
            raise BackendError(
                f"{settings.model} is a GGUF model: only the llama.cpp backend runs it; use --backend llamacpp"
            )
        usable, reason = probe_llamacpp()
        if not usable:
            raise BackendError(f"{settings.model} is a GGUF model and needs llama.cpp, but {reason}")
        return _llamacpp(settings), f"auto: a GGUF model and {reason} -> llama.cpp"
    if choice == "transformers":
        return _transformers(settings, _model_dir(settings)), "transformers: chosen in settings"
    from engine.backends.exllamav3 import probe_exllamav3

    if choice == "exllamav3":
        usable3, reason3 = probe_exllamav3(progress)
        if not usable3:
            raise BackendError(
                f"exllamav3 is unusable here: {reason3}; use --backend auto for the CPU backends"
            )
        return _exllamav3(settings, _model_dir(settings)), f"exllamav3: chosen in settings ({reason3})"
    fmt = _folder_format(settings)
    if choice == "auto" and (fmt == "exl3" or mtp):
        usable3, reason3 = probe_exllamav3(progress)
        what = "an EXL3 folder" if fmt == "exl3" else "--draft mtp"
        if not usable3:
            raise BackendError(
                f"{what} needs exllamav3 (only it runs {'EXL3 weights' if fmt == 'exl3' else 'an MTP head'}), "
                f"but it is unusable here: {reason3}"
            )
        return _exllamav3(settings, _model_dir(settings)), f"auto: {what} and {reason3} -> exllamav3"
    usable, reason = probe_exllamav2(progress)
    if choice == "exllamav2":
        if not usable:
            raise BackendError(f"exllamav2 is unusable here: {reason}; use --backend transformers")
        return _exllamav2(settings, _model_dir(settings)), f"exllamav2: chosen in settings ({reason})"
    if usable:
        return _exllamav2(settings, _model_dir(settings)), f"auto: {reason} -> exllamav2"
    if fmt == "fp16":
        usable3, reason3 = probe_exllamav3(progress)
        if usable3:  # a GPU without exllamav2: its successor loads FP16 folders too
            return _exllamav3(settings, _model_dir(settings)), (
                f"auto: exllamav2 unusable ({reason}); {reason3} -> exllamav3"
            )
    if uses_embedded_model(settings):
        llama_usable, llama_reason = probe_llamacpp()
        if llama_usable:
            return _llamacpp(settings), (
                f"auto: exllamav2 unusable ({reason}); embedded model as GGUF and {llama_reason} -> llama.cpp"
            )
        return _transformers(settings, _model_dir(settings)), (
            f"auto: exllamav2 unusable ({reason}); {llama_reason} -> transformers"
        )
    return _transformers(
        settings, _model_dir(settings)
    ), f"auto: exllamav2 unusable ({reason}) -> transformers"
