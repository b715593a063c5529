"""Multi-turn exactness: drafting never changes a conversation, on either CPU backend, in any cache mode.

Every turn of a conversation is generated with drafting (n-gram lookup, or the model drafting for itself, which
puts the end-of-turn token inside an accepted draft at the end of nearly every reply) and without, and the
token ids must be equal turn by turn. After each reply the target's cache must hold at most prompt + reply:
no end-of-turn token, no rejected draft (the rule `engine/round_loop` keeps in its `finally`; removing that
crop turns these tests red). First-turn prompts of the embedded model are 31-40 tokens, around the 32-row switch
between row-wise and stock attention; the tiny successor model sweeps raw prefills of 25-40 rows and K 1..16.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.transformers import TransformersBackend
from tests.support.drafting import FreeVerify
from tests.support.replies import cache_holds_at_most, generate
from tests.support.tiny_models import COPY_CYCLE

pytestmark = pytest.mark.slow

# Three turns each. The last turn of each asks for a repeat of earlier text (n-gram drafts get long matches).
CONVERSATIONS = (
    ("List three fruits.", "Which of them is red?", "Repeat your first answer exactly."),
    (
        "Write a Python function that adds two numbers.",
        "Add a docstring to it.",
        "Now show the function again.",
    ),
)
MAX_NEW = 40
K = 5


def converse(
    backend, turns: tuple[str, ...], k: int, seed: int = 0, drafted: list[int] | None = None, **sampler
) -> list[list[int]]:
    """Run a conversation turn by turn; the reply token ids of each turn (each turn's drafted count appended to
    `drafted` where given)."""
    messages: list[dict[str, str]] = []
    replies: list[list[int]] = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        prompt = backend.encode_chat(messages)
        reply = generate(backend, prompt, k=k, max_new=MAX_NEW, seed=seed, **sampler)
        cache_holds_at_most(backend, prompt + reply.tokens)
        replies.append(reply.tokens)
        if drafted is not None:
            drafted.append(reply.drafted)
        messages.append({"role": "assistant", "content": backend.decode(reply.tokens)})
    return replies


_plain: dict[tuple, list[list[int]]] = {}


def plain_conversation(backend, turns: tuple[str, ...], seed: int = 0, **sampler) -> list[list[int]]:
    """`converse` with no drafting, decoded once per loaded backend, conversation and sampler (the fp32 check reads
    the greedy one the drafting test decoded; `three_ways` forgets them when it closes its backends)."""
    key = (id(backend), turns, seed, tuple(sorted(sampler.items())))
    if key not in _plain:
        _plain[key] = converse(backend, turns, k=0, seed=seed, **sampler)
    return _plain[key]


def three_ways(backend_class, model, cache_mode: str):
    """One model three ways, loaded: plain, n-gram drafting, drafting for itself. Yields {name: backend}."""
    backends = {
        name: backend_class(model, draft=draft, cache_mode=cache_mode, max_context=2048)
        for name, draft in (("none", "none"), ("ngram", "ngram"), ("self", str(model)))
    }
    try:
        for backend in backends.values():
            backend.load()
        yield backends
    finally:
        _plain.clear()
        for backend in backends.values():
            backend.close()


def assert_drafting_keeps_the_conversation(trio, turns: tuple[str, ...]) -> None:
    plain = plain_conversation(trio["none"], turns)
    assert all(plain), "every turn answers"
    drafted: list[int] = []
    assert converse(trio["ngram"], turns, k=K) == plain, "ngram drafting changed a turn"
    assert converse(trio["self"], turns, k=K, drafted=drafted) == plain, "self drafting changed a turn"
    assert drafted[0] > 0, "the model drafted for itself in the first turn"


# --- transformers, the embedded model ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=["fp16", "q8"])
def hf_trio(request, smol_dir: Path):
    yield from three_ways(TransformersBackend, smol_dir, request.param)


@pytest.mark.parametrize("turns", CONVERSATIONS, ids=["fruits", "code"])
def test_transformers_conversations_are_identical_with_and_without_drafting(hf_trio, turns) -> None:
    assert_drafting_keeps_the_conversation(hf_trio, turns)


def test_transformers_sampled_conversation_is_identical_with_and_without_drafting(hf_trio) -> None:
    sampler = {"temperature": 0.8, "top_p": 0.95}
    turns = CONVERSATIONS[0]
    plain = converse(hf_trio["none"], turns, k=0, seed=7, **sampler)
    assert converse(hf_trio["self"], turns, k=K, seed=7, **sampler) == plain
    assert converse(hf_trio["ngram"], turns, k=K, seed=7, **sampler) == plain


def test_plain_turns_equal_the_models_own_fp32_greedy_reference(smol_dir: Path, hf_trio) -> None:
    """Exact means the model's own answer: each turn as transformers' generate() gives it from scratch."""
    import torch
    from transformers import AutoModelForCausalLM

    backend = hf_trio["none"]
    if backend.target.cache_mode != "fp16":
        pytest.skip("the reference is the full-precision model; q8 is compared with plain decoding above")
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    turns = CONVERSATIONS[0]
    ours = plain_conversation(backend, turns)
    messages: list[dict[str, str]] = []
    for text, reply in zip(turns, ours, strict=True):
        messages.append({"role": "user", "content": text})
        prompt = backend.encode_chat(messages)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=[2]
            )
        expected = out[0, len(prompt) :].tolist()
        assert reply == [t for t in expected if t != 2][: len(reply)] and len(reply) <= len(expected)
        messages.append({"role": "assistant", "content": backend.decode(reply)})


# --- the successor model: K 1..16, prefills of 25-40 rows, a stop token inside every long draft ----------


@pytest.fixture(scope="module", params=["fp16", "q8"])
def copy_pair(request, copy_model_dir: Path):
    plain = TransformersBackend(copy_model_dir, draft="none", cache_mode=request.param)
    ngram = TransformersBackend(copy_model_dir, draft="ngram", cache_mode=request.param)
    plain.load()
    ngram.load()
    ngram.target.costs = FreeVerify()  # draft the full K wherever a match is found
    yield plain, ngram
    plain.close()
    ngram.close()


def raw_turns(backend, first: list[int], follow_ups: list[list[int]], k: int) -> list[list[int]]:
    """A conversation on raw ids: each turn's prompt is the last prompt + reply + end of turn + new ids."""
    prompt = list(first)
    replies = []
    for extra in [[], *follow_ups]:
        prompt = prompt + extra
        reply = generate(backend, prompt, k=k, max_new=30)
        cache_holds_at_most(backend, prompt + reply.tokens)
        replies.append((reply.tokens, reply.drafted, reply.done.stop_reason))
        prompt = prompt + reply.tokens + [2]
    return replies


