"""Router: accuracy on a labelled set of realistic messages, per-class checks, reasons and edge cases.

Run with `pytest -s tests/engine/test_router.py` to see the accuracy and the confusion matrix.
"""

from __future__ import annotations

import json

import pytest

from engine.router import DECISION_THRESHOLD, ROUTED_PRESETS, RouteDecision, route
from tests.support import paths

DATA = paths.DATA / "router_messages.jsonl"
CLASSES = ("code", "qa", "creative")


def load_messages() -> list[dict[str, str]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(set(row) == {"text", "label"} and row["label"] in CLASSES for row in rows)
    return rows


@pytest.fixture(scope="module")
def results() -> list[tuple[str, str, RouteDecision]]:
    return [(row["label"], row["text"], route(row["text"])) for row in load_messages()]


def confusion_matrix(results: list[tuple[str, str, RouteDecision]]) -> dict[str, dict[str, int]]:
    matrix = {label: dict.fromkeys(CLASSES, 0) for label in CLASSES}
    for label, _, decision in results:
        matrix[label][decision.preset] += 1
    return matrix


def format_matrix(matrix: dict[str, dict[str, int]]) -> str:
    lines = ["label \\ routed " + "".join(f"{name:>10}" for name in CLASSES) + "    recall"]
    for label in CLASSES:
        row = matrix[label]
        total = sum(row.values())
        lines.append(
            f"{label:<15}" + "".join(f"{row[name]:>10}" for name in CLASSES) + f"    {row[label] / total:.2f}"
        )
    return "\n".join(lines)


def test_labelled_set_is_large_and_balanced() -> None:
    rows = load_messages()
    assert len(rows) >= 60
    for label in CLASSES:
        assert sum(row["label"] == label for row in rows) >= 20
    assert len({row["text"] for row in rows}) == len(rows)


def test_accuracy_on_labelled_set(results: list[tuple[str, str, RouteDecision]]) -> None:
    correct = sum(label == decision.preset for label, _, decision in results)
    accuracy = correct / len(results)
    matrix = confusion_matrix(results)
    print(f"\nrouter accuracy: {accuracy:.3f} ({correct}/{len(results)})")
    print(format_matrix(matrix))
    for label, text, decision in results:
        if label != decision.preset:
            print(f"  missed: {label} -> {decision.preset} [{decision.reason}] {text[:70]!r}")
    assert accuracy >= 0.9


@pytest.mark.parametrize("label", CLASSES)
def test_per_class_recall_and_precision(results: list[tuple[str, str, RouteDecision]], label: str) -> None:
    matrix = confusion_matrix(results)
    recall = matrix[label][label] / sum(matrix[label].values())
    routed_here = sum(matrix[other][label] for other in CLASSES)
    precision = matrix[label][label] / routed_here
    assert recall >= 0.85, f"{label} recall {recall:.2f}"
    assert precision >= 0.85, f"{label} precision {precision:.2f}"


def test_every_decision_explains_itself(results: list[tuple[str, str, RouteDecision]]) -> None:
    for _, _, decision in results:
        assert decision.preset in CLASSES
        assert decision.reason and "\n" not in decision.reason and len(decision.reason) <= 90
        assert set(decision.scores) == set(ROUTED_PRESETS)
        # The chosen preset is the one with the top score (qa's score is the bar the others must reach).
        assert decision.scores[decision.preset] == max(decision.scores.values())


# ----------------------------------------------------------------------------- tricky cases and reasons


def test_code_fence_and_traceback_reason() -> None:
    text = 'It crashes:\n```\nTraceback (most recent call last):\n  File "x.py", line 3\nKeyError: 1\n```'
    decision = route(text)
    assert decision.preset == "code"
    assert decision.reason == "code fence and a stack trace"


def test_poem_about_python_is_creative() -> None:
    decision = route("Write a poem about Python and its love of indentation")
    assert decision.preset == "creative"
    assert decision.reason == "asks for a poem"


def test_story_mentioning_a_computer_is_creative() -> None:
    assert route("Tell me a story about an old computer that dreams of the sea").preset == "creative"


def test_what_does_this_error_mean_is_code() -> None:
    decision = route("what does this error mean: ModuleNotFoundError: No module named 'yaml'")
    assert decision.preset == "code"
    assert "ModuleNotFoundError" in decision.reason


def test_closure_choice_is_documented() -> None:
    # One ambiguous programming word alone stays qa; with a language or code it is code.
    assert route("explain what a closure is").preset == "qa"
    assert route("explain what a closure is in Python").preset == "code"


def test_a_file_format_alone_is_not_code() -> None:
    # CSV is a spreadsheet's format as much as a programmer's: a plain-words question about it is qa.
    assert route("Explain what a CSV file is in plain words").preset == "qa"
    assert route("Read a CSV file with pandas and sum a column").preset == "code"


def test_code_request_beats_creative_subject() -> None:
    decision = route("Write a function that returns a random haiku from a list")
    assert decision.preset == "code"
    assert decision.reason.startswith("asks to write a function")


def test_creative_request_beats_a_pasted_snippet() -> None:
    assert route("Write a haiku about this function:\n```python\ndef f(x):\n    return x\n```").preset == (
        "creative"
    )


def test_question_without_cues_is_qa_with_kind() -> None:
    decision = route("Why do leaves change colour in autumn?")
    assert decision == RouteDecision(
        "qa", "no code or creative cues: explanation request", {"code": 0.0, "qa": 2.0, "creative": 0.0}
    )


def test_weak_cue_is_named_in_the_qa_reason() -> None:
    decision = route("What is a class action lawsuit?")
    assert decision.preset == "qa"
    assert decision.reason == 'only a weak code cue ("class"): question'
    assert 0 < decision.scores["code"] < DECISION_THRESHOLD


def test_everyday_words_that_are_language_names_stay_qa() -> None:
    assert route("how do I get rust off my bike chain?").preset == "qa"
    assert route("Who were the members of Monty Python?").preset == "qa"
    assert route("how long do pythons live").preset == "qa"


def test_empty_message() -> None:
    assert route("   ") == RouteDecision("qa", "empty message", {"code": 0.0, "qa": 0.0, "creative": 0.0})


def test_available_restricts_the_choice() -> None:
    assert route("write a poem about rain", available=("code", "qa")).preset == "qa"
    decision = route("What is the capital of Peru?", available=("creative",))
    assert decision.preset == "creative"
    assert "qa not available" in decision.reason
    with pytest.raises(ValueError):
        route("hello", available=("fast",))


def test_deterministic_and_long_input_is_fine() -> None:
    text = "```python\n" + "x = compute(x)\n" * 50_000 + "```"
    first, second = route(text), route(text)
    assert first == second and first.preset == "code"


# --- the conversation counts: a follow-up stays with what it refers back to -----------------------------------

CODE_CHAT = [
    ("user", "Write a Python function that parses ISO 8601 dates."),
    ("assistant", "Here it is:\n```python\ndef parse(text):\n    return datetime.fromisoformat(text)\n```"),
]
POEM_CHAT = [("user", "Write a poem about the sea."), ("assistant", "The sea is wide, the sea is deep ...")]


def test_a_follow_up_mid_code_chat_stays_code() -> None:
    text = "Add a docstring example section to that function and show the complete function again."
    assert route(text).preset == "qa"  # alone, "function" is one weak cue
    decision = route(text, recent=CODE_CHAT)
    assert decision.preset == "code"
    assert decision.reason == 'a follow-up on the code above ("that function")'
    assert route("Can you also make it handle time zones?", recent=CODE_CHAT).preset == "code"


def test_a_follow_up_mid_creative_chat_stays_creative() -> None:
    decision = route("Make it shorter and show that poem again.", recent=POEM_CHAT)
    assert decision.preset == "creative" and decision.reason.startswith("a follow-up on the creative piece")


def test_a_new_question_or_request_is_not_a_follow_up() -> None:
    assert route("What is the capital of France?", recent=CODE_CHAT).preset == "qa"
    assert route("Why is the sky blue?", recent=CODE_CHAT).preset == "qa"
    assert route("Now write a poem about it.", recent=CODE_CHAT).preset == "creative"  # its own request wins
    assert route("Show that function again.", recent=[("user", "What is a closure?")]).preset == "qa"
    assert route("Show that function again.", recent=CODE_CHAT, available=("qa", "creative")).preset == "qa"


def test_the_session_routes_with_the_conversation() -> None:
    import threading

    from engine.backends.scripted import ScriptedBackend
    from engine.config import Settings
    from engine.session import ChatSession

    session = ChatSession(Settings(), backend=ScriptedBackend("```python\ndef parse(s):\n    pass\n```"))
    session.load()
    first = session.send("Write a Python function that parses dates.", lambda event: None, threading.Event())
    assert first.stats.preset == "code"
    follow = session.send(
        "Add a docstring example section to that function and show the complete function again.",
        lambda event: None,
        threading.Event(),
    )
    assert follow.stats.preset == "code" and follow.stats.router_reason.startswith("a follow-up on the code")
