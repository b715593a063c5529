"""Both ExLlama engines are thin subclasses of the one base for library-driven engines
(engine/backends/library_generator/): the protocol and the reply's loop live there, the engines say only what their
library does differently, and the registry builds each through the base's `from_args`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.backends.exllamav2 import ExLlamaV2Backend
from engine.backends.exllamav3 import ExLlamaV3Backend
from engine.backends.library_generator import LibraryGeneratorBackend
from engine.backends.registry import ENGINES, build

PROTOCOL = ("info", "load", "encode_chat", "decode", "generate", "close")
LOOP = ("_wanted", "_stream", "_released", "_reply_end", "_iterate", "_done", "tuner", "adaptive_k")


@pytest.mark.parametrize("engine", [ExLlamaV2Backend, ExLlamaV3Backend])
def test_the_protocol_and_the_loop_are_the_base_s_alone(engine):
    assert issubclass(engine, LibraryGeneratorBackend)
    assert [name for name in (*PROTOCOL, *LOOP) if name in vars(engine)] == []
    for hook in ("_import_library", "_build", "_choose_k", "_room", "_new_job", "set_num_draft_tokens"):
        assert hook in vars(engine), f"{engine.__name__} says nothing of {hook}"


@pytest.mark.parametrize("engine", [ExLlamaV2Backend, ExLlamaV3Backend])
def test_the_registry_builds_each_through_the_base(engine, tmp_path):
    row = next(e for e in ENGINES if e.name == engine.name)
    args = SimpleNamespace(
        model=tmp_path,
        draft="none",
        cache_mode="auto",
        draft_cache_mode="q4",
        max_context=1000,
        gpu_split=None,
    )
    backend = build(row, args)  # type: ignore[arg-type]
    assert type(backend) is engine
    assert (backend.cache_mode, backend.draft_cache_mode) == (row.default_cache_mode, "q4")
    assert backend.info.max_context == 1024 and backend.info.draft_cache_mode == ""
