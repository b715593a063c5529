"""The drafters: what proposes the tokens a verify pass checks, one per file, behind one interface.

`base` is the interface (`Drafter`: begin, plan, draft, accept; `Plan`; `best_plan`), `ngram` the n-gram lookup
drafter with its suffix index, `draft_model` the draft-model drafter, `mtp` the model's MTP head, `history` the
suffix index over what the chat already wrote (asked beside the others), `registry` the name map that every list of
drafter names reads. Adding a drafter: one file here and one entry in `registry.DRAFTERS`.
"""

from engine.decoding.drafters.base import DraftContext, Drafter, Plan, best_plan, common_prefix
from engine.decoding.drafters.draft_model import DraftModelDrafter, draft_greedy
from engine.decoding.drafters.history import HistoryDrafter, TokenIndex
from engine.decoding.drafters.ngram import NgramDrafter, SuffixIndex
from engine.decoding.drafters.registry import (
    DRAFTERS,
    NO_DRAFTING,
    DrafterSpec,
    build_drafters,
    draft_choices,
    draft_help,
    draft_keywords,
    draft_mode_of,
    drafts,
    is_draft_keyword,
    loop_drafters,
    spec_of_mode,
)

__all__ = [
    "DRAFTERS",
    "NO_DRAFTING",
    "DraftContext",
    "DraftModelDrafter",
    "Drafter",
    "DrafterSpec",
    "HistoryDrafter",
    "NgramDrafter",
    "Plan",
    "SuffixIndex",
    "TokenIndex",
    "best_plan",
    "build_drafters",
    "common_prefix",
    "draft_choices",
    "draft_greedy",
    "draft_help",
    "draft_keywords",
    "draft_mode_of",
    "drafts",
    "is_draft_keyword",
    "loop_drafters",
    "spec_of_mode",
]
