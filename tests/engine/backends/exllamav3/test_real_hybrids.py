"""Qwen3.5's MTP folder and a hybrid's cache on the pinned exllamav3's REAL classes, and the stand-in beside them.

The real `Config`, `Model` and `Cache` are built here without CUDA (their tensors stay unallocated until a load):
the same tiny folders (tests/support/exl3_folders.py) go through the real package and through the stand-in, and
what the backend can observe must agree: the architecture, the components it can build (is there an "mtp" one?),
the text model's and the MTP head's caps, the assertion for a missing component, the slots and history a cache
built with the backend's keywords has. The generator cannot be built without CUDA: its rules for these models are
read from its source, as test_signatures.py does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.backends.exllamav3.backend import BATCH, MAX_DRAFT_TOKENS
from engine.backends.exllamav3.folder import MTP_FOLDER_OF, MTP_TENSOR_PREFIX, mtp_refusal
from engine.backends.exllamav3.sampling import cache_kwargs
from tests.support import paths
from tests.support.exl3_folders import write_folder
from tests.support.exl3_real import real_exllamav3, unpacked_source

HYBRIDS = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
CAPS = (
    "recurrent_states",
    "default_recurrent_checkpoint_interval",
    "mtp_draft",
    "attach_target",
    "mtp_depths",
)


def folders(root: Path) -> dict[tuple[str, int], Path]:
    """Every hybrid architecture with one MTP layer declared and with none."""
    return {
        (arch, layers): write_folder(
            root / f"{arch}-{layers}", arch, mtp_layers=layers, mtp_weights=bool(layers)
        )
        for arch in HYBRIDS
        for layers in (1, 0)
    }


def observed(ex: Any, folder: Path) -> dict[str, Any]:
    """What the backend can see of a folder through an exllamav3 package (real or stand-in)."""
    config = ex.Config.from_directory(str(folder))
    model = ex.Model.from_config(config)
    seen: dict[str, Any] = {
        "architecture": config.architecture,
        "components": sorted(c for c in config.model_classes if c != "vision"),  # vision: never asked for
        "text caps": {k: v for k, v in model.caps.items() if k in CAPS},
        "recurrent state": model.recurrent_state_cls is not None,
    }
    cache = ex.Cache(
        model,
        max_num_tokens=256,
        max_batch_size=BATCH,
        max_history=MAX_DRAFT_TOKENS,
        **cache_kwargs("q8", ex.CacheLayer_fp16, ex.CacheLayer_quant),
    )
    seen["cache"] = (cache.num_slots, cache.max_history, cache.num_recurrent_layers > 0)
    try:
        head = ex.Model.from_config(config, component="mtp")
    except AssertionError as exc:
        seen["mtp"] = str(exc)
    else:
        seen["mtp"] = {k: v for k, v in head.caps.items() if k in CAPS}
        seen["mtp recurrent"] = bool(head.caps.get("recurrent_states"))
    return seen


def standin_observed(targets: dict[tuple[str, int], Path]) -> SimpleNamespace:
    """The stand-in's view of the folders, and the architectures it knows."""
    saved = {n: m for n, m in sys.modules.items() if n == "exllamav3" or n.startswith("exllamav3.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(paths.EXL3_STANDIN))
    try:
        import exllamav3 as standin
        from exllamav3.model.config import ARCHITECTURES

        assert "exl3_standin" in standin.__file__
        seen = {key: observed(standin, folder) for key, folder in targets.items()}
        return SimpleNamespace(architectures=set(ARCHITECTURES), seen=seen)
    finally:
        sys.path.remove(str(paths.EXL3_STANDIN))
        for name in [n for n in sys.modules if n == "exllamav3" or n.startswith("exllamav3.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def hybrid_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    return folders(tmp_path_factory.mktemp("hybrids"))


@pytest.fixture(scope="module")
def real(hybrid_folders):
    try:
        with real_exllamav3() as module:
            from exllamav3.architecture.architectures import get_architectures

            seen = {key: observed(module, folder) for key, folder in hybrid_folders.items()}
            heads = {}
            for arch in MTP_TENSOR_PREFIX:
                config = module.Config.from_directory(str(hybrid_folders[(arch, 1)]))
                if "mtp" in config.model_classes:
                    heads[arch] = [m.key for m in module.Model.from_config(config, component="mtp").modules]
            yield SimpleNamespace(architectures=set(get_architectures()), seen=seen, heads=heads)
    except RuntimeError as exc:  # no wheel to be had: one line saying why
        pytest.fail(str(exc))


# ------------------------------------------------------------------------------------------------ the tests


def test_the_stand_in_sees_these_folders_as_the_real_package_does(real, hybrid_folders):
    assert standin_observed(hybrid_folders).seen == real.seen


def test_what_the_pinned_wheel_does_with_qwen3_5_and_qwen3_next(real):
    seen = real.seen
    for arch in HYBRIDS:  # every one runs, as a hybrid: recurrent state, checkpoints every 2048 tokens
        assert arch in real.architectures
        assert seen[(arch, 1)]["text caps"] == {
            "recurrent_states": True,
            "default_recurrent_checkpoint_interval": 2048,
        }
        # The backend's cache: one state slot, a rewind as wide as the widest pass.
        assert seen[(arch, 1)]["cache"] == (1, MAX_DRAFT_TOKENS, True)
    # MTP: only the multimodal classes (as Qwen3.5 is released), only where a layer is declared; a plain head.
    with_head = {arch for arch in HYBRIDS if isinstance(seen[(arch, 1)]["mtp"], dict)}
    assert with_head == {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}
    for arch in with_head:
        assert seen[(arch, 1)]["mtp"] == {
            "mtp_draft": True,
            "attach_target": True,
        }  # no mtp_depths: no warning
        assert not seen[(arch, 1)]["mtp recurrent"]  # a recurrent MTP head the generator would refuse
        assert seen[(arch, 1)]["cache"] == (1, MAX_DRAFT_TOKENS, True)
        assert seen[(arch, 0)]["mtp"] == f"{arch} does not define a 'mtp' component model"
    assert (
        seen[("Qwen3_5ForCausalLM", 1)]["mtp"] == "Qwen3_5ForCausalLM does not define a 'mtp' component model"
    )
    assert seen[("Qwen3NextForCausalLM", 1)]["components"] == ["text"]


def test_the_folder_tables_hold_for_the_real_package(real):
    for text_only, released in MTP_FOLDER_OF.items():
        assert isinstance(real.seen[(released, 1)]["mtp"], dict)
        assert isinstance(real.seen[(text_only, 1)]["mtp"], str)
    assert set(real.heads) == {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}
    for arch, keys in real.heads.items():  # every module of the head reads mtp.* weights
        prefix = MTP_TENSOR_PREFIX[arch]
        assert keys and all(k == prefix.rstrip(".") or k.startswith(prefix) for k in keys), keys


def test_every_architecture_the_stand_in_knows_is_a_real_one(real, hybrid_folders):
    assert standin_observed({}).architectures <= real.architectures


def test_the_generator_s_rules_for_hybrids_and_mtp_heads():
    text = (unpacked_source() / "exllamav3/generator/generator.py").read_text(encoding="utf-8")
    # A recurrent target needs max_history >= the widest pass; the batch is clamped to the cache's slots.
    assert "if self.max_draft_tokens > cache.max_history:" in text
    assert 'f"max_history >= {self.max_draft_tokens} on a recurrent model (this cache has "' in text
    assert "self.max_batch_size = min(self.max_batch_size, c.num_slots)" in text
    # A head that borrows the target's embedding and lm_head is bound to it; a recurrent MTP head is refused.
    assert "draft_model.attach_to(model)" in text
    assert (
        'assert not draft_model.caps.get("mtp_draft"), "Recurrent MTP draft models are not supported."'
        in text
    )
    # The checkpoint interval the backend reports comes from the model's caps.
    assert (
        'recurrent_checkpoint_interval = schedule_model.caps.get("default_recurrent_checkpoint_interval", 2048)'
        in text
    )


def test_the_refusals_read_from_the_files_alone(tmp_path):
    no_layer = write_folder(tmp_path / "none", "Qwen3_5ForConditionalGeneration", mtp_layers=0)
    assert "declares no MTP head" in (mtp_refusal(no_layer) or "")
    stripped = write_folder(tmp_path / "stripped", "Qwen3_5ForConditionalGeneration", mtp_weights=False)
    assert mtp_refusal(stripped) == (
        f"model folder {stripped} declares 1 MTP layer but its weights hold no mtp.* tensors (converted without "
        "the MTP layer?): use --draft ngram or a draft model"
    )
    assert mtp_refusal(write_folder(tmp_path / "ok", "Qwen3_5ForConditionalGeneration")) is None
