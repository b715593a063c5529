"""One name map for the drafters (engine/decoding/drafters/registry.py): a drafter added to it is offered and taken
everywhere a draft setting is (the CLI's --draft help and check, the config, the model checks, the chat's labels,
the verdict and the stats), and no module keeps a list of drafter names of its own."""

from __future__ import annotations

import ast
import re

import pytest

from engine.decoding.acceptance import AcceptanceAccounting
from engine.decoding.drafters import DRAFTERS, DrafterSpec, build_drafters, draft_help, draft_mode_of
from engine.decoding.drafters.ngram import build as ngram_build
from engine.decoding.verdict import draft_verdict
from engine.events import Chunk
from tests.support import paths

ROOT = paths.ROOT
RECALL = DrafterSpec(
    name="recall",
    description="free drafts copied from past chats",
    label="past-chats lookup",
    build=ngram_build,
)


@pytest.fixture
def recall(monkeypatch: pytest.MonkeyPatch) -> DrafterSpec:
    """A new drafter, registered the way a new file would register it: one entry in the map."""
    monkeypatch.setitem(DRAFTERS, RECALL.name, RECALL)
    return RECALL


def test_the_cli_offers_and_takes_a_drafter_added_to_the_map(recall: DrafterSpec) -> None:
    from tui.cli.common import cli_settings
    from tui.cli.entry import build_parser

    parser = build_parser()
    draft_help = next(a.help for a in parser._actions if "--draft" in a.option_strings)
    assert "recall (free drafts copied from past chats)" in draft_help
    assert "ngram" in draft_help and "mtp" in draft_help
    settings = cli_settings(parser.parse_args(["--draft", "Recall"]))  # checked like every draft setting
    assert settings.draft == "recall"


def test_the_config_and_the_model_check_take_a_drafter_added_to_the_map(recall: DrafterSpec) -> None:
    from engine.config import ConfigError, load_settings
    from engine.models import ModelError, check_draft_choice

    assert load_settings(draft=" RECALL ").draft == "recall"  # a keyword, not a folder path
    assert check_draft_choice("Recall") == "recall"
    with pytest.raises(ConfigError, match="'ngram', 'none', 'mtp', 'recall' or a draft model folder"):
        load_settings(draft=" ")
    with pytest.raises(ModelError, match="give 'ngram', 'none', 'recall' or a draft model folder"):
        check_draft_choice("")


def test_a_drafter_added_to_the_map_is_a_draft_mode_with_its_own_label_stats_and_verdict(
    recall: DrafterSpec,
) -> None:
    from engine.decoding.cost_model import VerifyCostModel
    from tui.formatting import drafter_name, drafts_here

    assert draft_mode_of("recall") == "recall" and draft_mode_of("/models/draft") == "model"
    assert drafts_here("recall") and not drafts_here("none") and not drafts_here("server")

    class Info:
        draft_mode, draft_model = "recall", None

    assert drafter_name(Info) == "past-chats lookup drafting"
    # Its drafts take no model steps: its rounds are counted as lookups, and the verdict prices them free (c = 0).
    accounting = AcceptanceAccounting(t_start=0.0)
    accounting.add(Chunk("ab", (1, 2), 3, 1, (True, False), 0.1, drafter="recall"))
    assert accounting.lookup_rounds == 1
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.05, 5: 1.2}, draft_ratio=0.5)
    verdict = draft_verdict(costs, "recall", 4)
    assert (
        verdict.status == "pass" and verdict.c == 0.0 and "(past-chats lookup drafts are free)" in verdict.why
    )


def test_the_backends_round_loop_builds_a_drafter_added_to_the_map(recall: DrafterSpec) -> None:
    from engine.decoding.adaptive_k import AdaptiveK
    from engine.decoding.drafters import DraftContext

    class Target:
        costs = None

    context = DraftContext(target=Target(), draft=None, tuner=AdaptiveK(), adaptive=True, vocab_size=10)
    assert [d.name for d in build_drafters("recall", context)] == ["ngram"]  # its factory's drafter
    assert build_drafters("none", context) == [] and build_drafters("server", context) == []


def drafter_name_lists() -> list[str]:
    """Every literal list, tuple, set or dict key set in engine/ and tui/ naming two or more drafters, and every
    text that lists them ("ngram, none, ..."), outside the map itself."""
    names = set(DRAFTERS)
    found: list[str] = []
    for package in ("engine", "tui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "engine/decoding/drafters/registry.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {
                id(node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            }
            # Type hints may spell the modes out (events.DraftMode): they never decide anything at run time. An
            # engine whose loop is its own names the drafters that loop implements (backends/registry.py's rows).
            literals = {
                id(node.slice)
                for node in ast.walk(tree)
                if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal"
            } | {
                id(keyword.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Engine"
                for keyword in node.keywords
                if keyword.arg == "drafters"
            }
            where = path.relative_to(ROOT)
            for node in ast.walk(tree):
                if id(node) in literals:
                    continue
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    elements = node.elts
                elif isinstance(node, ast.Dict):
                    elements = [key for key in node.keys if key is not None]
                else:
                    elements = []
                listed = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in names]
                if len(listed) >= 2:
                    found.append(f"{where}:{node.lineno} {listed}")
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                    and re.search(r"\bngram\b[^.\n]{0,20}\bnone\b", node.value)
                ):
                    found.append(f"{where}:{node.lineno} {node.value[:50]!r}")
    return found


def test_the_scan_finds_a_list_of_drafter_names() -> None:
    tree = ast.parse('if draft in ("ngram", "none"):\n    pass\n')
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Tuple))
    assert [e.value for e in node.elts if e.value in DRAFTERS] == ["ngram", "none"]


def test_no_module_keeps_its_own_list_of_drafter_names() -> None:
    assert drafter_name_lists() == []


async def test_the_settings_dialog_offers_a_drafter_added_to_the_map(
    recall: DrafterSpec, tmp_path, monkeypatch
):
    from textual.suggester import SuggestFromList
    from textual.widgets import Input

    from engine.backends.scripted import ScriptedBackend
    from tests.support.tui import make_app, wait_ready, wait_until
    from tui.screens.settings import SettingsScreen

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    app = make_app(ScriptedBackend(replies=["one"]), preset="qa")
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f12")  # the chat's F12: the dialog with the chat's settings
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
        field = pilot.app.screen.query_one("#settings-draft", Input)
        assert field.placeholder == "ngram, none, recall, or a draft model folder"
        assert isinstance(field.suggester, SuggestFromList)
        assert await field.suggester.get_suggestion("rec") == "recall"


def test_a_companion_is_asked_beside_the_others_and_never_offered_as_a_draft_setting() -> None:
    from engine.decoding.drafters import draft_keywords, loop_drafters

    companions = [name for name, spec in DRAFTERS.items() if spec.companion]
    assert companions == ["history"]
    for name in companions:
        assert name not in draft_keywords() and name not in draft_help()
        assert name not in loop_drafters("llamacpp") and name not in loop_drafters("transformers")
        assert all(name in spec.beside for spec in DRAFTERS.values() if spec.build and not spec.companion)
