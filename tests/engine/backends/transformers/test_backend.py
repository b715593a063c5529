"""The transformers backend on real models: exact speculative decoding, chunk accounting, stops, caches, errors."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch

from engine.backends.base import Backend
from engine.backends.transformers import TransformersBackend
from engine.backends.transformers.cache import INITIAL_CAPACITY, Int8Layer, SpecCache, full_precision_bytes
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings
from tests.support.replies import Reply, generate

PROMPTS = (
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "List three colors, one per line, then list them again in the same order.",
)


def hf_greedy(backend: TransformersBackend, prompt_ids: list[int], max_new: int) -> list[int]:
    """transformers' own greedy decoding, the reference every variant must equal token for token."""
    stop = sorted(backend.stop_token_ids)
    with torch.inference_mode():
        out = backend.model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            repetition_penalty=1.0,
            eos_token_id=stop,
            pad_token_id=stop[0],
        )
    new = out[0, len(prompt_ids) :].tolist()
    return new[:-1] if new and new[-1] in stop else new


def chat(backend: TransformersBackend, text: str) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": text}])


def assert_round_accounting(reply: Reply) -> None:
    for i, chunk in enumerate(reply.chunks):
        assert len(chunk.origins) == len(chunk.token_ids)
        assert 0 <= chunk.accepted <= chunk.drafted
        if i < len(reply.chunks) - 1:  # every round but a stopped one emits accepted + 1
            assert len(chunk.token_ids) == chunk.accepted + 1
            assert chunk.origins == (True,) * chunk.accepted + (False,)
        else:
            assert sum(chunk.origins) == chunk.accepted
            assert len(chunk.token_ids) <= chunk.accepted + 1


# --- errors (no model is loaded) -----------------------------------------------------------------------


def test_missing_folder_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="model folder not found: .*nowhere") as info:
        TransformersBackend(tmp_path / "nowhere").load()
    assert "\n" not in str(info.value)


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(BackendError, match="has no config.json"):
        TransformersBackend(tmp_path).load()


@pytest.mark.slow
def test_folder_without_tokenizer_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy2(tiny_model_dir / name, folder / name)
    with pytest.raises(BackendError, match="has no tokenizer"):
        TransformersBackend(folder).load()


def test_missing_draft_folder_is_named(tiny_model_dir_path_or_tmp: Path) -> None:
    with pytest.raises(BackendError, match="draft model folder not found"):
        TransformersBackend(tiny_model_dir_path_or_tmp, draft="/no/such/draft").load()


@pytest.fixture
def tiny_model_dir_path_or_tmp(tmp_path: Path) -> Path:
    """A folder that passes the target's file checks without loading anything (the draft check comes first)."""
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    return tmp_path


@pytest.mark.slow
def test_incompatible_draft_vocabulary_names_the_rule(
    tiny_model_dir: Path, tiny_model_dir_other_vocab: Path
) -> None:
    backend = TransformersBackend(tiny_model_dir, draft=str(tiny_model_dir_other_vocab))
    with pytest.raises(BackendError, match="vocabulary size differs") as info:
        backend.load()
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_generate_before_load_is_an_error(tiny_model_dir: Path) -> None:
    with pytest.raises(BackendError, match="not loaded"):
        TransformersBackend(tiny_model_dir).encode_chat([{"role": "user", "content": "hi"}])


