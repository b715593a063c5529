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
