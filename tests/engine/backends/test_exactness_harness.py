"""One exactness harness over every real backend and every mix of drafters.

Speculative output must equal plain decoding token for token, whatever the loop sends. For each engine (llama.cpp
on the embedded F16 and Q4_1 GGUFs, Gemma 3 270M with sliding-window attention, the Qwen2.5-Coder Q4_K_M pair;
transformers on SmolLM2) and each drafter mix it can run (n-gram lookup with adaptive K and long-match mode, a
draft model with fixed and adaptive K, a draft model with lookup beside it), greedy and seeded sampling, on a prompt
that copies 600+ tokens of code, the reply equals the plain one:
- with the token budget cutting a long-match round short (a small max_new_tokens),
- near the end of the context (the reply stops at max_context, and so do the drafts),
- with no internal error, and verify passes never wider than the kernel probe proved.

Costs are planted (`CheapVerify`: a wide pass and a draft step cost little, and stay so), so that every drafter
really drafts, long-match rounds really send passes wider than 16 tokens where the probe proved them, and the
draft model's plan wins some rounds: what the rules need to see, on any machine and whatever its load.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from engine.decoding.cost_model import MAX_DRAFT_LENGTH, VerifyCostModel
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings

pytestmark = pytest.mark.slow


def copy_prompt_text(functions: int) -> str:
    """A request to copy a module of `functions` small functions (~45-55 tokens each): long matches throughout."""
    code = "\n".join(
        f"def step_{i}(values: list[int]) -> list[int]:\n"
        f'    """Scale each value by {i + 2} and keep those above {i * 3}."""\n'
        f"    return [v * {i + 2} for v in values if v * {i + 2} > {i * 3}]\n"
        for i in range(functions)
    )
    return (
        f"Repeat this Python module exactly, then add one more function at the end.\n\n```python\n{code}```"
    )


# ~700 tokens of code to copy (SmolLM2's tokenizer; 869 as the Qwen pair's chat).
COPY_PROMPT = copy_prompt_text(16)
# The pair's: 12 functions, ~650 tokens as its chat, still past 512 cached positions. Its 1.5B prefills on one core
# at ~10 tokens/s, and the module prefills this prompt four times (the n-gram backend's target, the draft backend's
# target and draft, the two-turn test's cold reference): the 16-function prompt's 220 more tokens cost ~80 s there.
PAIR_COPY_PROMPT = copy_prompt_text(12)
GREEDY = {"temperature": 0.0}
SEEDED = {"temperature": 0.8, "top_p": 0.95}


class CheapVerify(VerifyCostModel):
    """A verify pass of w tokens costs 1 + 0.02 (w - 1) plain steps and a draft-model step 0.05 of one, whatever
    the real passes take: adaptive K drafts, long-match rounds run to their ceiling, the draft model pays."""

    def __init__(self) -> None:
        super().__init__(
            {w: 1.0 + 0.02 * (w - 1) for w in (2, 9, 17, 49)}, one_token_s=0.01, draft_ratio=0.05
        )

    def observe(self, width: int, seconds: float) -> None:
        pass

    def observe_draft(self, seconds: float) -> None:
        pass


@dataclass
class Run:
    chunks: list[Chunk]
    done: Done
    widths: list[int]  # every verify pass the target ran, by width

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    def drafted_by(self, drafter: str) -> int:
        return sum(c.drafted for c in self.chunks if c.drafter == drafter)


def run(
    backend, prompt: list[int], k: int, max_new: int, mode: str = "adaptive", seed: int = 7, **sampler
) -> Run:
    widths: list[int] = []
    target = backend.target
    real_score = target.score

    def score(tokens):
        widths.append(len(tokens))
        return real_score(tokens)

    target.score = score
    request = GenerationRequest(
        prompt_ids=tuple(prompt),
        sampler=SamplerSettings(**(sampler or GREEDY)),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=seed,
        k_mode=mode,
        tuning_key=f"harness-{mode}-{k}",
    )
    try:
        events = list(backend.generate(request, threading.Event()))
    finally:
        del target.score  # the instance attribute goes; the class's method is back
    chunks = [e for e in events if isinstance(e, Chunk)]
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 1 and events[-1] is done[0], "chunks, then exactly one Done"
    return Run(chunks, done[0], widths)


@dataclass
class Engine:
    """A loaded target with n-gram drafting, and the same target with a draft model (None where it has none)."""

    name: str
    ngram: object
    draft: object | None
    widest: int  # the widest verify pass the engine may send (the probe's proof, or the loop's cap)
    copy_text: str = COPY_PROMPT  # the request to copy code every test starts from

    def close(self) -> None:
        for backend in (self.ngram, self.draft):
            if backend is not None:
                backend.close()


def plant(*backends) -> None:
    for backend in backends:
        if backend is not None:
            backend.target.costs = CheapVerify()


def llamacpp_engine(
    name: str, target, draft, max_context: int = 2048, copy_text: str = COPY_PROMPT
) -> Engine:
    from engine.backends.llamacpp import LlamaCppBackend

    ngram = LlamaCppBackend(target, draft="ngram", max_context=max_context)
    ngram.load()
    with_draft = None
    if draft is not None:
        with_draft = LlamaCppBackend(target, draft=str(draft), max_context=max_context, threads=ngram.threads)
        with_draft.load()
    plant(ngram, with_draft)
    widest = ngram.max_verify_width or ngram._loop_options()["max_draft"] + 1
    return Engine(name, ngram, with_draft, widest, copy_text)


def embedded_f16() -> Iterator[Engine]:
    from engine.models import ensure_embedded_gguf

    engine = llamacpp_engine("llama.cpp F16", ensure_embedded_gguf(), ensure_embedded_gguf(precision="q4_1"))
    yield engine
    engine.close()


def embedded_q4_1() -> Iterator[Engine]:
    from engine.models import ensure_embedded_gguf
    from tests.support.native_guard import survives

    q4_1 = ensure_embedded_gguf(precision="q4_1")
    survives(q4_1)
    engine = llamacpp_engine("llama.cpp Q4_1", q4_1, ensure_embedded_gguf())
    yield engine
    engine.close()


def gemma3_swa() -> Iterator[Engine]:
    from tests.support.native_guard import survives
    from tests.support.real_gguf import gemma3_gguf

    try:
        path = gemma3_gguf()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    survives(path)
    engine = llamacpp_engine("llama.cpp Gemma 3 SWA", path, None)
    yield engine
    engine.close()


def qwen_pair() -> Iterator[Engine]:
    from engine.models import ModelError
    from engine.models.named import PAIR_DRAFT, PAIR_TARGET, ensure_named_model
    from tests.support.native_guard import survives

    try:
        target, draft = ensure_named_model(PAIR_TARGET), ensure_named_model(PAIR_DRAFT)
    except ModelError as exc:
        if str(exc).startswith("Could not download"):
            pytest.skip(str(exc))
        raise
    survives(target, draft)
    engine = llamacpp_engine("llama.cpp Qwen2.5-Coder Q4_K_M pair", target, draft, copy_text=PAIR_COPY_PROMPT)
    yield engine
    engine.close()


def transformers_smol() -> Iterator[Engine]:
    from engine.backends.transformers import TransformersBackend
    from engine.models import ensure_embedded_model

    folder = ensure_embedded_model()
    ngram = TransformersBackend(folder, draft="ngram", max_context=2048)
    ngram.load()
    with_draft = TransformersBackend(folder, draft=str(folder), max_context=2048)
    with_draft.load()
    plant(ngram, with_draft)
    yield Engine("transformers SmolLM2", ngram, with_draft, MAX_DRAFT_LENGTH + 1)
    ngram.close()
    with_draft.close()


ENGINES = {
    "llamacpp-f16": embedded_f16,
    "llamacpp-q4_1": embedded_q4_1,
    "llamacpp-gemma3-swa": gemma3_swa,
    "llamacpp-qwen-pair": qwen_pair,
    "transformers": transformers_smol,
}


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request) -> Iterator[Engine]:
    pytest.importorskip("llama_cpp")
    yield from ENGINES[request.param]()


def share_the_prompts_cache(source, dest, ids: list[int]) -> None:
    """`dest`'s target holds the keys and values of `ids` as `source`'s target computed them: one prefill of the
    prompt for both backends of an engine (the same GGUF, cache type, context and thread count, one build), copied
    with llama.cpp's sequence state (llama_state_seq_get_data / set_data). The draft backend's own prefill of the
    prompt was the same computation again: on the Qwen pair's 1.5B ~65 s on a worker's one core, 10-20% of the
    module. Checked: the next token's logits after the copy equal the source's, bit for bit."""
    import ctypes

    import numpy as np

    lib, src, dst = source._lib, source.target, dest.target
    assert src.memory is None and dst.memory is None and src.mtp is None, "attention-only caches copy so"
    src.prefill(ids[:-1])
    size = lib.llama_state_seq_get_size(src.ctx.ctx, 0)
    state = (ctypes.c_uint8 * size)()
    assert lib.llama_state_seq_get_data(src.ctx.ctx, state, size, 0) == size
    dst.clear()
    assert lib.llama_state_seq_set_data(dst.ctx.ctx, state, size, 0) == size
    dst.ids = list(ids[:-1])
    expected, copied = src.decode(ids[-1:], outputs=1), dst.decode(ids[-1:], outputs=1)
    assert np.array_equal(expected, copied), "the copied cache reads as the source's"
    src.crop(len(ids) - 1)
    dst.crop(len(ids) - 1)


@pytest.fixture(scope="module")
def copy_prompt(engine: Engine) -> list[int]:
    ids = engine.ngram.encode_chat([{"role": "user", "content": engine.copy_text}])
    assert len(ids) >= 600, "the prompt copies 600+ tokens (past 512 cached positions)"
    if engine.draft is not None and engine.name.startswith("llama.cpp"):
        share_the_prompts_cache(engine.ngram, engine.draft, ids)
    return ids


# A reply that copies this many tokens of the prompt in one run gives long-match rounds room to draft past K.
LONG_COPY = 32
# A copied run long enough for long-match mode's room to double past 16 drafts: rounds of 4, 8 and 16 drafts taken
# whole (31 tokens with each round's own), after the match reached LONG_MATCH, then a longer round.
LONG_STREAK = 48


def longest_copied_run(reply: list[int], prompt: list[int]) -> int:
    """The longest run of `reply` that stands in `prompt` as it is."""
    best, previous = 0, [0] * (len(prompt) + 1)
    for token in reply:
        current = [0] * (len(prompt) + 1)
        for j, other in enumerate(prompt, start=1):
            if token == other:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def budget_for(engine: Engine) -> int:
    """Reply length: the pair's 1.5B decodes ~20 tokens/s on 2 cores, so its replies are kept short."""
    return 48 if engine.name.endswith("pair") or engine.name.startswith("transformers") else 160