# --- tiny random model: fast, peaked logits, loops a lot (n-gram drafts get accepted) -------------------


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(tiny_model_dir, draft="ngram", cache_mode="fp16")
    stages: list[str] = []
    backend.load(lambda stage, fraction: stages.append(stage))
    assert stages[-1] == "ready"
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def tiny_self_draft(tiny_model_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(
        tiny_model_dir, draft=str(tiny_model_dir), cache_mode="fp16", draft_cache_mode="fp16"
    )
    backend.load()
    yield backend
    backend.close()


@pytest.mark.slow
def test_backend_satisfies_the_protocol_and_reports_itself(tiny: TransformersBackend) -> None:
    assert isinstance(tiny, Backend)
    info = tiny.info
    assert (info.backend, info.device, info.cache_mode, info.draft_mode) == (
        "transformers",
        "cpu",
        "fp32",  # the full-precision cache holds the model's dtype, and says so
        "ngram",
    )
    assert info.max_context == 8192
    assert 2 in tiny.stop_token_ids  # <|im_end|>: EOS and the template's end of turn
    assert tiny.end_of_turn_id == 2


@pytest.mark.slow
def test_q6_and_q4_fall_back_to_q8_with_a_note(tiny_model_dir: Path) -> None:
    backend = TransformersBackend(
        tiny_model_dir, draft="none", cache_mode="q4", draft_cache_mode="q6", max_context=512
    )
    backend.load()
    assert backend.info.cache_mode == "q8"
    assert backend.info.max_context == 512
    assert backend.info.draft_mode == "none"
    assert any("q4" in note and "q8" in note for note in backend.info.notes)


@pytest.mark.slow
def test_encode_chat_renders_the_template_once(tiny: TransformersBackend) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    ids = tiny.encode_chat(messages)
    text = tiny.template.render(messages)
    assert ids == tiny.tokenizer.encode(text, add_special_tokens=False)
    start = tiny.tokenizer.convert_tokens_to_ids("<|im_start|>")
    # One token per marker in the rendered text (SmolLM2 adds a default system turn): nothing doubled.
    assert ids.count(start) == text.count("<|im_start|>") >= 2
    assert ids[0] == start
    assert tiny.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_tiny_greedy_is_identical_plain_ngram_and_draft_model(
    tiny: TransformersBackend, tiny_self_draft: TransformersBackend, prompt: str
) -> None:
    ids = chat(tiny, prompt)
    reference = hf_greedy(tiny, ids, 40)
    assert generate(tiny, ids, k=0, max_new=40).tokens == reference
    for k in (1, 3, 6):
        ngram = generate(tiny, ids, k=k, max_new=40)
        assert ngram.tokens == reference, f"ngram K={k}"
        assert_round_accounting(ngram)
        drafted = generate(tiny_self_draft, ids, k=k, max_new=40)
        assert drafted.tokens == reference, f"draft model K={k}"
        assert_round_accounting(drafted)
        # The model drafting for itself agrees with itself: every draft is accepted.
        assert drafted.accepted == drafted.drafted > 0


@pytest.mark.slow
def test_chunk_accounting_and_origins(tiny_self_draft: TransformersBackend) -> None:
    # The model drafts for itself greedily while the target samples at temperature 1: some rounds accept
    # everything, some reject at once, some in between.
    ids = chat(tiny_self_draft, PROMPTS[2])
    reply = generate(tiny_self_draft, ids, k=5, max_new=64, temperature=1.0, top_k=3, seed=3)
    assert_round_accounting(reply)
    accepted_per_round = {c.accepted for c in reply.chunks if c.drafted}
    assert 0 in accepted_per_round and len(accepted_per_round) >= 3
    assert len(reply.tokens) == 64
    assert sum(c.accepted + 1 for c in reply.chunks) == 64  # no stop token inside: nothing truncated
    assert all(c.t <= d.t for c, d in zip(reply.chunks, reply.chunks[1:], strict=False))
    assert all(c.temperature == 1.0 for c in reply.chunks)
    assert reply.done.stop_reason == "max_new_tokens"
    assert reply.done.target_step_s > 0 and reply.done.prefill_s >= 0
    assert reply.done.prompt_tokens == len(ids)
    # Same seed without drafting: the same tokens (one random number per reply position).
    assert (
        generate(tiny_self_draft, ids, k=0, max_new=64, temperature=1.0, top_k=3, seed=3).tokens
        == reply.tokens
    )


@pytest.mark.slow
@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_is_exact(
    tiny: TransformersBackend, tiny_self_draft: TransformersBackend, max_new: int
) -> None:
    ids = chat(tiny, PROMPTS[2])
    reply = generate(tiny_self_draft, ids, k=6, max_new=max_new)
    assert len(reply.tokens) == max_new
    assert reply.done.stop_reason == "max_new_tokens"
    assert reply.tokens == hf_greedy(tiny, ids, 40)[:max_new]


@pytest.mark.slow
def test_cancel_stops_within_a_round(tiny: TransformersBackend) -> None:
    ids = chat(tiny, PROMPTS[0])
    reply = generate(tiny, ids, k=4, max_new=64, cancel_after=2)
    assert len(reply.chunks) == 2
    assert reply.done.stop_reason == "cancelled"
    request = GenerationRequest(prompt_ids=tuple(ids), sampler=SamplerSettings(), max_new_tokens=8)
    cancelled = threading.Event()
    cancelled.set()
    events = list(tiny.generate(request, cancelled))
    assert len(events) == 1 and events[0].stop_reason == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 4])
