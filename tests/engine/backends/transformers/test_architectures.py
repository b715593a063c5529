"""Models beyond the embedded one on the transformers backend: sliding windows, soft-capping, untied
embeddings, another vocabulary size. Each tiny random model (window 16, so every prompt here runs past it) must
give the model's own greedy answer in every path: plain, n-gram, a draft model whose drafts are mostly rejected
(crops at every round), edit/regenerate (a crop back into the window), both cache modes. Never an uncaught
exception, never a dead reply thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import engine.backends.transformers.backend as hf
from engine.backends.transformers import TransformersBackend
from tests.support.replies import generate
from tests.support.tiny_models import WINDOW, build_tiny_architecture
from tests.support.tiny_models import WINDOW_QUESTION as QUESTION

pytestmark = pytest.mark.slow

ARCHITECTURES = ("gemma2", "gemma3", "mistral")


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(kind, target folder, draft folder). The draft is an untied Mistral with the same tokenizer: a tied
    random model mostly repeats its input token, so a tied draft would agree with a tied target every time."""
    root = tmp_path_factory.mktemp(request.param)
    return (
        request.param,
        build_tiny_architecture(request.param, root / "target", seed=5),
        build_tiny_architecture("mistral", root / "draft", seed=6),
    )


def reference(folder: Path, prompt: list[int], max_new: int) -> list[int]:
    """The model's own greedy answer: transformers' generate() with its default attention and cache."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=[2]
        )
    tokens = out[0, len(prompt) :].tolist()
    return tokens[: tokens.index(2)] if 2 in tokens else tokens


@pytest.mark.parametrize("cache_mode", ["fp16", "q8"])
def test_every_drafting_path_gives_the_models_own_greedy_answer(arch, cache_mode: str) -> None:
    kind, target, draft = arch
    expected = None
    for drafting in ("none", "ngram", str(draft)):
        backend = TransformersBackend(target, draft=drafting, cache_mode=cache_mode)
        backend.load()
        try:
            prompt = backend.encode_chat([{"role": "user", "content": QUESTION}])
            assert len(prompt) > 2 * WINDOW
            if expected is None:
                expected = reference(target, prompt, 40)
            reply = generate(backend, prompt, k=4, max_new=40)
            assert reply.tokens == expected, f"{kind} {cache_mode} draft={drafting}"
            if drafting == str(draft):
                assert reply.drafted > reply.accepted  # rejected drafts: the cache was cropped every round
            # edit/regenerate: a prompt that leaves the old one inside the window, a crop back past it
            edited = prompt[: len(prompt) - 3] + prompt[-2:]
            again = generate(backend, edited, k=4, max_new=20)
            assert again.tokens == reference(target, edited, 20)
            assert backend.target.ids == (edited + again.tokens)[: len(backend.target.ids)]
        finally:
            backend.close()


def test_logits_equal_the_models_own_forward_at_every_position(arch) -> None:
    """Row-wise attention applies the window (and Gemma 2's soft-cap) as the model's own attention does."""
    from transformers import AutoModelForCausalLM

    _, target, _ = arch
    backend = TransformersBackend(target, draft="none", cache_mode="fp16")
    backend.load()
    try:
        ids = backend.encode_chat([{"role": "user", "content": QUESTION * 2}])
        state = backend.target
        state.new_cache()
        state.prefill(ids[:40])
        ours = [state.forward(ids[i : i + 3], keep=3) for i in range(40, len(ids) - 3, 3)]
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        with torch.inference_mode():
            theirs = model(torch.tensor([ids])).logits[0]
        for n, rows in enumerate(ours):
            start = 40 + 3 * n
            assert torch.allclose(rows, theirs[start : start + 3], atol=1e-4), f"rows {start}..{start + 2}"
    finally:
        backend.close()


def test_transformers_own_cache_that_refuses_a_crop_re_prefills_exactly(arch, monkeypatch) -> None:
    """Where our caches do not fit (forced here), transformers' cache refuses to crop a sliding layer past
    its window: the prefix is decoded again (exact), and drafting is turned off with a note, not a crash."""
    kind, target, _ = arch
    monkeypatch.setattr(hf, "_cache_mode_for", lambda config, requested, who, notes: "dynamic")
    backend = TransformersBackend(target, draft="ngram", cache_mode="fp16")
    backend.load()
    try:
        prompt = backend.encode_chat([{"role": "user", "content": QUESTION}])
        reply = generate(backend, prompt, k=4, max_new=30)
        assert reply.tokens == reference(target, prompt, 30)
        assert reply.drafted == 0 and any("drafting off" in note for note in reply.done.notes)
        state = backend.target
        state.crop(len(prompt) - 5)  # past the window: transformers refuses, we rebuild
        assert state.ids == prompt[: len(prompt) - 5]
        edited = prompt[:-5] + prompt[-4:]
        assert generate(backend, edited, k=4, max_new=20).tokens == reference(target, edited, 20)
    finally:
        backend.close()
