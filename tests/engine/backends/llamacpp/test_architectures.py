"""Models beyond the embedded one on the llama.cpp backend: a tiny random Gemma 2 (a sliding window of 16 on every
other layer, attention and final logit soft-capping, tied embeddings) and a Mistral-style Llama (untied
embeddings), both with a 512-token vocabulary, written as GGUF files from their Hugging Face folders
(tests/support/tiny_gguf.py). Every prompt runs past the window. In every path (plain, n-gram, a draft model whose drafts
are mostly rejected, edit/regenerate) the reply equals plain decoding token for token and follows the model's
own forward (transformers, fp32) to float rounding; never an uncaught exception.

llama.cpp's Llama architecture has no sliding window (a Mistral window is ignored there), so the Llama-style model
here has none; the transformers backend's tests (tests/engine/backends/transformers/test_architectures.py) cover Mistral windows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from tests.support.replies import generate  # noqa: E402
from tests.support.tiny_gguf import write_tiny_gguf  # noqa: E402
from tests.support.tiny_models import WINDOW, build_tiny_architecture  # noqa: E402
from tests.support.tiny_models import WINDOW_QUESTION as QUESTION  # noqa: E402

pytestmark = pytest.mark.slow

# A token counts as the model's own choice when its fp32 logit is within this of the best one (float rounding of
# an f16 cache and another summation order can flip a near-tie, nothing more).
NEAR_TIE = 0.02


def build_for_llamacpp(kind: str, folder: Path, seed: int) -> Path:
    """`build_tiny_architecture`'s model, re-drawn with what llama.cpp's architecture fixes: Gemma 2 scales queries by
    1/sqrt(head_dim) (query_pre_attn_scalar = head_dim); its Llama has no sliding window."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = build_tiny_architecture(kind, folder, seed)
    config = AutoConfig.from_pretrained(folder)
    if kind == "gemma2":
        config.query_pre_attn_scalar = config.head_dim
    else:
        config.sliding_window = None
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """kind -> (Hugging Face folder, GGUF file)."""
    root = tmp_path_factory.mktemp("llamacpp-architectures")
    built = {}
    for kind, seed in (("gemma2", 5), ("mistral", 6)):
        folder = build_for_llamacpp(kind, root / kind, seed)
        built[kind] = (folder, write_tiny_gguf(folder, root / f"{kind}.gguf"))
    return built


def reference_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


def assert_follows_the_model(folder: Path, prompt: list[int], tokens: list[int]) -> None:
    """Each token is the fp32 model's own greedy choice, or within NEAR_TIE of it, along this very reply."""
    logits = reference_logits(folder, prompt + tokens)[len(prompt) - 1 : -1]
    best = logits.max(dim=-1).values
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    gaps = (best - chosen).tolist()
    assert max(gaps) <= NEAR_TIE, f"token {gaps.index(max(gaps))} is {max(gaps):.3f} below the model's choice"
    assert (
        sum(g == 0.0 for g in gaps) >= len(gaps) - 2
    )  # near-ties are rare: almost every token is the argmax


@pytest.mark.parametrize("kind", ["gemma2", "mistral"])
def test_logits_follow_the_models_own_forward_past_the_window(models, kind: str) -> None:
    folder, gguf = models[kind]
    backend = LlamaCppBackend(gguf, draft="none", cache_mode="fp16", max_context=512)
    backend.load()
    try:
        prompt = backend.encode_chat([{"role": "user", "content": QUESTION}])
        assert len(prompt) > 2 * WINDOW
        backend.target.clear()
        rows = torch.from_numpy(backend.target.decode(prompt, outputs=len(prompt)))
    finally:
        backend.close()
    expected = reference_logits(folder, prompt)
    assert (rows - expected).abs().max().item() < 0.05  # an f16 cache; ignoring the window is off by ~1-10
    assert torch.equal(rows.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("kind", ["gemma2", "mistral"])
def test_every_drafting_path_equals_plain_and_follows_the_model(models, kind: str) -> None:
    folder, gguf = models[kind]
    other = models["mistral" if kind == "gemma2" else "gemma2"][
        1
    ]  # same tokenizer: a draft that mostly misses
    plain = None
    for drafting in ("none", "ngram", str(other)):
        backend = LlamaCppBackend(gguf, draft=drafting, cache_mode="fp16", max_context=512)
        backend.load()
        try:
            prompt = backend.encode_chat([{"role": "user", "content": QUESTION}])
            reply = generate(backend, prompt, k=4, max_new=40)
            if plain is None:
                plain = reply.tokens
                assert len(plain) >= 20
                assert_follows_the_model(folder, prompt, plain)
            assert reply.tokens == plain, f"{kind} draft={drafting}"
            if drafting == str(other):
                assert reply.drafted > reply.accepted  # rejected drafts: the caches were cropped every round
                # the draft's default q8 cache does not fit head size 16: f16 instead, said in a note
                assert any(n.startswith("draft cache: f16 (") for n in backend.info.notes)
            # edit/regenerate: a crop back into the window, then the edited prompt's own answer
            edited = prompt[: len(prompt) - 3] + prompt[-2:]
            again = generate(backend, edited, k=4, max_new=20)
            assert_follows_the_model(folder, edited, again.tokens)
            assert backend.target.ids == (edited + again.tokens)[: len(backend.target.ids)]
        finally:
            backend.close()
