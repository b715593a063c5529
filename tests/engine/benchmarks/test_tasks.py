"""The task bench (engine.benchmarks.tasks): its two splits, its variants, its exactness check, short real runs.

The splits are data the bench's claims rest on: every family in each, long prompts where the families need them,
chats of 5+ turns, the code family's completions and rewrites of realistic size, and no text shared between the
split one tunes on and the held-out one.
"""

from __future__ import annotations

import importlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.benchmarks.task_sets import FAMILIES, parse_families
from engine.benchmarks.tasks import Run, counted_run, greedy_mismatches, load_task_set, variant_plan

CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


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


@pytest.mark.parametrize(("split", "each"), [("tune", 4), ("heldout", 8)])
def test_the_code_family_has_completions_and_rewrites_of_real_functions(split: str, each: int) -> None:
    items = [
        i for i in load_task_set(split) if i["category"].startswith("code_") and i["category"] != "code_edit"
    ]
    halves = {"code_complete": 0, "code_rewrite": 0}
    for item in items:
        halves[item["category"]] += 1
        (message,) = item["messages"]
        (code,) = CODE_BLOCK.findall(message["content"])
        assert 10 <= len(code.splitlines()) <= 60, message["content"][:80]
        if item["category"] == "code_rewrite":
            compile(code, "<rewrite>", "exec")  # the function to rewrite is whole, valid Python
            assert "return the whole" in message["content"].lower()
        else:
            assert '"""' in code and code.rstrip().splitlines()[-1].startswith(
                " "
            )  # a docstring, body to write
    assert halves == {"code_complete": each, "code_rewrite": each}


def test_no_code_of_the_held_out_split_is_in_the_tuning_split() -> None:
    def code(split: str) -> tuple[set[str], set[str], set[str]]:
        items = [i["messages"][0]["content"] for i in load_task_set(split) if i["category"] in FAMILIES[-2:]]
        code = [CODE_BLOCK.findall(text)[0] for text in items]
        lines = {line.strip() for text in code for line in text.splitlines()}
        names = {m for text in code for m in re.findall(r"^\s*(?:def|class) (\w+)", text, re.M)}
        return (
            set(items),
            {line for line in lines if len(line) > 30 and not line.startswith(("from ", "import "))},
            {name for name in names if not name.startswith("__")},
        )

    tune, held_out = code("tune"), code("heldout")
    for mine, theirs in zip(tune, held_out, strict=True):
        assert not mine & theirs


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


def test_families_picks_the_code_halves_and_the_context_rows() -> None:
    assert parse_families(None) == (None, True)
    assert parse_families("code") == (("code_complete", "code_rewrite"), False)
    assert parse_families("chat, code_rewrite,context") == (("chat", "code_rewrite"), True)
    with pytest.raises(ValueError, match="choose from"):
        parse_families("code,poetry")


def test_a_draft_model_adds_ours_and_llama_servers_draft_simple(tmp_path: Path) -> None:
    ours, servers = variant_plan(None)
    assert ours == ("ours-plain", "ours-ngram")
    assert list(servers) == ["server-plain", "server-ngram-simple", "server-ngram-mod"]
    draft = tmp_path / "d.gguf"
    ours, servers = variant_plan(draft)
    assert ours == ("ours-plain", "ours-ngram", "ours-draft")
    assert servers["server-draft-simple"][:4] == ("-md", str(draft), "--spec-type", "draft-simple")


class _StandInBackend:
    """Just what run_task_bench asks of our backend, with nothing loaded."""

    threads = 2
    info = type("Info", (), {"notes": ["stand-in"]})()
    thread_control = type("Control", (), {"thread_choice": None})()

    def __init__(self, *args, **kwargs) -> None:
        pass

    def load(self) -> None:
        pass

    def encode_chat(self, messages) -> list[int]:
        return [1, 2, 3]

    def close(self) -> None:
        pass


def test_the_repeat_family_runs_after_the_other_families(monkeypatch) -> None:
    # A prompt's counted run and its repeat were once named like the flag that asks for the repeat family, so a run
    # with other families skipped it.
    from engine.backends import llamacpp
    from engine.benchmarks import repeat, tasks

    asked = []
    monkeypatch.setattr(llamacpp, "LlamaCppBackend", _StandInBackend)
    monkeypatch.setattr(tasks, "_ours", lambda *args: Run([7, 8], 2, 1.0))
    monkeypatch.setattr(repeat, "run_repeat_family", lambda *a, **k: asked.append(a[1]) or {"mismatches": []})
    out = io.StringIO()
    result = tasks.run_task_bench(
        Path("t.gguf"),
        "tune",
        servers=False,
        context_rows=(),
        families=("code_complete", "repeat"),
        seeded_tokens=0,
        out=out,
    )
    assert asked == ["tune"] and result["repeat"] == {"mismatches": []}
    assert result["families"]["code_complete"].prompts == 4 and result["mismatches"] == []