# Plain replies already decoded, by engine, prompt, context size and sampler: plain decoding is what every test
# compares with, and the same reference was decoded up to six times per engine (a third of the module's time).
_plain: dict[tuple, list[int]] = {}


def reference(engine: Engine, prompt: list[int], budget: int, **sampler) -> list[int]:
    """The plain reply (n-gram backend, K 0). Decoded once per (engine, prompt, context, sampler, budget); a greedy
    one for a smaller budget is the head of a longer one already decoded (greedy steps do not look at the budget)."""
    sampler = sampler or GREEDY
    key = (engine.name, tuple(prompt), engine.ngram.max_context, tuple(sorted(sampler.items())))
    if (key, budget) not in _plain and sampler == GREEDY:
        longer = [tokens for (k, b), tokens in _plain.items() if k == key and b > budget]
        if longer:
            _plain[(key, budget)] = longer[0][:budget]
    if (key, budget) not in _plain:
        _plain[(key, budget)] = run(engine.ngram, prompt, 0, budget, mode="fixed", **sampler).tokens
    return _plain[(key, budget)]


def check(engine: Engine, spec: Run, plain: list[int]) -> None:
    assert spec.tokens == plain, f"{engine.name}: speculative output differs from plain decoding"
    assert max(spec.widths) <= engine.widest, "a verify pass wider than the probe proved"
    for chunk in spec.chunks:
        assert 0 <= chunk.accepted <= chunk.drafted and len(chunk.origins) == len(chunk.token_ids)


