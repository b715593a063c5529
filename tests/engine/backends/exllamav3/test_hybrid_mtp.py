"""The ExLlamaV3 backend on Qwen3.5-family folders, against the stand-in (tests/support/exl3_standin).

What exllamav3 1.6.5 does with these folders is checked on its real classes in test_real_hybrids.py (the stand-in
is held to it there); here: what the backend asks of the library for a hybrid and its MTP head (one state slot,
a rewind as wide as its widest pass, the head from the model's own folder, loaded first), the draft mode it
reports, and the one-line refusals (no MTP layer, no MTP weights, a class exllamav3 builds no head for, an
architecture it does not know).
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from engine.backends.exllamav3 import MAX_DRAFT_TOKENS, ExLlamaV3Backend
from engine.backends.registry import engine
from engine.decoding.drafters import DRAFTERS, draft_mode_of
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings
from tests.engine.backends.exllamav3.conftest import MESSAGES, TOKENIZER_FILES
from tests.support.exl3_folders import write_folder

USE_ANOTHER = "use --draft ngram or a draft model"
RECURRENT_NOTE = (
    f"recurrent layers: exllamav3 rewinds rejected drafts (passes up to {MAX_DRAFT_TOKENS} drafts) "
    "and checkpoints the state every 2048 tokens"
)


@pytest.fixture(scope="module")
def reply_ids(smol_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    return tok.encode("Gated deltas roll back, the head drafts ahead.", add_special_tokens=False).ids


@pytest.fixture
def qwen(smol_dir: Path, tmp_path: Path):
    """A Qwen3.5-family folder the stand-in loads, with SmolLM2's tokenizer and a scripted reply."""

    def make(arch: str, script: dict | None = None, **options) -> Path:
        folder = write_folder(tmp_path / arch, arch, **options)
        for name in TOKENIZER_FILES:
            if (smol_dir / name).is_file():
                shutil.copy(smol_dir / name, folder / name)
        (folder / "standin.json").write_text(json.dumps(script or {}), encoding="utf-8")
        return folder

    return make


def run(backend: ExLlamaV3Backend, k: int) -> tuple[list[Chunk], Done]:
    request = GenerationRequest(
        prompt_ids=tuple(backend.encode_chat(MESSAGES)),
        sampler=SamplerSettings(),
        max_new_tokens=64,
        num_draft_tokens=k,
        k_mode="fixed",
        tuning_key="qa",
    )
    events = list(backend.generate(request, threading.Event()))
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1]  # type: ignore[return-value]


def refusal(folder: Path, draft: str = "mtp") -> str:
    with pytest.raises(BackendError) as info:
        ExLlamaV3Backend(folder, draft=draft).load()
    assert "\n" not in str(info.value)
    return str(info.value)


# ------------------------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("arch", ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"])
def test_a_released_qwen3_5_folder_drafts_with_its_own_mtp_head(standin, qwen, reply_ids, arch):
    folder = qwen(arch, {"reply": reply_ids, "end": "eos", "mtp_acceptance": [2, 1]})
    backend = ExLlamaV3Backend(folder, draft="mtp")
    backend.load()
    m = backend._m
    g = m.generator
    assert [
        f"mtp {folder}",
        f"text {folder}",
    ] == standin.standin.LOAD_LOG  # the head first, from the same folder
    assert m.draft_model.component == "mtp" and g.mtp_draft and m.draft_model.attached_model is m.model
    # The hybrid's caches: one state slot each, a rewind as wide as the generator's widest pass.
    assert (m.cache.num_slots, m.draft_cache.num_slots, g.max_batch_size) == (1, 1, 1)
    assert m.cache.max_history == m.draft_cache.max_history == g.max_draft_tokens == MAX_DRAFT_TOKENS
    assert g.target_recurrent and not g.draft_recurrent and g.recurrent_checkpoint_interval == 2048
    info = backend.info
    assert info.draft_mode == draft_mode_of("mtp") == "model" and info.draft_model == "MTP head"
    assert info.notes[:1] == ("drafter: MTP head",) and RECURRENT_NOTE in info.notes
    chunks, done = run(backend, 3)
    assert [(c.drafted, c.accepted) for c in chunks[:2]] == [(3, 2), (3, 1)]
    assert done.notes[0] == "drafter: MTP head, K 3 by fixed K"
    assert [t for c in chunks for t in c.token_ids] == reply_ids


def test_the_registries_agree_with_what_the_backend_runs():
    assert "exllamav3" in DRAFTERS["mtp"].engines and "mtp" in engine("exllamav3").drafters


