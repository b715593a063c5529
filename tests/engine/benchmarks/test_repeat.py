"""The repeat family of `specchat bench --tasks` (engine.benchmarks.repeat): its two splits of scripted
conversations, and a real run on the embedded model through a ChatSession, whose history corpus comes from the
session's own store: history rounds drafted and accepted, every drafting mode's output == ours-plain's (seeded timed
runs and a greedy run), the table's columns, and a broken output named as a mismatch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from engine.benchmarks.repeat import KINDS, TARGET_KINDS, load_repeat_set, repeat_file
from engine.benchmarks.task_sets import parse_families
from engine.prompt_file import PromptFileError


def user_texts(split: str) -> set[str]:
    return {
        step.get("send") or step.get("text") or "" for c in load_repeat_set(split) for step in c.steps
    } - {""}


@pytest.mark.parametrize(("split", "least"), [("tune", 4), ("heldout", 6)])
def test_each_split_has_several_conversations_of_every_kind(split: str, least: int) -> None:
    conversations = load_repeat_set(split)
    assert len(conversations) >= least
    kinds = {c.kind for c in conversations}
    assert {"regenerate", "again", "edit"} <= kinds and kinds & {"extend", "fix"}
    assert set(TARGET_KINDS) <= set(KINDS)
    for conversation in conversations:
        steps = conversation.steps
        assert "send" in steps[0] and "new_chat" not in steps[-1]
        if conversation.kind == "regenerate":
            assert steps[-1].get("regenerate")
        if conversation.kind == "again":  # the same task in a new chat
            assert any(s.get("new_chat") for s in steps)
        if conversation.kind == "edit":
            assert steps[-1]["edit"] == 0 and steps[-1]["text"] != steps[0]["send"]
    assert len({c.name for c in conversations}) == len(conversations)


def test_the_held_out_conversations_share_no_text_with_the_tuning_ones() -> None:
    assert repeat_file("heldout") != repeat_file("tune")
    assert not user_texts("heldout") & user_texts("tune")


def test_a_bad_conversation_is_one_line_and_repeat_is_a_family_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "regenerate", "steps": [{"send": "x"}, {"regenerate": true, "send": "y"}]}\n')
    with pytest.raises(PromptFileError, match="bad.jsonl:1: each step is one of"):
        load_repeat_set(bad)
    bad.write_text('{"kind": "poem", "steps": [{"send": "x"}]}\n')
    with pytest.raises(PromptFileError, match="a 'kind' of"):
        load_repeat_set(bad)
    assert parse_families("repeat") == (("repeat",), False)
    assert parse_families("repeat,chat,context") == (("repeat", "chat"), True)


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf
    from tests.support.drafting import FreeVerify

    backend = LlamaCppBackend(ensure_embedded_gguf(), draft="ngram", max_context=2048)
    backend.load()
    backend.target.costs = FreeVerify()  # drafting pays whatever the machine's load: the rounds are seen
    yield backend
    backend.close()


def run_one(backend, name: str, **kwargs) -> tuple[dict, str]:
    from engine.benchmarks.repeat import run_repeat_family

    (conversation,) = [c for c in load_repeat_set("tune") if c.name == name]
    out = io.StringIO()
    result = run_repeat_family(
        backend,
        "tune",
        max_new=40,
        repeats=1,
        seeded_tokens=12,
        context=2048,
        conversations=[conversation],
        out=out,
        **kwargs,
    )
    return result, out.getvalue()


@pytest.mark.slow
def test_a_regenerate_drafts_from_its_earlier_variant_and_equals_plain(backend) -> None:
    result, text = run_one(backend, "flatten")
    (res,) = result["conversations"]
    assert result["variants"] == ("ours-plain", "ours-ngram", "ours-history")
    # The corpus is what the session stored: the regenerated reply's earlier variant (this chat, no past chats).
    assert 20 <= res.history_tokens <= 60
    assert res.history_drafted > 0 and res.history_accepted > 0
    assert res.seeded_same == {"ours-ngram": True, "ours-history": True}
    assert res.greedy_same == {"ours-ngram": True, "ours-history": True}
    assert result["mismatches"] == []
    head = next(line for line in text.splitlines() if line.startswith("repeat | "))
    assert head.split(" | ")[2:7] == [
        "ours-plain",
        "ours-ngram",
        "ours-history",
        "hist/plain",
        "hist/best-no-hist",
    ]
    rows = [line.split(" | ")[0] for line in text.splitlines() if " | " in line][1:]
    assert rows == ["regenerate", "regenerate+again", "overall"]
    assert "regenerate flatten (" in text and "history 1/1" in text


@pytest.mark.slow
def test_an_output_that_leaves_plain_is_named(backend, monkeypatch) -> None:
    from engine.benchmarks import repeat

    real = repeat.timed_reply

    def broken(backend, prompt_ids, k, max_new, history=None, **kwargs):
        ids, seconds, accounting, done = real(backend, prompt_ids, k, max_new, history=history, **kwargs)
        if history is not None and kwargs["sampler"].temperature_at(40) > 0:  # the timed (seeded) history run
            ids = [*ids[:-1], ids[-1] + 1]
        return ids, seconds, accounting, done

    monkeypatch.setattr(repeat, "timed_reply", broken)
    result, text = run_one(backend, "debounce")
    assert result["mismatches"] == [
        "repeat debounce ours-history seeded (timed runs): differs from ours-plain"
    ]
    assert "MISMATCH repeat debounce ours-history seeded" in text
    (res,) = result["conversations"]
    assert res.seeded_same == {"ours-ngram": True, "ours-history": False} and all(res.greedy_same.values())