@pytest.mark.parametrize("sampler", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_ngram_with_adaptive_k_and_long_match_equals_plain(engine: Engine, copy_prompt, sampler) -> None:
    budget = budget_for(engine)
    plain = reference(engine, copy_prompt, budget, **sampler)
    k = 4
    spec = run(engine.ngram, copy_prompt, k, budget, **sampler)
    check(engine, spec, plain)
    assert spec.drafted_by("ngram") > 0
    copied = longest_copied_run(plain, copy_prompt)
    if engine.name == "llama.cpp F16" and sampler is GREEDY:
        assert copied >= LONG_COPY, "the F16 model's greedy reply copies the prompt's code"
    # Where the greedy reply copies a long run of the prompt (which model does depends on its kernels' rounding:
    # Gemma 3's repacked Q4_K reply lists the steps instead), long-match rounds draft past K; where the run is
    # long enough for the room to double from K to 32 (rounds of 4, 8 and 16 drafts all taken), past 16 too, up to
    # the widest proven pass. (On an AVX2 Zen 1 the Q4_1 model's longest copy is 39 tokens, broken up so that no
    # round of 16 drafts was all taken: its widest round was 17.)
    if sampler is GREEDY and engine.widest > 17 and "pair" not in engine.name and copied >= LONG_COPY:
        assert max(spec.widths) > k + 1, spec.widths
        assert any(note.startswith("long-match mode:") for note in spec.done.notes)
        if copied >= LONG_STREAK:
            assert max(spec.widths) > 17, spec.widths


@pytest.mark.parametrize("sampler", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_a_draft_model_fixed_and_adaptive_with_lookup_beside_it_equals_plain(
    engine: Engine, copy_prompt, mode: str, sampler
) -> None:
    if engine.draft is None:
        pytest.skip(f"{engine.name}: no draft model of the same vocabulary")
    budget = budget_for(engine)
    plain = reference(engine, copy_prompt, budget, **sampler)
    spec = run(engine.draft, copy_prompt, 4, budget, mode=mode, **sampler)
    check(engine, spec, plain)
    assert spec.drafted_by("model") > 0, "the draft model drafted"
    if mode == "adaptive" and sampler is GREEDY and "pair" not in engine.name:
        assert spec.drafted_by("ngram") > 0, "lookup drafted beside the draft model (the combined drafter)"


@pytest.mark.parametrize("budget", [1, 2, 5, 23])
def test_the_token_budget_cuts_long_drafts_short_exactly(engine: Engine, copy_prompt, budget: int) -> None:
    plain = reference(engine, copy_prompt, budget)
    for backend in (engine.ngram, engine.draft):
        if backend is None:
            continue
        spec = run(backend, copy_prompt, 4, budget)
        check(engine, spec, plain)
        assert len(spec.tokens) <= budget and max(spec.widths) <= budget


def test_near_the_end_of_the_context_drafts_stop_at_the_edge_exactly(engine: Engine, copy_prompt) -> None:
    room = 37
    edge = len(copy_prompt) + room
    backends = [b for b in (engine.ngram, engine.draft) if b is not None]
    full = [b.max_context for b in backends]
    for backend in backends:
        backend.max_context = edge  # the loop reads it per reply
    try:
        plain = reference(engine, copy_prompt, 400)
        assert len(plain) <= room
        for backend in backends:
            spec = run(backend, copy_prompt, 4, 400)
            check(engine, spec, plain)
            assert spec.done.stop_reason in ("context", "end_of_turn", "eos")
    finally:
        for backend, size in zip(backends, full, strict=True):
            backend.max_context = size


def test_two_turns_on_one_cache_equal_plain(engine: Engine, copy_prompt) -> None:
    """The second turn reuses the first one's cache (prefix reuse), after long rounds and rejected drafts."""
    budget = 48
    for backend in (engine.ngram, engine.draft):
        if backend is None:
            continue
        first = run(backend, copy_prompt, 4, budget)
        history = [
            {"role": "user", "content": engine.copy_text},
            {"role": "assistant", "content": backend.decode(first.tokens)},
            {"role": "user", "content": "Now repeat the first three functions again."},
        ]
        second_prompt = backend.encode_chat(history)
        spec = run(backend, second_prompt, 4, budget)
        engine.ngram.target.crop(0)  # the reference from a cold cache
        plain = reference(engine, second_prompt, budget)
        check(engine, spec, plain)