@pytest.mark.parametrize("length", [25, 31, 32, 33, 40])
def test_successor_prefills_around_the_row_switch_and_every_k(copy_pair, length: int) -> None:
    plain, ngram = copy_pair
    cycle = list(COPY_CYCLE)
    first = (cycle * 3)[:length]
    follow_ups = [(cycle * 3)[5 : 5 + length], (cycle * 2)[3:14]]
    reference = raw_turns(plain, first, follow_ups, k=0)
    assert any(stop == "end_of_turn" for _, _, stop in reference), "the cycle's stop token must end a turn"
    for k in range(1, 17):
        replies = raw_turns(ngram, first, follow_ups, k=k)
        assert [r[0] for r in replies] == [r[0] for r in reference], f"K={k} changed a turn"
        assert sum(r[1] for r in replies) > 0, f"K={k} never drafted"


# --- llama.cpp, the embedded model's default GGUF (F16) --------------------------------------------------------


@pytest.fixture(scope="module", params=["fp16", "q8", "q4"])
def lcpp_trio(request):
    """The embedded GGUF on llama.cpp three ways: plain, n-gram drafting, drafting for itself."""
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.models import ensure_embedded_gguf

    yield from three_ways(LlamaCppBackend, ensure_embedded_gguf(), request.param)


@pytest.mark.parametrize("turns", CONVERSATIONS, ids=["fruits", "code"])
def test_llamacpp_conversations_are_identical_with_and_without_drafting(lcpp_trio, turns) -> None:
    assert_drafting_keeps_the_conversation(lcpp_trio, turns)


def test_llamacpp_sampled_conversation_and_every_k_are_identical(lcpp_trio) -> None:
    sampler = {"temperature": 0.8, "top_p": 0.95}
    turns = CONVERSATIONS[0][:2]
    plain = converse(lcpp_trio["none"], turns, k=0, seed=7, **sampler)
    assert converse(lcpp_trio["self"], turns, k=K, seed=7, **sampler) == plain
    greedy = converse(lcpp_trio["none"], turns, k=0)
    # Every K on the transformers backend (the successor model above); here a spread up to 16.
    for k in (1, 2, 3, 8, 16):
        assert converse(lcpp_trio["self"], turns, k=k) == greedy, f"K={k} changed a turn"
