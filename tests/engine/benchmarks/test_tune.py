"""`specchat tune`: the sweep's rows, the preset file it writes (with a backup), its progress line and its input errors."""

from __future__ import annotations

import functools
import io
import json
import os
import tomllib
from pathlib import Path

import pytest

from engine.benchmarks.tune import (
    ROW_FIELDS,
    ProgressBar,
    TaskDecision,
    TuneError,
    TunePlan,
    TunePrompt,
    pick_prompts,
    prompts_from_history,
    prompts_from_jsonl,
)
from engine.benchmarks.tune.apply import apply_results, set_toml_keys
from tests.support.cli import run_cli as run_specchat

run_cli = functools.partial(run_specchat, timeout=600)


def user_presets_dir() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "specchat" / "presets"


# --- the preset file ---------------------------------------------------------------------------------------


def test_set_toml_keys_replaces_in_place_adds_missing_and_keeps_everything_else():
    old = "# my code preset\nk = 2  # short\ntemperature = 0.3\n\n[extra]\nk = 99\n"
    new = set_toml_keys(old, {"k": 5, "ramp_tokens": 0}, "2026-11-29")
    lines = new.splitlines()
    assert lines[0] == "# specchat tune 2026-11-29"
    assert "# my code preset" in lines and "temperature = 0.3" in lines
    assert "k = 5" in lines and "k = 2  # short" not in lines
    assert "ramp_tokens = 0" in lines
    assert lines.index("ramp_tokens = 0") < lines.index("[extra]")  # top level, not inside the table
    assert "k = 99" in lines  # a key inside a table is not the preset's k
    again = set_toml_keys(new, {"k": 6}, "later")
    assert again.count("# specchat tune") == 1 and "k = 6" in again.splitlines()
    assert tomllib.loads(again)["k"] == 6


def test_apply_writes_the_winner_keeps_a_backup_and_the_preset_loads(tmp_path):
    from engine.presets import load_presets

    folder = tmp_path / "presets"
    folder.mkdir()
    before = "# mine\nk = 2\ntemperature = 0.3\n"
    (folder / "code.toml").write_text(before)
    decisions = {
        "code": TaskDecision("code", preset_k=2, best_k=7, best_speedup=1.4, ramp=(0, 0.0)),
        "qa": TaskDecision("qa", preset_k=5, best_k=3, best_speedup=1.1),
    }
    applied = {a.path.name: a for a in apply_results(decisions, folder, "test run")}
    assert applied["code.toml"].backup == folder / "code.toml.bak"
    assert (folder / "code.toml.bak").read_text() == before
    assert applied["qa.toml"].backup is None  # there was no file to keep
    assert "-k = 2" in applied["code.toml"].diff and "+k = 7" in applied["code.toml"].diff
    presets = load_presets(folder)
    assert (presets["code"].k, presets["code"].temperature, presets["code"].ramp_tokens) == (7, 0.3, 0)
    assert presets["qa"].k == 3 and presets["qa"].ramp_tokens == 16  # qa keeps the built-in's ramp
    assert presets["code"].source == str(folder / "code.toml")


def test_apply_puts_the_old_file_back_when_the_result_would_not_load(tmp_path):
    from engine.presets import PresetError

    folder = tmp_path / "presets"
    folder.mkdir()
    before = "k = 2\ntemperature = 0.3\n"
    (folder / "code.toml").write_text(before)
    bad = TaskDecision("code", preset_k=2, best_k=40, best_speedup=1.0)  # k above 16: not a valid preset
    with pytest.raises(PresetError, match="k: must be between 0 and 16"):
        apply_results({"code": bad}, folder, "test")
    assert (folder / "code.toml").read_text() == before


# --- prompts and progress ----------------------------------------------------------------------------------


