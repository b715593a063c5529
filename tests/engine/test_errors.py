"""engine.errors: one user-facing base with an optional title, and the one first-line-of-an-exception helper."""

from __future__ import annotations

import pytest

from engine.errors import BackendError, SpecchatError, UserError, first_line


def test_a_user_error_is_one_line_and_may_carry_a_title() -> None:
    error = UserError("model folder not found:\n   /tmp/x\t(give a folder)")
    assert str(error) == "model folder not found: /tmp/x (give a folder)" and error.title is None
    titled = BackendError("out of memory loading the draft", title="Model not loaded")
    assert titled.title == "Model not loaded" and isinstance(titled, UserError)
    assert BackendError("x").title is None  # a title set on one error is not every error's
    assert isinstance(SpecchatError("x"), UserError) and str(UserError()) == ""
    with pytest.raises(UserError, match="^a b$"):
        raise SpecchatError("a\n\nb")


def test_first_line_of_an_exception() -> None:
    assert (
        first_line(RuntimeError("  CUDA error: out of memory\nstack trace ..."))
        == "CUDA error: out of memory"
    )
    assert first_line(ValueError()) == "ValueError"
    assert first_line(ValueError("  \n"), default="") == ""
    assert first_line(OSError(2, "No such file")) == "[Errno 2] No such file"


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (
            "CUDA error: device-side assert triggered\n  at kernel.cu:12",
            "RuntimeError: CUDA error: device-side assert triggered",
        ),
        ("", "RuntimeError"),
    ],
)
def test_an_unexpected_error_inside_a_model_is_one_line_naming_its_type(message: str, detail: str) -> None:
    """The round loop words a model's own failure with first_line: the type and the message's first line (the
    type alone where there is no message), as a BackendError the session shows."""
    import threading

    from engine.decoding.round_loop import LoopSetup, run_reply
    from engine.request import GenerationRequest, SamplerSettings

    class BrokenModel:
        def __setattr__(self, name: str, value: object) -> None:
            raise RuntimeError(message)

    setup = LoopSetup(
        target=BrokenModel(),  # type: ignore[arg-type]
        drafters=[],
        stop_token_ids=frozenset(),
        end_of_turn_id=None,
        max_context=64,
        vocab_size=16,
        new_text=lambda: None,  # type: ignore[arg-type,return-value]
    )
    request = GenerationRequest(prompt_ids=(1, 2, 3), sampler=SamplerSettings(), max_new_tokens=4)
    with pytest.raises(BackendError) as caught:
        list(run_reply(setup, request, threading.Event()))
    assert str(caught.value) == f"generation failed inside the model ({detail})"
