"""`--backend auto` and `--backend llamacpp`: which engine runs which model, and the one-line reason."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.backends import llamacpp
from engine.backends.select import create_backend
from engine.errors import BackendError


def settings_for(model: Path | None, backend: str) -> SimpleNamespace:
    return SimpleNamespace(
        model=model, draft="ngram", backend=backend, cache_mode="q8", draft_cache_mode="q8", max_context=1024,
        gpu_split=None,
    )  # fmt: skip


@pytest.fixture
def no_bindings(monkeypatch):
    monkeypatch.setattr(
        "engine.backends.llamacpp.library.probe_llamacpp",
        lambda progress=None: (False, "llama-cpp-python is not installed"),
    )


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.Q4_0.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def test_a_gguf_path_takes_llama_cpp(fake_gguf: Path) -> None:
    pytest.importorskip("llama_cpp")
    backend, why = create_backend(settings_for(fake_gguf, "auto"))
    assert isinstance(backend, llamacpp.LlamaCppBackend)
    assert why.startswith("auto: a GGUF model and llama-cpp-python") and why.endswith("-> llama.cpp")
    backend, why = create_backend(settings_for(fake_gguf, "llamacpp"))
    assert isinstance(backend, llamacpp.LlamaCppBackend) and why.startswith("llama.cpp: chosen in settings")


def test_the_embedded_model_takes_llama_cpp_from_its_gguf(smol_dir: Path) -> None:
    pytest.importorskip("llama_cpp")
    from engine.models import embedded_gguf_path

    for model in (None, smol_dir):  # unset, or the converted folder the session passes in
        backend, why = create_backend(settings_for(model, "auto"))
        assert isinstance(backend, llamacpp.LlamaCppBackend)
        assert backend.model_path == embedded_gguf_path("f16") and backend.model_path.is_file()
        assert why.endswith("embedded model as GGUF and llama-cpp-python 0.3.36 imports -> llama.cpp")
        assert backend.info.model == "SmolLM2-135M-Instruct"


def test_without_bindings_auto_falls_back_to_transformers_and_says_why(smol_dir: Path, no_bindings) -> None:
    from engine.backends.transformers import TransformersBackend

    backend, why = create_backend(settings_for(None, "auto"))
    assert isinstance(backend, TransformersBackend)
    # every engine passed over is named with its reason
    assert why.endswith("; llama.cpp unusable (llama-cpp-python is not installed) -> transformers")
    with pytest.raises(BackendError, match="^llama.cpp is unusable here: llama-cpp-python is not installed"):
        create_backend(settings_for(None, "llamacpp"))


def test_a_gguf_without_bindings_is_a_clear_error(fake_gguf: Path, no_bindings) -> None:
    with pytest.raises(
        BackendError, match="^a GGUF model needs llama.cpp .*it is unusable here: llama-cpp-python is not"
    ):
        create_backend(settings_for(fake_gguf, "auto"))


def test_wrong_pairs_of_model_and_backend_are_one_line_errors(fake_gguf: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("llama_cpp")
    with pytest.raises(BackendError, match="only the llama.cpp backend runs it; use --backend llamacpp$"):
        create_backend(settings_for(fake_gguf, "transformers"))
    with pytest.raises(BackendError, match="needs a .gguf model file.*use --backend transformers"):
        create_backend(settings_for(tiny_model_dir, "llamacpp"))
    backend, why = create_backend(settings_for(tiny_model_dir, "auto"))  # an HF folder: transformers
    assert why.endswith("-> transformers")
