"""The stand-in package (tests/support/exl3_standin) imported as `exllamav3`, for the backend's tests."""

from __future__ import annotations

import sys

import pytest

from tests.support import paths

# What a test folder copies from SmolLM2's, and the chat the backend tests send.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
MESSAGES = [{"role": "user", "content": "Write a haiku about caches."}]


def forget_exllamav3() -> None:
    """Drop every exllamav3 module imported so far (the stand-in's, or a refusal), so the next import is fresh."""
    for name in list(sys.modules):
        if name == "exllamav3" or name.startswith("exllamav3."):
            del sys.modules[name]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    """The stand-in package imported as `exllamav3` for one test, forgotten afterwards."""
    import torch

    forget_exllamav3()
    monkeypatch.syspath_prepend(str(paths.EXL3_STANDIN))
    # probes say "no GPU"; load() imports anyway
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    import exllamav3
    import exllamav3.standin

    assert "exl3_standin" in exllamav3.__file__
    exllamav3.standin.LOAD_LOG.clear()
    yield exllamav3
    forget_exllamav3()