def test_the_repeat_family_alone_says_so_instead_of_counting_no_prompts(monkeypatch) -> None:
    from engine.backends import llamacpp
    from engine.benchmarks import repeat, tasks

    monkeypatch.setattr(llamacpp, "LlamaCppBackend", _StandInBackend)
    monkeypatch.setattr(repeat, "run_repeat_family", lambda *a, **k: {"mismatches": []})
    out = io.StringIO()
    tasks.run_task_bench(
        Path("t.gguf"), "tune", servers=False, context_rows=(), families=("repeat",), seeded_tokens=0, out=out
    )
    header = out.getvalue().splitlines()[0]
    assert (
        header.startswith("specchat bench --tasks tune: the repeat family only, max ")
        and "0 prompts" not in header
    )


@pytest.mark.parametrize("amx", [False, True])
def test_every_server_variant_runs_as_its_users_run_it(tmp_path: Path, monkeypatch, amx: bool) -> None:
    # Default weight repacking (off only where the CPU has AMX: it crashes there), -t as ours, each variant's
    # speculation; the draft model inherits -t and the repacking from the target's arguments inside llama.cpp.
    from engine.backends import remote
    from engine.benchmarks import llama_server, tasks

    native = importlib.import_module(llama_server.choose_repack.__module__)
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("SPECCHAT_LLAMA_SERVER_DIR", str(tmp_path))
    monkeypatch.delenv(native.REPACK_ENV, raising=False)
    flags = "fpu sse avx2 avx512f" + (" amx_tile amx_int8 amx_bf16" if amx else "")
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(native, "CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(llama_server.LlamaServer, "start", lambda self: self)

    class Idle:
        def __init__(self, url: str) -> None:
            self.url = url

        def load(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(remote, "RemoteBackend", Idle)
    started: dict = {}
    line = tasks._start_servers(Path("t.gguf"), variant_plan(tmp_path / "d.gguf")[1], 3, 2048, started, {})
    assert list(started) == ["server-plain", "server-ngram-simple", "server-ngram-mod", "server-draft-simple"]
    for name, server in started.items():
        args = " ".join(server.args)
        assert " -t 3 " in args and " -c 2048 " in args and "-m t.gguf" in args
        assert ("--no-repack" in server.args) is amx, name
    assert "ngram-simple" in " ".join(started["server-ngram-simple"].args)
    assert "ngram-mod" in " ".join(started["server-ngram-mod"].args)
    assert "-md" not in " ".join(started["server-plain"].args)
    assert "--spec-type" not in " ".join(started["server-plain"].args)
    assert ("repacking off" in line) is amx and "-t 3" in line


def test_an_output_that_leaves_ours_plain_is_reported_by_mode_and_token() -> None:
    plain = Run([5, 6, 7, 8], 4, 1.0)
    same = Run([5, 6, 7, 8], 4, 0.5)
    runs = {
        "ours-plain": [plain, same],
        "ours-ngram": [same, Run([5, 6, 9, 8], 4, 0.5)],
        "ours-draft": [same],
    }
    found = greedy_mismatches("code_rewrite #2", runs)
    assert list(found) == ["ours-ngram"]
    assert found["ours-ngram"].startswith("code_rewrite #2 ours-ngram greedy (repeat 2): differs")
    assert "at token 2 " in found["ours-ngram"]
    runs["ours-draft"] = [Run([5, 6, 7], 3, 0.5)]  # stopped early: a difference too
    runs["ours-plain"] = [plain, Run([5], 1, 0.5)]  # plain must repeat itself
    found = greedy_mismatches("chat #1", runs)
    assert set(found) == {"ours-plain", "ours-ngram", "ours-draft"}
    assert "at token 3 " in found["ours-draft"] and "at token 1 " in found["ours-plain"]
    assert greedy_mismatches("x", {"ours-plain": [plain, same], "ours-ngram": [same]}) == {}


def test_families_is_checked_before_anything_loads(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("SPECCHAT_CONFIG_FILE", None)
    for args, said in (
        (["--tasks", "heldout", "--families", "code,poetry"], "--families: choose from"),
        (["--families", "code"], "--families goes with --tasks"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "tui.cli", "bench", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


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
    assert families["passages"].identical == {"ours-ngram": 2} and families["passages"].prompts == 2
    assert result["mismatches"] == []
    assert min(families["passages"].prompt_tokens) > 1000
    assert [row["context"] for row in result["context_rows"]] == [100, 600]
    assert all(row["ours_plain"] for row in result["context_rows"])
    assert all(abs(row["prompt_tokens"] - row["context"]) <= 40 for row in result["context_rows"])


@pytest.mark.slow
def test_the_code_family_with_a_draft_model_reports_each_mode_and_every_mismatch(monkeypatch) -> None:
    # The embedded F16 model drafted for by its own Q4_1 GGUF: ours plain, n-gram and draft model on the code
    # family's halves. One greedy draft-model reply and one seeded n-gram reply are broken on purpose: the bench
    # must name each and still count the rest as equal to plain.
    pytest.importorskip("llama_cpp")
    from engine.benchmarks import tasks
    from engine.models import ensure_embedded_gguf

    real = tasks.timed_reply
    calls = {"draft": 0, "seeded": 0}

    def broken(backend, prompt_ids, k, max_new, sampler=None, **kwargs):
        ids, seconds, accounting, done = real(backend, prompt_ids, k, max_new, sampler=sampler, **kwargs)
        if k and sampler is None and backend.draft_mode == "model":
            calls["draft"] += 1
            if calls["draft"] == 2:
                ids = [*ids[:-1], ids[-1] + 1]
        if k and sampler is not None and backend.draft_mode == "ngram":
            calls["seeded"] += 1
            if calls["seeded"] == 3:
                ids = ids[:-1]
        return ids, seconds, accounting, done

    monkeypatch.setattr(tasks, "timed_reply", broken)
    out = io.StringIO()
    result = tasks.run_task_bench(
        ensure_embedded_gguf(),
        "tune",
        draft=ensure_embedded_gguf(precision="q4_1"),
        max_new=10,
        servers=False,
        context_rows=(),
        families=("code_complete",),
        seeded_tokens=8,
        out=out,
    )
    text = out.getvalue()
    assert result["variants"] == ("ours-plain", "ours-ngram", "ours-draft")
    head = next(line for line in text.splitlines() if line.startswith("family | "))
    assert "| ours-draft |" in head and "| draft/plain (pred) |" in head
    assert "  code_complete #4 (" in text  # a line per prompt as it finishes
    assert [line.split(" | ")[0] for line in text.splitlines() if " | " in line][1:] == [
        "code: complete",
        "overall",
    ]
    half = result["families"]["code_complete"]
    assert half.prompts == 4
    assert half.identical == {"ours-ngram": 4, "ours-draft": 3}
    assert half.seeded_identical == {"ours-ngram": 3, "ours-draft": 4}
    assert all(half.figures[v].tokens_per_s for v in result["variants"])
    assert [line.split(":")[0] for line in result["mismatches"]] == [
        "code_complete #2 ours-draft greedy (repeat 1)",
        "code_complete #3 ours-ngram seeded",
    ]
    assert "MISMATCH code_complete #2 ours-draft greedy" in text and "ngram 4/4, draft 3/4" in text
    assert "seeded sampling" in text and "ours-ngram 3/4, ours-draft 4/4" in text


def test_a_figure_nothing_measured_reads_as_a_dash_in_every_cell() -> None:
    """The task table writes "–" where nothing was measured, as the chat, the stats and the other benches do."""
    from engine.benchmarks.task_table import FamilyResult, Figures, print_families

    variants = ("ours-plain", "ours-ngram", "server-plain", "server-ngram-mod")
    measured = Figures(
        tokens=90, decode_s=1.0, drafted=40, accepted=20, rounds=30, emitted=60, cost_steps=45.0
    )
    figures = {"ours-plain": Figures(tokens=60, decode_s=1.0), "ours-ngram": measured}
    figures |= {"server-plain": Figures(), "server-ngram-mod": Figures()}  # the server never ran
    result = FamilyResult("code", figures=figures, identical={"ours-ngram": 1}, prompts=1)
    out = io.StringIO()
    print_families(out, {"code": result}, variants)
    row = out.getvalue().splitlines()[1].split(" | ")
    assert row[0] == "code" and row[2] == "–", row  # no prompt tokens counted
    assert row[3:7] == ["60.0", "90.0", "–", "–"], row
    assert row[8] == "–" and row[9] == "–", row  # plain/srv-plain, best/srv-spec: no server figure
    assert "ngram-mod –" in row[11] and "-" not in row
