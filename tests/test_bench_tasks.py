"""The long-task bench (engine.benchmarks.tasks): its two splits, and one short run on the embedded GGUF.

The splits are data the bench's claims rest on: every family in each, long prompts where the families need them,
chats of 5+ turns, and no text shared between the split one tunes on and the held-out one.
"""

from __future__ import annotations

import io

import pytest

from engine.benchmarks.tasks import FAMILIES, Run, counted_run, load_task_set


@pytest.mark.parametrize("split", ["tune", "heldout"])
def test_each_split_holds_every_family_with_long_inputs(split: str) -> None:
    items = load_task_set(split)
    assert {i["category"] for i in items} == set(FAMILIES)
    for item in items:
        text = "\n".join(m["content"] for m in item["messages"])
        if item["category"] in ("summarize", "passages", "code_edit"):
            assert len(text) > 1500, (item["category"], len(text))
        if item["category"] == "chat":
            assert len(item["messages"]) >= 7 and item["messages"][-1]["role"] == "user"
            assert [m["role"] for m in item["messages"]][:2] == ["user", "assistant"]


def test_the_held_out_split_shares_no_text_with_the_tuning_split() -> None:
    def sentences(split: str) -> set[str]:
        found = set()
        for item in load_task_set(split):
            for message in item["messages"]:
                found |= {s.strip() for s in message["content"].split(". ") if len(s.strip()) > 40}
        return found

    assert not sentences("tune") & sentences("heldout")


def test_ngram_mod_counts_its_first_run_and_the_rest_their_best_repeat() -> None:
    # llama-server's ngram-mod pool outlives a request: the repeat of a prompt drafts the first reply back (seen:
    # 141 tok/s at 89% acceptance on summaries, 3.6x its plain), which is not what a user's new message gets.
    slow, fast = Run([], 100, 2.0), Run([], 100, 1.0)
    assert counted_run("server-ngram-mod", [slow, fast]) == (slow, fast)
    assert counted_run("server-ngram-mod", [slow]) == (slow, None)
    for variant in ("ours-plain", "ours-ngram", "server-plain", "server-ngram-simple"):
        assert counted_run(variant, [slow, fast]) == (fast, None)


@pytest.mark.slow
def test_a_short_run_prints_the_family_table_and_the_context_rows() -> None:
    pytest.importorskip("llama_cpp")
    from engine.benchmarks.tasks import run_task_bench
    from engine.models import ensure_embedded_gguf

    out = io.StringIO()
    result = run_task_bench(
        ensure_embedded_gguf(),
        "tune",
        max_new=12,
        servers=False,
        context_rows=(100, 600),
        families=("passages", "chat"),
        out=out,
    )
    text = out.getvalue()
    assert "specchat bench --tasks tune" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if " | " in line][1:4] == [
        "passages",
        "chat",
        "overall",
    ]
    families = result["families"]
    assert families["passages"].identical == families["passages"].prompts == 2
    assert min(families["passages"].prompt_tokens) > 1000
    assert [row["context"] for row in result["context_rows"]] == [100, 600]
    assert all(row["ours_plain"] for row in result["context_rows"])
    assert all(abs(row["prompt_tokens"] - row["context"]) <= 40 for row in result["context_rows"])