def test_stop_token_ends_the_reply_without_its_text(tiny: TransformersBackend, k: int, monkeypatch) -> None:
    ids = chat(tiny, PROMPTS[0])
    reference = hf_greedy(tiny, ids, 40)
    stop_at = 9
    stop_token = reference[stop_at]
    first = reference.index(stop_token)
    monkeypatch.setattr(tiny, "stop_token_ids", frozenset({stop_token}))
    monkeypatch.setattr(tiny, "end_of_turn_id", stop_token)
    reply = generate(tiny, ids, k=k, max_new=40)
    assert reply.tokens == reference[:first]
    assert reply.done.stop_reason == "end_of_turn"
    assert reply.text == tiny.tokenizer.decode(reference[:first], skip_special_tokens=True)
    assert_round_accounting(reply)
    monkeypatch.setattr(tiny, "end_of_turn_id", None)
    assert generate(tiny, ids, k=k, max_new=40).done.stop_reason == "eos"


@pytest.mark.slow
def test_context_full_stops_with_context(tiny_model_dir: Path) -> None:
    probe = TransformersBackend(tiny_model_dir, draft="ngram", cache_mode="fp16", max_context=64)
    probe.load()
    ids = chat(probe, PROMPTS[0])
    probe_max = len(ids) + 10
    backend = TransformersBackend(tiny_model_dir, draft="ngram", cache_mode="fp16", max_context=probe_max)
    backend.load()
    reply = generate(backend, ids, k=5, max_new=50)
    assert reply.done.stop_reason == "context"
    assert len(reply.tokens) == 10
    assert reply.tokens == hf_greedy(backend, ids, 10)
    assert list(
        backend.generate(GenerationRequest(tuple(ids * 3), SamplerSettings(), 5), threading.Event())
    ) == [Done("context", prompt_tokens=len(ids) * 3)]


@pytest.mark.slow
def test_prefix_reuse_between_replies_is_exact(tiny: TransformersBackend, tiny_model_dir: Path) -> None:
    first_ids = chat(tiny, PROMPTS[1])
    first = generate(tiny, first_ids, k=4, max_new=12)
    follow_up = first_ids + first.tokens + tiny.encode_chat([{"role": "user", "content": "And then?"}])[1:]
    second = generate(tiny, follow_up, k=4, max_new=20)
    assert second.done.cached_tokens >= len(first_ids)
    assert second.tokens == hf_greedy(tiny, follow_up, 20)
    # A different conversation shares only the template's opening tokens.
    third = generate(tiny, chat(tiny, "Completely different."), k=4, max_new=4)
    assert third.done.cached_tokens < len(first_ids)


@pytest.mark.slow
def test_text_deltas_add_up_to_the_decoded_reply(tiny: TransformersBackend) -> None:
    for prompt in PROMPTS:
        reply = generate(tiny, chat(tiny, prompt), k=3, max_new=48, temperature=1.0, seed=7)
        assert reply.text == tiny.tokenizer.decode(reply.tokens, skip_special_tokens=True)
        # A half character is held back: no delta but a final one ends in the replacement character.
        assert not any(c.text.endswith("\ufffd") for c in reply.chunks[:-1])


@pytest.mark.slow
def test_draft_model_step_time_is_measured(tiny_self_draft: TransformersBackend) -> None:
    reply = generate(tiny_self_draft, chat(tiny_self_draft, PROMPTS[0]), k=4, max_new=16)
    assert reply.done.draft_step_s > 0
    assert reply.done.target_step_s > 0
    assert tiny_self_draft.info.draft_mode == "model"


# --- the int8 cache --------------------------------------------------------------------------------------


