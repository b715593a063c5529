"""Draft/target compatibility: each rule passes a real matching pair and fails a real mismatch, by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.chat_template import ChatTemplate
from engine.decoding.draft_compat import (
    SAMPLE_HEAD,
    DraftIncompatibleError,
    VocabView,
    check_draft_compatible,
    sample_ids,
    special_token_ids,
)


def _view(folder: Path) -> VocabView:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    template = ChatTemplate.from_folder(folder)
    return VocabView(
        name=folder.name,
        tokenizer_size=len(tokenizer),
        special_ids=special_token_ids(tokenizer, template.end_of_turn),
        tokenizer=tokenizer,
    )


def _copy_tokenizer(source: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
    return dest


def test_sample_covers_head_spread_and_last_id() -> None:
    ids = sample_ids(49152)
    assert ids[:SAMPLE_HEAD] == list(range(SAMPLE_HEAD))
    assert ids[-1] == 49151
    assert len(ids) > 900
    assert ids == sorted(set(ids))
    assert sample_ids(10) == list(range(10))


@pytest.mark.slow
def test_same_tokenizer_is_compatible(smol_dir: Path, tiny_model_dir: Path) -> None:
    target = _view(smol_dir)
    assert target.special_ids["end_of_turn"] == 2
    check_draft_compatible(target, _view(tiny_model_dir))  # no error


@pytest.mark.slow
def test_other_vocabulary_fails_the_size_rule(smol_dir: Path, tiny_model_dir_other_vocab: Path) -> None:
    with pytest.raises(DraftIncompatibleError, match="vocabulary size differs"):
        check_draft_compatible(_view(smol_dir), _view(tiny_model_dir_other_vocab))


@pytest.mark.slow
def test_swapped_token_strings_fail_the_string_rule(smol_dir: Path, tmp_path: Path) -> None:
    folder = _copy_tokenizer(smol_dir, tmp_path / "swapped")
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    by_id = {i: token for token, i in vocab.items()}
    # Same size, same specials, two sampled ids (past the head) spelled the other way round.
    first, second = sample_ids(len(vocab))[SAMPLE_HEAD + 10 : SAMPLE_HEAD + 12]
    vocab[by_id[first]], vocab[by_id[second]] = second, first
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DraftIncompatibleError, match=f"token strings differ \\(id {first} "):
        check_draft_compatible(_view(smol_dir), _view(folder))


@pytest.mark.slow
def test_other_end_of_turn_id_fails_the_special_token_rule(smol_dir: Path, tmp_path: Path) -> None:
    folder = _copy_tokenizer(smol_dir, tmp_path / "other-eos")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["eos_token"] = "<|endoftext|>"  # id 0 instead of <|im_end|> (2)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(
        DraftIncompatibleError, match="special token ids differ \\(eos: draft 0 vs target 2\\)"
    ):
        check_draft_compatible(_view(smol_dir), _view(folder))


@pytest.mark.slow
def test_larger_draft_vocabulary_that_extends_the_target_is_accepted(smol_dir: Path, tmp_path: Path) -> None:
    folder = _copy_tokenizer(smol_dir, tmp_path / "extended")
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    size = len(data["model"]["vocab"]) + len(data.get("added_tokens", []))
    data["model"]["vocab"]["zzz_extra_token_zzz"] = max(data["model"]["vocab"].values()) + 1
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    draft = _view(folder)
    assert draft.tokenizer_size > _view(smol_dir).tokenizer_size or draft.tokenizer_size >= size
    check_draft_compatible(_view(smol_dir), draft)
    # ... but the other way round the draft cannot spell every target token
    with pytest.raises(DraftIncompatibleError, match="vocabulary size differs"):
        check_draft_compatible(draft, _view(smol_dir))
