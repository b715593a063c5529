"""The engines' registry (engine/backends/registry.py): every list of engines derives from its rows, each row's
entry points resolve, and an engine added as one row is chosen by `--backend auto` and by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.backends import registry
from engine.backends.base import EngineArgs
from engine.backends.scripted import ScriptedBackend
from engine.backends.select import create_backend


def test_the_config_the_cli_and_doctor_list_the_registry_s_engines() -> None:
    from engine.benchmarks.doctor import CHECK_NAMES
    from engine.config import BACKEND_NAMES, Settings

    assert ("auto", *(row.name for row in registry.ENGINES)) == BACKEND_NAMES
    for name in BACKEND_NAMES:
        assert Settings(backend=name).backend == name
    checks = [row.check for row in registry.ENGINES if row.check]
    assert checks and all(check in CHECK_NAMES for check in checks)


def test_every_row_s_entry_points_resolve() -> None:
    for row in registry.ENGINES:
        assert callable(registry.entry_point(row.build)), row.name
        if row.probe is not None:
            assert callable(registry.entry_point(row.probe)), row.name
        assert isinstance(registry.unusable_hint(row), str) and registry.unusable_hint(row)
        if row.install_hint is not None:
            assert "pip install" in registry.entry_point(row.install_hint)
        assert row.default_cache_mode in ("fp16", "q8", "q6", "q4")
        assert set(row.loads) <= set(registry.FORMATS), row.name


def test_auto_cache_mode_is_each_engine_s_default() -> None:
    for row in registry.ENGINES:
        for spelling in (row.name, row.label):
            assert registry.resolve_cache_mode("auto", spelling) == row.default_cache_mode
            assert registry.resolve_cache_mode(None, spelling) == row.default_cache_mode
        assert registry.resolve_cache_mode("q4", row.name) == "q4"
    assert registry.resolve_cache_mode("auto", "scripted") == "fp16"  # not an engine of the registry


def test_the_cache_modes_a_row_claims_are_the_engine_s_own() -> None:
    from engine.backends.llamacpp.backend import CACHE_TYPE_NAMES
    from engine.backends.transformers.backend import NATIVE_CACHE_MODES

    assert registry.engine("transformers").cache_modes == NATIVE_CACHE_MODES
    # llama.cpp keeps each mode that has a cache type of its own (q6 has none: it takes q8's q8_0)
    first_of_type = {kind: mode for mode, kind in reversed(CACHE_TYPE_NAMES.items())}
    kept = tuple(mode for mode, kind in CACHE_TYPE_NAMES.items() if first_of_type[kind] == mode)
    assert registry.engine("llamacpp").cache_modes == kept


# --- an engine added as one row ----------------------------------------------------------------------------

BUILT: list[EngineArgs] = []


def probe_fake(progress=None) -> tuple[bool, str]:
    return True, "fake runs here"


def build_fake(args: EngineArgs) -> ScriptedBackend:
    BUILT.append(args)
    return ScriptedBackend()


FAKE = registry.Engine(
    name="fake",
    label="fake engine",
    build=f"{__name__}:build_fake",
    probe=f"{__name__}:probe_fake",
    loads=("fp16", "embedded"),
    drafters=("ngram", "none"),
    cache_modes=("fp16",),
    default_cache_mode="q4",
)


def test_one_row_adds_an_engine_that_auto_tries_before_the_fallback(monkeypatch, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():  # pragma: no cover - the GPU engines would be taken first there
        pytest.skip("this machine has CUDA")
    rows = list(registry.ENGINES)
    rows.insert(rows.index(registry.engine("transformers")), FAKE)
    monkeypatch.setattr(registry, "ENGINES", tuple(rows))
    folder = tmp_path / "fp16-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    settings = SimpleNamespace(
        model=folder, draft="ngram", backend="auto", cache_mode="auto", draft_cache_mode="auto", max_context=512,
        gpu_split=None, threads=3,
    )  # fmt: skip
    BUILT.clear()
    backend, why = create_backend(settings)
    assert isinstance(backend, ScriptedBackend)
    assert why == (
        "auto: exllamav2 unusable (no CUDA GPU visible to torch); exllamav3 unusable (no CUDA GPU visible to "
        "torch); fake runs here -> fake engine"
    )
    assert [EngineArgs(model=folder, max_context=512, threads=3)] == BUILT
    backend, why = create_backend(SimpleNamespace(**{**vars(settings), "backend": "fake"}))
    assert isinstance(backend, ScriptedBackend) and why == "fake engine: chosen in settings (fake runs here)"
    assert registry.resolve_cache_mode("auto", "fake") == "q4"
    with pytest.raises(Exception, match="^--draft mtp drafts with the model's own MTP head"):
        create_backend(SimpleNamespace(**{**vars(settings), "backend": "fake", "draft": "mtp"}))


def test_the_bench_reads_which_engine_runs_what_from_the_rows(monkeypatch) -> None:
    """`specchat bench`: the transformers bench where the engine asked for loads no GGUF, the llama.cpp bench
    unless it runs other local models, the answer check on the CPU engines; a row added takes its part."""
    from engine.benchmarks.llamacpp import runs_other_local_models
    from tui.cli.bench import loads, runs_on_the_cpu

    def parts(name: str) -> tuple[bool, bool, bool]:
        return (
            not loads(name, "gguf"),
            not runs_other_local_models(name),
            name == "auto" or runs_on_the_cpu(name),
        )

    assert {name: parts(name) for name in registry.CHOICES} == {
        "auto": (True, True, True),
        "exllamav2": (True, False, False),
        "exllamav3": (True, False, False),
        "transformers": (True, False, True),
        "llamacpp": (False, True, True),
        "remote": (True, True, False),
    }
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES, FAKE))
    assert parts("fake") == (True, False, True)