def test_int8_layer_round_trip_error_is_within_half_a_step() -> None:
    torch.manual_seed(0)
    layer = Int8Layer()
    states = torch.randn(1, 3, 10, 64) * 4
    keys, values = layer.update(states, states * 2)
    _, scales = Int8Layer.quantize(states)
    assert (keys - states).abs().max() <= (scales / 2 + 1e-6).max()
    assert torch.all((keys - states).abs() <= scales / 2 + 1e-6)
    assert torch.allclose(values, states * 2, atol=float((scales * 2).max()))


def test_int8_layer_crops_and_grows_without_losing_positions() -> None:
    torch.manual_seed(1)
    layer = Int8Layer()
    first = torch.randn(1, 2, INITIAL_CAPACITY - 3, 8)
    keys, _ = layer.update(first, first)
    layer.crop(-5)
    assert layer.get_seq_length() == INITIAL_CAPACITY - 8
    more = torch.randn(1, 2, 20, 8)  # crosses the initial capacity: the buffer doubles
    keys2, _ = layer.update(more, more)
    assert keys2.shape[-2] == INITIAL_CAPACITY + 12
    assert torch.equal(keys2[:, :, : INITIAL_CAPACITY - 8], keys[:, :, : INITIAL_CAPACITY - 8])
    assert layer.storage_bytes(used_only=False) == 2 * (2 * INITIAL_CAPACITY * 2) * (8 + 4)
    with pytest.raises(ValueError):
        layer.crop(3)


@pytest.mark.slow
def test_q8_cache_is_smaller_rolls_back_and_mostly_agrees(
    tiny_model_dir: Path, tiny: TransformersBackend
) -> None:
    q8 = TransformersBackend(
        tiny_model_dir, draft=str(tiny_model_dir), cache_mode="q8", draft_cache_mode="q8"
    )
    q8.load()
    assert (q8.info.cache_mode, q8.info.draft_cache_mode) == ("q8", "q8")
    agree = total = 0
    for prompt in PROMPTS:
        ids = chat(q8, prompt)
        # At temperature 1 the greedy self-draft is often rejected: both caches roll back many times.
        plain = generate(q8, ids, k=0, max_new=32, temperature=1.0, top_k=3, seed=5)
        drafted = generate(q8, ids, k=5, max_new=32, temperature=1.0, top_k=3, seed=5)
        assert any(c.accepted < c.drafted for c in drafted.chunks)
        # Tokens are quantized before use, so speculative and plain agree on the q8 cache too.
        assert drafted.tokens == plain.tokens
        assert_round_accounting(drafted)
        greedy = generate(q8, ids, k=0, max_new=32).tokens
        full = generate(tiny, ids, k=0, max_new=32).tokens
        agree += sum(a == b for a, b in zip(greedy, full, strict=False))
        total += len(full)
    assert agree / total >= 0.5, f"q8 greedy agreed on only {agree}/{total} tokens with full precision"
    cache = q8.target.cache
    assert isinstance(cache, SpecCache) and cache.mode == "q8"
    used = cache.storage_bytes()
    assert used > 0
    head_dim = q8.model.config.hidden_size // q8.model.config.num_attention_heads
    # Per position and head: head_dim int8 values and one float32 scale, against head_dim floats.
    assert full_precision_bytes(cache, torch.float32) / used == pytest.approx(4 * head_dim / (head_dim + 4))
    assert full_precision_bytes(cache, torch.float16) / used == pytest.approx(2 * head_dim / (head_dim + 4))


# --- SmolLM2-135M: the real embedded model ---------------------------------------------------------------

SMOL_CASES = (
    # (prompt, max_new_tokens)
    ("Write a Python function that reverses a string, then show how to call it.", 48),
    ("Write a Python class with methods add, subtract, multiply and divide, each with a docstring.", 40),
    ("Explain in one sentence why the sky is blue.", 24),
)


