"""One name map for the drafters (engine/decoding/drafters/registry.py): a drafter added to it is offered and taken
everywhere a draft setting is (the CLI's --draft help and check, the config, the model checks, the chat's labels,
the verdict and the stats)."""

from __future__ import annotations

import pytest

from engine.decoding.acceptance import AcceptanceAccounting
from engine.decoding.drafters import DRAFTERS, DrafterSpec, build_drafters, draft_mode_of
from engine.decoding.drafters.ngram import build as ngram_build
from engine.decoding.verdict import draft_verdict
from engine.events import Chunk

HISTORY = DrafterSpec(
    name="history",
    description="free drafts copied from past chats",
    label="past-chats lookup",
    build=ngram_build,
)


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> DrafterSpec:
    """A new drafter, registered the way a new file would register it: one entry in the map."""
    monkeypatch.setitem(DRAFTERS, HISTORY.name, HISTORY)
    return HISTORY


def test_the_cli_offers_and_takes_a_drafter_added_to_the_map(history: DrafterSpec) -> None:
    from tui.cli.common import cli_settings
    from tui.cli.entry import build_parser

    parser = build_parser()
    draft_help = next(a.help for a in parser._actions if "--draft" in a.option_strings)
    assert "history (free drafts copied from past chats)" in draft_help
    assert "ngram" in draft_help and "mtp" in draft_help
    settings = cli_settings(parser.parse_args(["--draft", "History"]))  # checked like every draft setting
    assert settings.draft == "history"


def test_the_config_and_the_model_check_take_a_drafter_added_to_the_map(history: DrafterSpec) -> None:
    from engine.config import ConfigError, load_settings
    from engine.models import ModelError, check_draft_choice

    assert load_settings(draft=" HISTORY ").draft == "history"  # a keyword, not a folder path
    assert check_draft_choice("History") == "history"
    with pytest.raises(ConfigError, match="'ngram', 'none', 'mtp', 'history' or a draft model folder"):
        load_settings(draft=" ")
    with pytest.raises(ModelError, match="give 'ngram', 'none', 'history' or a draft model folder"):
        check_draft_choice("")


def test_a_drafter_added_to_the_map_is_a_draft_mode_with_its_own_label_stats_and_verdict(
    history: DrafterSpec,
) -> None:
    from engine.decoding.cost_model import VerifyCostModel
    from tui.formatting import drafter_name, drafts_here

    assert draft_mode_of("history") == "history" and draft_mode_of("/models/draft") == "model"
    assert drafts_here("history") and not drafts_here("none") and not drafts_here("server")

    class Info:
        draft_mode, draft_model = "history", None

    assert drafter_name(Info) == "past-chats lookup drafting"
    # Its drafts take no model steps: its rounds are counted as lookups, and the verdict prices them free (c = 0).
    accounting = AcceptanceAccounting(t_start=0.0)
    accounting.add(Chunk("ab", (1, 2), 3, 1, (True, False), 0.1, drafter="history"))
    assert accounting.lookup_rounds == 1
    costs = VerifyCostModel.from_ratios({1: 1.0, 2: 1.05, 5: 1.2}, draft_ratio=0.5)
    verdict = draft_verdict(costs, "history", 4)
    assert (
        verdict.status == "pass" and verdict.c == 0.0 and "(past-chats lookup drafts are free)" in verdict.why
    )


def test_the_backends_round_loop_builds_a_drafter_added_to_the_map(history: DrafterSpec) -> None:
    from engine.decoding.adaptive_k import AdaptiveK
    from engine.decoding.drafters import DraftContext

    class Target:
        costs = None

    context = DraftContext(target=Target(), draft=None, tuner=AdaptiveK(), adaptive=True, vocab_size=10)
    assert [d.name for d in build_drafters("history", context)] == ["ngram"]  # its factory's drafter
    assert build_drafters("none", context) == [] and build_drafters("server", context) == []