def test_prompt_file_routes_lines_without_a_category_and_names_bad_lines(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(
        '{"prompt": "Write a poem about the sea", "category": "creative"}\n\n'
        '{"prompt": "Fix this Python function: def f(x): return x +"}\n'
    )
    prompts = prompts_from_jsonl(good)
    assert [p.task for p in prompts] == ["creative", "code"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "category": "poetry"}\n')
    with pytest.raises(TuneError, match=r"bad.jsonl:1: category must be code, qa or creative"):
        prompts_from_jsonl(bad)
    bad.write_text('{"text": "hi"}\n')
    with pytest.raises(TuneError, match="bad.jsonl:1: each line needs"):
        prompts_from_jsonl(bad)


def test_history_prompts_are_the_users_own_messages(tmp_path):
    from engine.storage.store import Store

    with pytest.raises(TuneError, match="no conversation history yet"):
        prompts_from_history(tmp_path)
    store = Store.open(tmp_path)
    chat = store.create_chat("t")
    first = store.add_message(chat, "user", "Write a haiku about rain")
    reply = store.add_message(chat, "assistant", "Rain on the roof", parent_id=first)
    store.add_message(
        chat, "user", "def add(a, b): return a + b  # explain this Python code", parent_id=reply
    )
    store.close()
    prompts = prompts_from_history(tmp_path)
    assert [p.text for p in prompts] == [
        "def add(a, b): return a + b  # explain this Python code",
        "Write a haiku about rain",
    ]  # newest first, replies left out
    assert [p.task for p in prompts] == ["code", "creative"]


def test_pick_prompts_takes_the_first_ones_per_task():
    prompts = [TunePrompt("qa", "a"), TunePrompt("code", "b"), TunePrompt("qa", "c"), TunePrompt("qa", "d")]
    assert pick_prompts(prompts, TunePlan(prompts_per_task=2)) == {"code": ["b"], "qa": ["a", "c"]}
    with pytest.raises(TuneError, match="no prompts for the tasks"):
        pick_prompts(prompts, TunePlan(tasks=("creative",)))


def test_progress_bar_eta_from_the_runs_done():
    now = [100.0]
    out = io.StringIO()
    bar = ProgressBar(10, out, clock=lambda: now[0])
    assert bar.eta_s() is None
    now[0] = 104.0
    bar.advance("code K=1", steps=2)  # 2 runs in 4 s: 8 left take 16 s
    assert bar.eta_s() == pytest.approx(16.0)
    assert "2/10 runs" in out.getvalue() and "ETA 0:16" in out.getvalue() and "code K=1" in out.getvalue()


# --- the command ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tasks", "code,poetry"], "--tasks: choose from code, qa, creative"),
        (["--k-values", "1,x"], "--k-values must be a comma-separated list"),
        (["--k-values", "3,17"], "--k-values: each value must be between 0 and 16"),
        (["--prompts", "/nonexistent/p.jsonl"], "cannot read prompt file"),
        (["--max-new-tokens", "1"], "--max-new-tokens must be at least 4"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    proc = run_cli(["tune", *args])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_quick_json_on_the_embedded_model_prints_every_field():
    out = Path(os.environ["XDG_DATA_HOME"]) / "tune-out"
    proc = run_cli(
        ["tune", "--quick", "--json", "--tasks", "code", "--k-values", "0,2,4", "--temperatures", "0.1,1.2"]
        + ["--max-new-tokens", "12", "--no-cache-sweep", "--output", str(out)]
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(ROW_FIELDS))}
    k_rows = [r for r in rows if r["sweep"] == "k"]
    assert [r["k"] for r in k_rows] == [0, 2, 4] and {r["k_mode"] for r in k_rows} == {"fixed"}
    # adaptive K up to the code preset's ceiling (6) and up to the sweep's largest K (4), beside the fixed ones
    assert sorted(r["k"] for r in rows if r["sweep"] == "adaptive" and r["k_mode"] == "adaptive") == [4, 6]
    assert k_rows[0]["measured_speedup"] == pytest.approx(1.0) and k_rows[0]["drafting"] == "none"
    for r in k_rows[1:]:
        assert r["measured_speedup"] == pytest.approx(r["tokens_per_s"] / k_rows[0]["tokens_per_s"])
    assert sorted(r["temperature"] for r in rows if r["sweep"] == "temperature") == [0.1, 1.2]
    assert sorted(r["ramp"] for r in rows if r["sweep"] == "ramp") == [False, True]
    assert all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert "ETA" in proc.stderr  # the progress line
    written = sorted(p.suffix for p in out.iterdir())
    assert written == [".csv", ".json"]


@pytest.mark.slow
def test_apply_writes_a_preset_that_presets_lists_and_keeps_a_backup(copy_model_dir):
    folder = user_presets_dir()
    folder.mkdir(parents=True)
    before = "# my own tweak\nk = 2\ntemperature = 0.3\n"
    (folder / "code.toml").write_text(before)
    out = Path(os.environ["XDG_DATA_HOME"]) / "tune-out"
    proc = run_cli(
        ["tune", "--quick", "--apply", "--model", str(copy_model_dir), "--backend", "transformers"]
        + ["--draft", str(copy_model_dir)]  # the model drafts for itself; the drafting sweep tries n-gram
        + ["--tasks", "code", "--k-values", "0,3,6", "--temperatures", "0.5", "--max-new-tokens", "16"]
        + ["--no-cache-sweep", "--output", str(out)]
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(next(out.glob("*.json")).read_text())
    drafters = {(r["sweep"], r["drafting"]) for r in result["rows"] if r["k"] > 0}
    assert ("k", "model") in drafters and ("drafting", "ngram") in drafters
    assert (
        next(r for r in result["rows"] if r["sweep"] == "k" and r["k"] == 6)["acceptance"] > 0.5
    )  # it drafts for itself
    best = result["best"]["code"]["apply_k"]  # the winner, or K 2 where it won only by noise
    written = tomllib.loads((folder / "code.toml").read_text())
    assert written["k"] == best and written["temperature"] == 0.3
    assert (folder / "code.toml.bak").read_text() == before
    assert (f"+k = {best}" in proc.stdout) == (best != 2)  # the diff
    assert "+# specchat tune" in proc.stdout
    listing = run_cli(["presets"])
    line = next(line for line in listing.stdout.splitlines() if line.startswith("code "))
    mode = written.get("k_mode", "adaptive")  # the built-in code preset's, unless tune made it fixed
    shown = (f"K≤{best}" if mode == "adaptive" else f"K={best}") if best else "draft off"
    assert shown in line and str(folder / "code.toml") in line


def test_k_changes_only_when_the_winner_beats_the_presets_k_by_more_than_the_noise():
    from engine.benchmarks.tune import TuneRow
    from engine.benchmarks.tune.decide import decide_k

    def row(k: int, tps: float, sweep: str = "k", k_mode: str = "fixed") -> TuneRow:
        return TuneRow(
            task="code",
            sweep=sweep,
            k=k,
            k_mode=k_mode,
            temperature=0.2,
            ramp=True,
            drafting="ngram",
            cache_mode="fp16",
            acceptance=0.5,
            tokens_per_round=2.0,
            tokens_per_s=tps,
            predicted_speedup=1.2,
            measured_speedup=tps / 50,
            prompts=1,
            tokens=48,
            drafted=10,
            accepted=5,
            rounds=20,
        )

    rows = [row(0, 50.0), row(4, 60.0), row(6, 61.5)]
    close = decide_k("code", 4, rows[2], rows)  # 2.5% faster: noise
    assert (close.best_k, close.apply_k, close.values()["k"]) == (6, 4, 4)
    assert "by only 2%" in close.k_note
    rows[2] = row(6, 62.0)  # 3.3% faster: a real gain
    real = decide_k("code", 4, rows[2], rows)
    assert (real.apply_k, real.values()["k"]) == (6, 6)
    assert decide_k("code", 5, rows[2], rows).apply_k == 6  # the preset's K was not swept

    # An adaptive preset: K is the ceiling. Its own ceiling stays unless the other wins by more than noise, and a
    # fixed K that beats adaptive by more than noise makes the preset fixed.
    adaptive = [row(4, 60.0, "adaptive", "adaptive"), row(8, 61.0, "adaptive", "adaptive")]
    stays = decide_k("code", 4, row(6, 61.5), rows, adaptive, "adaptive")
    assert stays.values() == {"k": 4} and "adaptive K up to 4 stays" in stays.k_note
    adaptive[1] = row(8, 66.0, "adaptive", "adaptive")
    higher = decide_k("code", 4, row(6, 61.5), rows, adaptive, "adaptive")
    assert higher.values() == {"k": 8} and "ceiling 8" in higher.k_note
    fixed = decide_k("code", 4, row(6, 70.0), rows, adaptive, "adaptive")
    assert fixed.values() == {"k": 6, "k_mode": "fixed"} and "k_mode fixed" in fixed.k_note