@pytest.fixture(scope="module")
def smol_ngram(smol_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(smol_dir, draft="ngram", cache_mode="fp16")
    backend.load()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def smol_tiny_draft(smol_dir: Path, tiny_model_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(
        smol_dir, draft=str(tiny_model_dir), cache_mode="fp16", draft_cache_mode="fp16"
    )
    backend.load()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def smol_self_draft(smol_dir: Path) -> TransformersBackend:
    backend = TransformersBackend(smol_dir, draft=str(smol_dir), cache_mode="fp16", draft_cache_mode="fp16")
    backend.load()
    yield backend
    backend.close()


@pytest.mark.slow
@pytest.mark.parametrize(("prompt", "max_new"), SMOL_CASES)
def test_smol_greedy_is_identical_with_every_drafter(
    smol_ngram: TransformersBackend,
    smol_tiny_draft: TransformersBackend,
    smol_self_draft: TransformersBackend,
    prompt: str,
    max_new: int,
) -> None:
    ids = chat(smol_ngram, prompt)
    reference = hf_greedy(smol_ngram, ids, max_new)
    assert len(reference) >= min(max_new, 12)
    plain = generate(smol_ngram, ids, k=0, max_new=max_new)
    assert plain.tokens == reference
    assert (plain.drafted, plain.accepted) == (0, 0)
    ngram = generate(smol_ngram, ids, k=5, max_new=max_new)
    assert ngram.tokens == reference
    assert_round_accounting(ngram)
    # A random tiny draft is almost always wrong, and must still not change a single token.
    tiny_drafted = generate(smol_tiny_draft, ids, k=4, max_new=max_new)
    assert tiny_drafted.tokens == reference
    assert tiny_drafted.drafted > 0 and tiny_drafted.accepted / tiny_drafted.drafted < 0.5
    assert_round_accounting(tiny_drafted)
    # SmolLM2 drafting for itself: all but float noise accepted.
    self_drafted = generate(smol_self_draft, ids, k=4, max_new=max_new)
    assert self_drafted.tokens == reference
    assert self_drafted.accepted / self_drafted.drafted >= 0.9
    assert plain.text == ngram.text == self_drafted.text == smol_ngram.decode(reference)


@pytest.mark.slow
def test_smol_ngram_drafts_pay_off_where_the_reply_repeats(smol_ngram: TransformersBackend) -> None:
    # The class repeats its method boilerplate ('def __init__(self, num1, num2):', docstring quotes).
    ids = chat(
        smol_ngram,
        "Write a Python class with methods add, subtract, multiply and divide, each with a docstring.",
    )
    reply = generate(smol_ngram, ids, k=5, max_new=64)
    assert reply.accepted >= 6
    assert len(reply.chunks) < len(reply.tokens)  # fewer verification rounds than tokens


@pytest.mark.slow
def test_smol_stops_at_end_of_turn_without_its_text(smol_ngram: TransformersBackend) -> None:
    ids = chat(smol_ngram, "What is the capital of France? Answer in one short sentence.")
    reply = generate(smol_ngram, ids, k=4, max_new=64)
    assert reply.done.stop_reason == "end_of_turn"
    assert len(reply.tokens) < 64
    assert "Paris" in reply.text
    assert "<|im_end|>" not in reply.text and 2 not in reply.tokens
    assert reply.tokens == hf_greedy(smol_ngram, ids, 64)


@pytest.mark.slow
def test_one_reply_at_a_time_and_resumable_from_another_thread(tiny: TransformersBackend) -> None:
    ids = chat(tiny, PROMPTS[0])
    request = GenerationRequest(tuple(ids), SamplerSettings(), max_new_tokens=12, num_draft_tokens=3)
    stream = tiny.generate(request, threading.Event())
    first = next(stream)
    with pytest.raises(BackendError, match="already being generated"):
        next(tiny.generate(request, threading.Event()))
    rest: list = []
    worker = threading.Thread(target=lambda: rest.extend(stream))
    worker.start()
    worker.join()
    tokens = list(first.token_ids) + [t for e in rest if isinstance(e, Chunk) for t in e.token_ids]
    assert tokens == hf_greedy(tiny, ids, 12)
    assert isinstance(rest[-1], Done)
    abandoned = tiny.generate(request, threading.Event())
    next(abandoned)
    abandoned.close()  # a consumer that stops early frees the backend
    assert generate(tiny, ids, k=3, max_new=12).tokens == tokens