def test_a_text_only_qwen3_5_folder_is_refused_and_drafts_n_grams(standin, qwen, reply_ids):
    folder = qwen("Qwen3_5ForCausalLM", {"reply": reply_ids, "end": "eos", "ngram_acceptance": [1]})
    assert refusal(folder) == (
        f"exllamav3 1.6.5 has no MTP head for Qwen3_5ForCausalLM ({folder.name}); it drafts with Qwen3.5's MTP "
        f"layer only from a Qwen3_5ForConditionalGeneration folder, as Qwen3.5 is released: {USE_ANOTHER}"
    )
    assert standin.standin.LOAD_LOG == []  # refused before anything loaded
    backend = ExLlamaV3Backend(folder, draft="ngram")
    backend.load()
    m = backend._m
    assert m.generator.target_recurrent and m.cache.max_history == MAX_DRAFT_TOKENS and m.draft_cache is None
    assert backend.info.draft_mode == "ngram" and RECURRENT_NOTE in backend.info.notes
    chunks, _ = run(backend, 4)
    assert [t for c in chunks for t in c.token_ids] == reply_ids


def test_qwen3_next_has_no_mtp_head_in_the_pinned_wheel(standin, qwen):
    folder = qwen("Qwen3NextForCausalLM")
    assert (
        refusal(folder)
        == f"exllamav3 1.6.5 has no MTP head for Qwen3NextForCausalLM ({folder.name}): {USE_ANOTHER}"
    )
    plain = ExLlamaV3Backend(folder, draft="none")
    plain.load()
    assert plain._m.cache.max_history == 0 == plain._m.generator.max_draft_tokens  # no drafts, no rewind
    assert plain.info.draft_mode == "none"


def test_no_mtp_layer_or_no_mtp_weights_is_refused_before_importing(standin, qwen, monkeypatch):
    import engine.backends.exllamav3.backend as backend_module

    def never(*args, **kwargs):
        raise AssertionError("imported exllamav3")

    monkeypatch.setattr(backend_module, "import_exllamav3", never)
    no_layer = qwen("Qwen3_5ForConditionalGeneration", mtp_layers=0)
    assert refusal(no_layer) == (
        f"model folder {no_layer} declares no MTP head (no mtp_num_hidden_layers or num_nextn_predict_layers in "
        f"config.json): {USE_ANOTHER}"
    )
    stripped = qwen("Qwen3_5MoeForConditionalGeneration", mtp_weights=False)
    assert refusal(stripped) == (
        f"model folder {stripped} declares 1 MTP layer but its weights hold no mtp.* tensors (converted without "
        f"the MTP layer?): {USE_ANOTHER}"
    )


def test_an_architecture_the_wheel_does_not_know_is_one_line(standin, qwen):
    folder = qwen("Qwen3_5ForConditionalGeneration")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen9ForCausalLM"]}))
    assert refusal(folder, "ngram") == (
        f"exllamav3 cannot load the model in {folder}: Unknown architecture Qwen9ForCausalLM in "
        f"{folder / 'config.json'}"
    )


def test_an_mtp_head_s_depth_warning_becomes_a_note(standin, qwen):
    # MiMo-V2's head has depth-specialized layers (mimo_v2_mtp.py: "mtp_depths"); exllamav3 prints a warning on
    # stdout when K passes them, which the backend keeps as a note (a TUI is running).
    folder = qwen("Qwen3_5ForConditionalGeneration")
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["MiMoV2ForCausalLM"], "num_nextn_predict_layers": 1, "eos_token_id": 2})
    )
    backend = ExLlamaV3Backend(folder, draft="mtp")
    backend.load()
    assert any(
        n.startswith("exllamav3: Warning: the MTP head has 1 depth-specialized") for n in backend.info.notes
    )
    assert not backend._m.generator.target_recurrent and RECURRENT_NOTE not in backend.info.notes


def test_the_stand_in_refuses_a_rewind_narrower_than_the_pass(standin, qwen):
    # exllamav3's own rule for a recurrent model (generator.py:378-384), which the backend's caches meet above.
    model = standin.Model.from_config(standin.Config.from_directory(str(qwen("Qwen3_5ForCausalLM"))))
    cache = standin.Cache(model, max_num_tokens=256, max_batch_size=1, max_history=4)
    with pytest.raises(
        ValueError, match=r"max_history >= 16 on a recurrent model \(this cache has max_history = 4\)"
    ):
        standin.Generator(model, cache, None, num_draft_tokens=16, ngram_match_min=2)
