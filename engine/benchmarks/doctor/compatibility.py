"""`specchat doctor`'s compatibility check: a draft model against its target (vocabulary sizes, differing token
strings, special tokens, tokenizer file hashes, chat templates); the rule that fails is named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from engine.benchmarks.doctor.report import DoctorReport

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")


def file_hashes(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()[:16]
        for name in TOKENIZER_FILES
        if (folder / name).is_file()
    }


def check_compatibility(report: DoctorReport, model_dir: Path, draft_dir: Path | None) -> bool:
    """The draft/target specifics; returns False when the draft cannot draft (the rule named)."""
    if draft_dir is None:
        hashes = file_hashes(model_dir) if model_dir.is_dir() else {}
        report.add("compatibility", "pass", "n-gram drafting: no draft model to check", target_hashes=hashes)
        return True
    if not model_dir.is_dir() or not draft_dir.is_dir():
        report.add(
            "compatibility", "pass", "GGUF files: checked by the backend at load", draft=str(draft_dir)
        )
        return True
    from engine.decoding.draft_compat import DraftIncompatibleError, check_draft_compatible

    views, templates, sizes = _read_sides(model_dir, draft_dir)
    details = _compare(views, templates, sizes, model_dir, draft_dir)
    differing, shared = details["differing_token_strings"], details["compared_ids"]
    try:
        check_draft_compatible(views["target"], views["draft"])
    except DraftIncompatibleError as exc:
        report.add(
            "compatibility", "fail", f"{exc} ({differing} of {shared} token strings differ)", **details
        )
        return False
    return _report_differences(report, details)


def _read_sides(model_dir: Path, draft_dir: Path) -> tuple[dict, dict, dict]:
    """Each side's vocabulary view, chat template, and tokenizer and embedding sizes, by "target" and "draft"."""
    from transformers import AutoTokenizer

    from engine.chat_template import ChatTemplate
    from engine.decoding.draft_compat import VocabView, special_token_ids

    views, templates, sizes = {}, {}, {}
    for who, folder in (("target", model_dir), ("draft", draft_dir)):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        template = ChatTemplate.from_folder(folder)
        templates[who] = template
        views[who] = VocabView(
            folder.name, len(tokenizer), special_token_ids(tokenizer, template.end_of_turn), tokenizer
        )
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        sizes[who] = {"tokenizer": len(tokenizer), "embedding": config.get("vocab_size")}
    return views, templates, sizes


def _compare(views: dict, templates: dict, sizes: dict, model_dir: Path, draft_dir: Path) -> dict:
    """What the report's details say: the token strings that differ over the shared ids, the special tokens, the
    tokenizer files' hashes and whether the chat templates are the same."""
    shared = min(views["target"].tokenizer_size, views["draft"].tokenizer_size)
    ids = list(range(shared))
    target_tokens = views["target"].tokenizer.convert_ids_to_tokens(ids)
    draft_tokens = views["draft"].tokenizer.convert_ids_to_tokens(ids)
    differing = sum(a != b for a, b in zip(target_tokens, draft_tokens, strict=True))
    hashes = {"target": file_hashes(model_dir), "draft": file_hashes(draft_dir)}
    return {
        "vocab_sizes": sizes,
        "differing_token_strings": differing,
        "compared_ids": shared,
        "special_tokens": {"target": views["target"].special_ids, "draft": views["draft"].special_ids},
        "tokenizer_hashes": hashes,
        "same_tokenizer_file": hashes["target"].get("tokenizer.json")
        == hashes["draft"].get("tokenizer.json"),
        "same_chat_template": templates["target"].source == templates["draft"].source,
    }


def _report_differences(report: DoctorReport, details: dict) -> bool:
    """A pair the rules pass: what still differs (token strings fail; the files or the template warn), or a pass
    that says what is the same. Returns whether the draft can draft."""
    differing, shared, sizes = (
        details["differing_token_strings"],
        details["compared_ids"],
        details["vocab_sizes"],
    )
    notes = []
    if differing:
        notes.append(f"{differing} of {shared} token strings differ outside the sampled ids")
    if not details["same_tokenizer_file"]:
        notes.append("the tokenizer files differ (another tokenizer version?)")
    if not details["same_chat_template"]:
        notes.append("the chat templates differ")
    if notes:
        status = "fail" if differing else "warn"
        report.add(
            "compatibility", status, "compatible by the sampled rules, but " + "; ".join(notes), **details
        )
        return not differing
    report.add(
        "compatibility",
        "pass",
        f"vocabulary {sizes['target']['tokenizer']} = {sizes['draft']['tokenizer']}, all token strings, special "
        "tokens, tokenizer file and chat template the same",
        **details,
    )
    return True
