"""The ExLlamaV2 backend against a faithful, scripted stand-in of exllamav2 0.3.2's API (tests/exl2_standin).

CUDA is the one boundary that cannot run here: the stand-in mirrors the real generator's constructor checks,
result dicts, live draft counters, K buffer and stop rules, and scripts the tokens and the per-round acceptance,
so every number below is known in advance. `scripts/gpu_check.sh` runs the same backend on the real thing.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.backends.exllamav2 import (
    MAX_DRAFT_TOKENS,
    ExLlamaV2Backend,
    import_exllamav2,
    ntk_alpha,
    probe_exllamav2,
    round_up_to_page,
)
from engine.backends.exllamav2.sampling import build_sampler_settings, sampler_fields
from engine.backends.held_rounds import round_origins, stop_reason_of
from engine.decoding.acceptance import AcceptanceAccounting
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings
from tests.support import paths

STANDIN = paths.EXL2_STANDIN
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
MESSAGES = [{"role": "user", "content": "Write a haiku about caches."}]
IM_END = 2  # SmolLM2's <|im_end|>
ENDOFTEXT = 0  # SmolLM2's <|endoftext|>


# ------------------------------------------------------------------------------------------------ fixtures


def _forget_exllamav2() -> None:
    for name in list(sys.modules):
        if name == "exllamav2" or name.startswith("exllamav2."):
            del sys.modules[name]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    """The stand-in package imported as `exllamav2` for one test, forgotten afterwards."""
    _forget_exllamav2()
    monkeypatch.syspath_prepend(str(STANDIN))
    import exllamav2
    import exllamav2.attn
    import exllamav2.generator

    assert "exl2_standin" in exllamav2.__file__
    exllamav2.standin.LOAD_LOG.clear()
    yield exllamav2
    _forget_exllamav2()


@pytest.fixture(scope="module")
def reply_ids(smol_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    text = "Keys stay warm in pages, prefixes reused again, drafts fly ahead fast."
    return tok.encode(text, add_special_tokens=False).ids


@pytest.fixture
def make_model(smol_dir: Path, tmp_path: Path):
    """A model folder the stand-in loads: SmolLM2's tokenizer and template, a small config, a scripted reply."""

    def make(
        name: str,
        script: dict | None = None,
        *,
        eos_token_id: int = IM_END,
        max_positions: int = 8192,
        weights: bool = True,
        swap_ids: tuple[int, int] | None = None,
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for file_name in TOKENIZER_FILES:
            if (smol_dir / file_name).is_file():
                shutil.copy(smol_dir / file_name, folder / file_name)
        if swap_ids is not None:  # a draft whose vocabulary gives two tokens each other's ids
            tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
            vocab = tok["model"]["vocab"]
            by_id = {i: t for t, i in vocab.items()}
            a, b = (by_id[i] for i in swap_ids)
            vocab[a], vocab[b] = vocab[b], vocab[a]
            (folder / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
        config = {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 49152,
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": max_positions,
            "bos_token_id": 1,
            "eos_token_id": eos_token_id,
            "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        }
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        if weights:
            (folder / "model.safetensors").write_bytes(b"")
        (folder / "standin.json").write_text(json.dumps(script or {}), encoding="utf-8")
        return folder

    return make


def loaded(folder: Path, **kwargs) -> ExLlamaV2Backend:
    backend = ExLlamaV2Backend(folder, **kwargs)
    backend.load()
    return backend


def request_for(backend: ExLlamaV2Backend, k: int, max_new_tokens: int = 64, **sampler) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(backend.encode_chat(MESSAGES)),
        sampler=SamplerSettings(**sampler),
        max_new_tokens=max_new_tokens,
        num_draft_tokens=k,
    )


def run(backend: ExLlamaV2Backend, request: GenerationRequest) -> tuple[list[Chunk], Done]:
    events = list(backend.generate(request, threading.Event()))
    assert isinstance(events[-1], Done) and all(isinstance(e, Chunk) for e in events[:-1])
    return events[:-1], events[-1]  # type: ignore[return-value]


def expected_rounds(n_tokens: int, k: int, schedule: list[int]) -> list[tuple[int, int, int]]:
    """(emitted, drafted, accepted) per round for a reply of n_tokens followed by a stop token."""
    rounds, position, r = [], 0, 0
    while True:
        accept = min(schedule[r % len(schedule)], k)
        r += 1
        left = n_tokens - position  # tokens before the stop token
        if accept >= left:
            # The stop token comes up inside this round: the drafts before it count, the rest are neither side.
            if left:  # a round that only sampled the stop token drafted nothing and yields no Chunk
                rounds.append((left, left, left))
            return rounds
        rounds.append((accept + 1, k, accept))
        position += accept + 1


# --------------------------------------------------------------------------------------------- pure parts


def test_pure_helpers():
    assert [round_up_to_page(n) for n in (1, 256, 257, 4096, 4097)] == [256, 256, 512, 4096, 4352]
    assert ntk_alpha(4096, 4096) == 1.0 and ntk_alpha(8192, 4096) == 1.0
    assert ntk_alpha(2048, 4096) == pytest.approx(-0.13436 + 0.80541 * 2 + 0.28833 * 4)
    assert round_origins(4, 3) == (True, True, True, False)
    assert round_origins(2, 3) == (True, True)  # a round cut short by the token limit
    assert stop_reason_of({"eos_reason": "stop_token", "eos_triggering_token_id": 0}, 0, 2) == "eos"
    assert stop_reason_of({"eos_reason": "stop_token", "eos_triggering_token_id": 2}, 0, 2) == "end_of_turn"
    assert stop_reason_of({"eos_reason": "stop_token", "eos_triggering_token_id": 2}, 2, 2) == "eos"
    assert stop_reason_of({"eos_reason": "max_new_tokens"}, 0, 2) == "max_new_tokens"
    assert stop_reason_of({"eos_reason": "stop_string"}, 0, 2) == "stop_string"


def test_a_k_above_the_cap_is_clamped_with_a_note_from_the_constructor(tmp_path):
    """The shared base keeps its notes before it clamps K (the engines once raised AttributeError here)."""
    backend = ExLlamaV2Backend(tmp_path, num_draft_tokens=MAX_DRAFT_TOKENS + 4)
    assert backend.num_draft_tokens == MAX_DRAFT_TOKENS
    assert backend.info.notes == (
        f"K is at most {MAX_DRAFT_TOKENS} with exllamav2 (max_q_size {MAX_DRAFT_TOKENS + 1}); asked 20",
    )


def test_preset_sampler_overrides_every_non_neutral_default(standin):
    defaults = standin.generator.ExLlamaV2Sampler.Settings()
    assert (defaults.token_repetition_penalty, defaults.top_k, defaults.top_p) == (1.025, 50, 0.8)
    preset = SamplerSettings(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)
    settings = build_sampler_settings(standin.generator.ExLlamaV2Sampler.Settings, preset, 0.0)
    assert settings.token_repetition_penalty == 1.0
    assert (settings.top_k, settings.top_p, settings.min_p, settings.temperature) == (0, 1.0, 0.0, 0.0)
    for name, value in sampler_fields(preset, 0.0).items():
        assert hasattr(defaults, name), f"{name} is not a field of ExLlamaV2Sampler.Settings"
        assert getattr(settings, name) == value


# ------------------------------------------------------------------------------------ loading and caches


def test_load_draft_first_caches_rounded_and_stretched_draft(standin, make_model):
    target = make_model("target")
    draft = make_model("draft", max_positions=512)
    stages: list[str] = []
    backend = ExLlamaV2Backend(
        target, draft=str(draft), cache_mode="q8", draft_cache_mode="q4", max_context=1000
    )
    backend.load(lambda stage, fraction: stages.append(stage))
    m = backend._m
    assert [str(draft), str(target)] == standin.standin.LOAD_LOG  # the draft loads first
    assert (
        type(m.cache).__name__ == "ExLlamaV2Cache_Q8" and type(m.draft_cache).__name__ == "ExLlamaV2Cache_Q4"
    )
    assert m.cache.max_seq_len == m.draft_cache.max_seq_len == 1024  # 1000 rounded up to a 256 multiple
    assert m.cache.lazy and m.draft_cache.lazy  # autosplit loading
    assert m.draft_model.config.max_seq_len == 1024
    assert m.draft_model.config.scale_alpha_value == pytest.approx(ntk_alpha(512, 1024))
    assert m.model.config.rotary_embedding_base == 100000.0  # read from transformers 5's rope_parameters
    assert m.generator.draft_model is m.draft_model and not m.generator.use_ngram_draft
    assert m.generator.paged is False  # the stand-in has no flash-attn, so the unpaged fallback
    assert backend.info.max_context == 1024 and backend.info.draft_mode == "model"
    assert any("NTK alpha" in note for note in backend.info.notes)
    assert "loading draft" in stages and stages[-1] == "ready"


def test_paged_when_flash_attn_and_manual_split(standin, make_model):
    standin.attn.has_flash_attn_with_paged = True
    backend = loaded(make_model("target"), draft="ngram", gpu_split=[20.0], cache_mode="fp16")
    m = backend._m
    assert m.generator.paged is True and m.generator.use_ngram_draft and m.generator.draft_model is None
    assert (
        type(m.cache).__name__ == "ExLlamaV2Cache" and not m.cache.lazy
    )  # built after model.load(gpu_split)


# ----------------------------------------------------------------------------------------- per reply


def test_reply_uses_preset_sampler_and_stops_on_end_of_turn(standin, make_model, reply_ids):
    # EOS (<|endoftext|>) and end-of-turn (<|im_end|>) differ here, so both stop conditions are visible.
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "end_of_turn"}, eos_token_id=ENDOFTEXT))
    request = request_for(
        backend, 4, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.0
    )
    chunks, done = run(backend, request)
    job = backend._m.generator.standin_jobs[-1]
    assert job.stop_tokens == {ENDOFTEXT, IM_END}
    settings = job.gen_settings
    assert (settings.temperature, settings.top_p, settings.top_k, settings.min_p) == (0.7, 0.9, 40, 0.05)
    assert settings.token_repetition_penalty == 1.0
    assert done.stop_reason == "end_of_turn"
    ids = [t for c in chunks for t in c.token_ids]
    assert ids == reply_ids  # the stop token itself is not part of the reply
    assert "".join(c.text for c in chunks) == backend.decode(reply_ids)
    assert done.prompt_tokens == len(request.prompt_ids)


def test_reply_stops_on_eos(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids[:5], "end": "eos"}, eos_token_id=ENDOFTEXT))
    chunks, done = run(backend, request_for(backend, 4))
    assert done.stop_reason == "eos"
    assert [t for c in chunks for t in c.token_ids] == reply_ids[:5]


@pytest.mark.parametrize("k", [0, 4])
def test_max_new_tokens_is_raised_by_k_and_the_reply_is_exact(standin, make_model, reply_ids, k):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none", "ngram_acceptance": [4, 1]}))
    chunks, done = run(backend, request_for(backend, k, max_new_tokens=10))
    job = backend._m.generator.standin_jobs[-1]
    assert job.max_new_tokens == 10 + k  # the job stops at max_new_tokens - K
    assert sum(len(c.token_ids) for c in chunks) == 10
    assert done.stop_reason == "max_new_tokens"


def test_context_limits_the_reply(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none"}), max_context=256)
    request = request_for(backend, 4, max_new_tokens=1000)
    chunks, done = run(backend, request)
    assert sum(len(c.token_ids) for c in chunks) == 256 - len(request.prompt_ids) - 4
    assert done.stop_reason == "context"


def test_live_and_final_acceptance_from_draft_counters(standin, make_model, reply_ids):
    schedule = [3, 0, 4, 1, 2]
    target = make_model("target", {"reply": reply_ids, "end": "eos"})
    draft = make_model("draft", {"draft_acceptance": schedule})
    backend = loaded(target, draft=str(draft))
    chunks, done = run(backend, request_for(backend, 4))
    job = backend._m.generator.standin_jobs[-1]

    expected = expected_rounds(len(reply_ids), 4, schedule)
    assert [(len(c.token_ids), c.drafted, c.accepted) for c in chunks] == expected
    for c in chunks:
        assert c.origins == (True,) * c.accepted + (False,) * (len(c.token_ids) - c.accepted)
    assert sum(c.accepted for c in chunks) == job.accepted_draft_tokens
    assert sum(c.drafted for c in chunks) == job.accepted_draft_tokens + job.rejected_draft_tokens
    assert done.stop_reason == "eos" and done.target_step_s > 0 and done.draft_step_s > 0

    accounting = AcceptanceAccounting(t_start=chunks[0].t - 0.01)
    for c in chunks:
        accounting.add(c)
        assert accounting.live.accepted <= accounting.live.drafted
    stats = accounting.finish(
        done, chunks[-1].t, preset="qa", num_draft_tokens=4, temperature=0.0, draft_mode="model",
        backend="exllamav2", model="target",
    )  # fmt: skip
    assert stats.new_tokens == len(reply_ids)
    assert stats.accepted_tokens == job.accepted_draft_tokens
    assert stats.rounds == len(expected)
    assert stats.acceptance_rate == pytest.approx(job.accepted_draft_tokens / stats.drafted_tokens)


def test_k_switches_between_replies_without_rebuilding(standin, make_model, reply_ids):
    target = make_model("target", {"reply": reply_ids, "end": "eos"})
    draft = make_model("draft", {"draft_acceptance": [8]})  # always right: each round drafts and keeps K
    backend = loaded(target, draft=str(draft), num_draft_tokens=4)
    m = backend._m
    generator_id, cache_id, draft_cache_id = id(m.generator), id(m.cache), id(m.draft_cache)

    chunks4, _ = run(backend, request_for(backend, 4))
    assert chunks4[0].drafted == 4 and chunks4[0].accepted == 4
    chunks2, done2 = run(backend, request_for(backend, 2))
    assert tuple(m.generator.draft_ids_pinned.shape) == (1, 2) and m.generator.num_draft_tokens == 2
    assert chunks2[0].drafted == 2 and len(chunks2[0].token_ids) == 3
    assert done2.cached_tokens == len(request_for(backend, 2).prompt_ids) - 1  # the prefix cache survived
    chunks0, _ = run(backend, request_for(backend, 0))
    assert all(c.drafted == 0 for c in chunks0)
    # One token per round; the round whose only sample is the stop token yields no Chunk (it drafted nothing).
    assert [len(c.token_ids) for c in chunks0] == [1] * len(reply_ids)
    chunks_big, _ = run(backend, request_for(backend, MAX_DRAFT_TOKENS + 5))
    assert chunks_big[0].drafted == MAX_DRAFT_TOKENS  # clamped to max_q_size - 1
    assert any("at most" in note for note in backend.info.notes)
    assert (id(m.generator), id(m.cache), id(m.draft_cache)) == (generator_id, cache_id, draft_cache_id)
    for chunks in (chunks4, chunks2, chunks0, chunks_big):
        assert [t for c in chunks for t in c.token_ids] == reply_ids  # same tokens whatever K


def test_ngram_drafting_turns_off_and_on(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "eos", "ngram_acceptance": [2]}))
    generator = backend._m.generator
    off, _ = run(backend, request_for(backend, 0))
    assert not generator.use_ngram_draft and all(c.drafted == 0 for c in off)
    on, _ = run(backend, request_for(backend, 3))
    assert generator.use_ngram_draft and generator.num_draft_tokens == 3
    assert on[0].drafted == 3 and on[0].accepted == 2
    none_backend = loaded(make_model("plain", {"reply": reply_ids, "end": "eos"}), draft="none")
    plain, _ = run(none_backend, request_for(none_backend, 4))
    assert all(c.drafted == 0 for c in plain) and none_backend._m.generator.num_draft_tokens == 0


def test_temperature_ramp_moves_between_rounds(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "eos", "ngram_acceptance": [3]}))
    sampler = dict(temperature=0.8, ramp_tokens=8, ramp_start=0.0)
    chunks, _ = run(backend, request_for(backend, 3, **sampler))
    ramp = SamplerSettings(**sampler)
    job = backend._m.generator.standin_jobs[-1]
    position = 0
    for c in chunks:
        assert c.temperature == pytest.approx(ramp.temperature_at(position))
        position += len(c.token_ids)
    # Every sampled token of a round used its round's temperature.
    by_position = {pos: temp for pos, temp, _ in job.standin_samples}
    assert by_position[0] == 0.0 and by_position[4] == pytest.approx(ramp.temperature_at(4))
    assert by_position[len(reply_ids) - 1] == pytest.approx(0.8)


def test_cancel_runs_on_the_iterate_thread(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none"}))
    cancel = threading.Event()
    events: list = []
    first_chunk = threading.Event()

    def consume() -> None:
        for event in backend.generate(request_for(backend, 4, max_new_tokens=500), cancel):
            events.append(event)
            first_chunk.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert first_chunk.wait(10)
    cancel.set()  # from this (the UI's) thread; the backend calls generator.cancel on the worker's
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "cancelled"
    assert sum(len(e.token_ids) for e in events[:-1]) < 500
    assert backend._m.generator.num_remaining_jobs() == 0
    # The stand-in is strict about the rule the backend follows: a cancel from another thread is refused.
    generator = backend._m.generator
    job = standin.generator.ExLlamaV2DynamicJob(
        input_ids=__import__("torch").tensor([[1, 2, 3]]), max_new_tokens=8
    )
    generator.enqueue(job)
    with pytest.raises(AssertionError, match="thread"):
        generator.cancel(job)


def test_closing_the_stream_early_cancels_the_job(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none"}))
    stream = backend.generate(request_for(backend, 2, max_new_tokens=200), threading.Event())
    next(stream)
    stream.close()
    assert backend._m.generator.num_remaining_jobs() == 0
    _, done = run(backend, request_for(backend, 2, max_new_tokens=5))  # the generator is usable again
    assert done.stop_reason == "max_new_tokens"


# ---------------------------------------------------------------------------------------------- errors


def test_folder_errors(standin, make_model, tmp_path):
    with pytest.raises(BackendError, match="not found"):
        loaded(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackendError, match="no config.json"):
        loaded(empty)
    gguf_only = make_model("gguf", weights=False)
    (gguf_only / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(
        BackendError, match=r"has no weights \(\*\.safetensors\) \(found \.gguf files\)"
    ) as info:
        loaded(gguf_only)
    assert "\n" not in str(info.value)


def test_vocab_mismatch_names_the_rule(standin, make_model):
    target = make_model("target")
    draft = make_model("draft", swap_ids=(200, 201))
    with pytest.raises(
        BackendError, match=r"^draft model draft cannot draft for target: token strings differ \(id 200 "
    ):
        loaded(target, draft=str(draft))
    other_eos = make_model("draft2", eos_token_id=ENDOFTEXT)
    with pytest.raises(BackendError, match="special token ids differ"):
        loaded(target, draft=str(other_eos))


def test_out_of_memory_says_what_to_lower(standin, make_model):
    draft = make_model("draft", {"oom_on_load": True})
    with pytest.raises(BackendError) as info:
        loaded(make_model("target"), draft=str(draft))
    message = str(info.value)
    assert message.startswith("out of memory loading draft model draft:")
    assert "max_context" in message and "q4" in message


def test_real_exllamav2_is_unusable_here(smol_dir):
    """The real package on the path: no CUDA here, so the probe says no and a named exllamav2 is an error."""
    from engine.backends.select import create_backend

    _forget_exllamav2()
    try:
        usable, reason = probe_exllamav2()
        assert not usable and reason
        with pytest.raises(
            BackendError, match=r"^exllamav2 is unusable here: .*; use --backend transformers$"
        ):
            import_exllamav2()  # compiling the extension fails (no CUDA_HOME) and is caught
        with pytest.raises(BackendError, match="^exllamav2 is unusable here: .*use --backend transformers"):
            create_backend(settings_for(smol_dir, "exllamav2"))
    finally:
        _forget_exllamav2()


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        # What torch's cpp_extension raises importing exllamav2 with a CUDA build of torch and no GPU.
        ("IndexError('list index out of range')", "IndexError: list index out of range"),
        ("OSError('CUDA_HOME environment variable is not set.')", "CUDA_HOME not set"),
        ("KeyError('sm_90')", "KeyError: 'sm_90'"),
        ("ValueError()", "ValueError"),
    ],
)
def test_any_import_failure_is_unusable_here_in_one_line(tmp_path, monkeypatch, smol_dir, raised, reason):
    """Whatever `import exllamav2` raises, the probe says "unusable here" with one line and auto falls back."""
    import torch

    from engine.backends.select import create_backend

    package = tmp_path / "broken" / "exllamav2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise {raised}\n", encoding="utf-8")
    _forget_exllamav2()
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # get past the GPU check to the import
    # Without the llama.cpp bindings (with them, auto runs the embedded model from its GGUF on llama.cpp).

    monkeypatch.setattr(
        "engine.backends.llamacpp.library.probe_llamacpp",
        lambda progress=None: (False, "llama-cpp-python is not installed"),
    )
    try:
        with pytest.raises(BackendError) as info:
            import_exllamav2()
        assert str(info.value) == f"exllamav2 is unusable here: {reason}; use --backend transformers"
        assert probe_exllamav2() == (False, reason)
        with pytest.raises(
            BackendError, match="^" + re.escape(f"exllamav2 is unusable here: {reason}; use --backend")
        ):
            create_backend(settings_for(smol_dir, "exllamav2"))
        if pytest.importorskip("engine.backends.transformers"):
            _, why = create_backend(settings_for(smol_dir, "auto"))
            # each engine passed over with its reason (exllamav3's depends on what is installed here)
            assert why.startswith(f"auto: exllamav2 unusable ({reason}); exllamav3 unusable (")
            assert why.endswith("; llama.cpp unusable (llama-cpp-python is not installed) -> transformers")
    finally:
        _forget_exllamav2()


def test_a_failing_cuda_query_is_unusable_here_too(monkeypatch):
    import torch

    def broken() -> bool:
        raise RuntimeError("Found no NVIDIA driver on your system.")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert probe_exllamav2() == (False, "RuntimeError: Found no NVIDIA driver on your system.")


def settings_for(model: Path, backend: str) -> SimpleNamespace:
    return SimpleNamespace(
        model=model, draft="ngram", backend=backend, cache_mode="q8", draft_cache_mode="q8", max_context=1024,
        gpu_split=None,
    )  # fmt: skip


def test_auto_falls_back_to_transformers(smol_dir, monkeypatch):
    hf = pytest.importorskip(
        "engine.backends.transformers", reason="engine/backends/transformers/backend.py is not written yet"
    )
    from engine.backends.select import create_backend

    # Without the llama.cpp bindings (with them, the embedded model runs from its GGUF on llama.cpp).
    monkeypatch.setattr(
        "engine.backends.llamacpp.library.probe_llamacpp",
        lambda progress=None: (False, "llama-cpp-python is not installed"),
    )
    _forget_exllamav2()
    try:
        backend, why = create_backend(settings_for(smol_dir, "auto"))
    finally:
        _forget_exllamav2()
    assert isinstance(backend, hf.TransformersBackend)
    assert why.startswith("auto: exllamav2 unusable (") and why.endswith("-> transformers")


# ------------------------------------------------------------------------- same meaning across backends


def stats_of(chunks: list[Chunk], done: Done, backend: str):
    accounting = AcceptanceAccounting(t_start=0.0)
    for c in chunks:
        accounting.add(c)
    return accounting.finish(
        done,
        1.0,
        preset="qa",
        num_draft_tokens=4,
        temperature=0.0,
        draft_mode="ngram",
        backend=backend,
        model="m",
    )


MEANING_FIELDS = (
    "new_tokens", "drafted_tokens", "accepted_tokens", "rounds", "acceptance_rate", "mean_accepted_length",
    "per_position_acceptance", "acceptance_histogram", "alpha",
)  # fmt: skip


def test_same_rounds_give_the_same_stats_as_the_scripted_backend(standin, make_model, reply_ids):
    """ScriptedBackend (engine/backends/scripted.py) and exl2 fed the same rounds agree on what the stats mean."""
    from engine.backends.scripted import ScriptedBackend

    schedule = [3, 0, 4, 1, 2, 4, 0]
    words = " ".join(f"w{i}" for i in range(len(reply_ids)))
    scripted = ScriptedBackend(words, accept_pattern=schedule)
    scripted.load()
    n = len(scripted.encode(words))
    assert n == len(reply_ids)
    exl2 = loaded(make_model("target", {"reply": reply_ids, "end": "none", "ngram_acceptance": schedule}))
    exl2_chunks, exl2_done = run(exl2, request_for(exl2, 4, max_new_tokens=n))
    request = GenerationRequest(
        prompt_ids=(1, 2, 3), sampler=SamplerSettings(), max_new_tokens=n, num_draft_tokens=4
    )
    ref_chunks, ref_done = run(scripted, request)

    shape = [(len(c.token_ids), c.accepted, c.origins) for c in exl2_chunks]
    assert shape == [(len(c.token_ids), c.accepted, c.origins) for c in ref_chunks]
    # Every round but the last drafts K in both; exl2's last round (cut by the token limit) counts only the
    # drafts it verified before the limit, the scripted backend counts K.
    assert [c.drafted for c in exl2_chunks[:-1]] == [c.drafted for c in ref_chunks[:-1]]
    assert exl2_done.stop_reason == ref_done.stop_reason == "max_new_tokens"
    ours, theirs = (
        stats_of(exl2_chunks[:-1], exl2_done, "exl2"),
        stats_of(ref_chunks[:-1], ref_done, "scripted"),
    )
    for name in MEANING_FIELDS:
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name)), name


@pytest.mark.slow
def test_same_rounds_give_the_same_stats_as_the_transformers_backend(standin, make_model, smol_dir):
    """Replay the transformers backend's real n-gram rounds through the stand-in and compare the stats."""
    hf = pytest.importorskip(
        "engine.backends.transformers", reason="engine/backends/transformers/backend.py is not written yet"
    )
    hf_backend = hf.TransformersBackend(smol_dir, draft="ngram", cache_mode="fp16", draft_cache_mode="fp16",
                                        max_context=1024)  # fmt: skip
    hf_backend.load()
    try:
        prompt = tuple(
            hf_backend.encode_chat([{"role": "user", "content": "Count from 1 to 20, comma separated."}])
        )
        request = GenerationRequest(
            prompt_ids=prompt, sampler=SamplerSettings(), max_new_tokens=40, num_draft_tokens=4
        )
        hf_chunks, hf_done = run(hf_backend, request)
    finally:
        hf_backend.close()
    tokens = [t for c in hf_chunks for t in c.token_ids]
    exl2 = loaded(make_model("target", {
        "reply": tokens, "end": "none", "ngram_acceptance": [c.accepted for c in hf_chunks],
    }))  # fmt: skip
    exl2_chunks, _ = run(exl2, GenerationRequest(prompt_ids=prompt, sampler=SamplerSettings(),
                                                 max_new_tokens=len(tokens), num_draft_tokens=4))  # fmt: skip
    assert [t for c in exl2_chunks for t in c.token_ids] == tokens
    pairs = list(zip(exl2_chunks[:-1], hf_chunks[:-1], strict=False))
    assert [(len(a.token_ids), a.accepted, a.origins) for a, _ in pairs] == [
        (len(b.token_ids), b.accepted, b.origins) for _, b in pairs
    ]
    ours, theirs = stats_of(exl2_chunks[:-1], hf_done, "exl2"), stats_of(hf_chunks[:-1], hf_done, "hf")
    # Not drafted_tokens / the histogram: exllamav2's n-gram drafter always proposes K (repeating the last token
    # when nothing matches) while the transformers backend's drafter may propose fewer; the rounds are the same.
    for name in ("new_tokens", "accepted_tokens", "rounds", "mean_accepted_length"):
        assert getattr(ours, name) == pytest.approx(getattr(theirs, name)), name


# ------------------------------------------------------------------------------ held text (dynamic.py)

# Byte-level BPE splits "日" and "語" into three tokens each; the generator holds the first two back.
HELD_TEXT = "Caches 🙂 warm 日本語 done."
GEMMA_STYLE_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.fixture(scope="module")
def held_ids(smol_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smol_dir / "tokenizer.json"))
    ids = tok.encode(HELD_TEXT, add_special_tokens=False).ids
    assert "\ufffd" in tok.decode([ids[4]]) and "\ufffd" in tok.decode([ids[8]])  # split characters
    return ids


def stream_of(generator, job) -> list[dict]:
    generator.enqueue(job)
    results: list[dict] = []
    while generator.num_remaining_jobs():
        results += [r for r in generator.iterate() if r["stage"] == "streaming"]
    return results


def test_partial_strings_match_is_the_extension_s(standin):
    from exllamav2.generator.dynamic import partial_strings_match

    assert partial_strings_match("Fine.<", ["<end_of_turn>"]) == -2
    assert partial_strings_match("Fine.<end_of_turn>\n", ["<end_of_turn>"]) == 5
    assert partial_strings_match("Fine.", ["<end_of_turn>"]) == -1
    assert partial_strings_match("", ["<end_of_turn>"]) == -1
    # String by string: a partial overlap with the first wins over a full match of the second.
    assert partial_strings_match("ab STOP <e", ["<end>", "STOP"]) == -2
    assert partial_strings_match("ab STOP <e", ["STOP", "<end>"]) == 3


def test_standin_holds_incomplete_characters_like_the_real_generator(standin, make_model, held_ids):
    import torch

    backend = loaded(make_model("target", {"reply": held_ids, "end": "end_of_turn"}), draft="none")
    job = standin.generator.ExLlamaV2DynamicJob(
        input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=64, stop_conditions=[IM_END]
    )
    results = stream_of(backend._m.generator, job)
    assert len(results) == len(held_ids) + 1  # one per sampled token, the stop token included
    # The first two tokens of 日 and of 語 are held: results with neither text nor token ids.
    assert [i for i, r in enumerate(results[:-1]) if "token_ids" not in r] == [4, 5, 8, 9]
    assert all("text" not in results[i] for i in (4, 5, 8, 9))
    assert results[6]["token_ids"].tolist() == [held_ids[4:7]] and results[6]["text"] == " 日"
    assert "".join(r.get("text", "") for r in results) == HELD_TEXT
    end = results[-1]
    assert end["eos"] and "token_ids" not in end and end["held"]["token_ids"].tolist() == [[IM_END]]


def test_standin_ends_on_a_stop_token_after_an_incomplete_character_with_both_held(
    standin, make_model, held_ids
):
    import torch

    backend = loaded(make_model("target", {"reply": held_ids[:6], "end": "end_of_turn"}), draft="none")
    job = standin.generator.ExLlamaV2DynamicJob(
        input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=64, stop_conditions=[IM_END]
    )
    end = stream_of(backend._m.generator, job)[-1]
    assert end["eos_reason"] == "stop_token" and end["eos_triggering_token_id"] == IM_END
    assert "token_ids" not in end and "text" not in end
    assert end["held"]["token_ids"].tolist() == [held_ids[4:6] + [IM_END]]
    assert "\ufffd" in end["held"]["text"]


def test_standin_holds_a_possible_stop_string_and_ends_on_it(standin, make_model, smol_dir):
    import torch
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(smol_dir / "tokenizer.json")).encode("Fine.<end_of_turn>\nmore").ids
    backend = loaded(make_model("target", {"reply": ids, "end": "none"}), draft="none")
    job = standin.generator.ExLlamaV2DynamicJob(
        input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=64, stop_conditions=[IM_END, "<end_of_turn>"]
    )
    results = stream_of(backend._m.generator, job)
    assert len(results) == 8  # "Fine", ".<", "end", "_", "of", "_", "turn", ">"
    assert results[0]["text"] == "Fine" and all(
        "text" not in r and "token_ids" not in r for r in results[1:7]
    )
    end = results[-1]
    assert (end["eos_reason"], end["eos_triggering_string"]) == ("stop_string", "<end_of_turn>")
    assert end["text"] == "." and end["token_ids"].tolist() == [ids[1:8]]  # every held token, the text before
    assert end["held"] == {"text": "<end_of_turn>"}


def chunk_rules_hold(chunks: list[Chunk]) -> None:
    for c in chunks:
        assert c.token_ids, f"a Chunk without tokens: {c}"
        assert c.accepted <= len(c.token_ids) and c.accepted <= c.drafted
        assert c.origins == round_origins(len(c.token_ids), c.accepted)


def test_held_characters_stay_with_their_rounds(standin, make_model, held_ids):
    schedule = [3, 0, 4, 1, 2]
    target = make_model("target", {"reply": held_ids, "end": "eos"})
    backend = loaded(target, draft=str(make_model("draft", {"draft_acceptance": schedule})))
    chunks, done = run(backend, request_for(backend, 4))
    job = backend._m.generator.standin_jobs[-1]
    chunk_rules_hold(chunks)
    assert [(len(c.token_ids), c.drafted, c.accepted) for c in chunks] == expected_rounds(
        len(held_ids), 4, schedule
    )
    assert [t for c in chunks for t in c.token_ids] == held_ids
    assert "".join(c.text for c in chunks) == HELD_TEXT
    assert sum(c.accepted for c in chunks) == job.accepted_draft_tokens
    assert done.stop_reason == "eos"


@pytest.mark.parametrize("draft", ["none", "ngram"])
def test_a_stop_token_right_after_an_incomplete_character_keeps_its_tokens(
    standin, make_model, held_ids, draft
):
    reply = held_ids[:6]  # ends in two of the three tokens of 日
    script = {"reply": reply, "end": "end_of_turn", "ngram_acceptance": [2]}
    backend = loaded(make_model("target", script, eos_token_id=ENDOFTEXT), draft=draft)
    chunks, done = run(backend, request_for(backend, 3))
    chunk_rules_hold(chunks)
    assert [t for c in chunks for t in c.token_ids] == reply
    assert "".join(c.text for c in chunks) == backend.decode(reply)
    assert done.stop_reason == "end_of_turn"  # from the stop token's id


def test_an_end_of_turn_string_is_a_stop_string_held_until_it_is_sure(standin, make_model, smol_dir):
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(smol_dir / "tokenizer.json")).encode("Fine.<end_of_turn>\nmore").ids
    folder = make_model("gemma_style", {"reply": ids, "end": "none", "ngram_acceptance": [2, 0, 1]})
    config = {
        "chat_template": GEMMA_STYLE_TEMPLATE,
        "eos_token": "<|endoftext|>",
        "bos_token": "<|im_start|>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    backend = loaded(folder)
    chunks, done = run(backend, request_for(backend, 2))
    job = backend._m.generator.standin_jobs[-1]
    assert "<end_of_turn>" in job.stop_strings
    chunk_rules_hold(chunks)
    assert done.stop_reason == "end_of_turn"
    assert "".join(c.text for c in chunks) == "Fine."
    assert [t for c in chunks for t in c.token_ids] == ids[:8]  # the stop string's tokens were generated
    assert sum(c.accepted for c in chunks) == job.accepted_draft_tokens
    assert sum(c.drafted for c in chunks) == job.accepted_draft_tokens + job.rejected_draft_tokens


# ------------------------------------------------------------------------------------------------ adaptive K


def adaptive_request(backend: ExLlamaV2Backend, k: int) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(backend.encode_chat(MESSAGES)),
        sampler=SamplerSettings(),
        max_new_tokens=64,
        num_draft_tokens=k,
        k_mode="adaptive",
        tuning_key="qa",
    )


def test_adaptive_k_turns_a_useless_draft_off_between_replies_and_probes_later(
    standin, make_model, reply_ids
):
    from engine.backends.exllamav2 import PROBE_INTERVAL_ROUNDS
    from engine.decoding.adaptive_k import PROBE_LENGTH
    from engine.decoding.cost_model import VerifyCostModel

    target = make_model("target", {"reply": reply_ids, "end": "eos"})
    draft = make_model("draft", {"draft_acceptance": [0]})  # never right
    backend = loaded(target, draft=str(draft), num_draft_tokens=4)
    # A GPU-like cost: a wide verify pass costs about a plain step, a draft step a tenth of one.
    backend._m.costs = VerifyCostModel.from_ratios({2: 1.0, 9: 1.05}, draft_ratio=0.1)

    first, _ = run(backend, adaptive_request(backend, 6))
    (k_first,) = {c.k for c in first}  # one K for the whole reply
    assert 0 < k_first <= 6 and all(c.drafted == k_first for c in first[:-1])  # the prior: worth a try
    second, _ = run(backend, adaptive_request(backend, 6))
    assert {c.k for c in second} == {0} and all(c.drafted == 0 for c in second)
    assert backend._m.generator.num_draft_tokens == 0
    assert [t for c in second for t in c.token_ids] == reply_ids  # the same reply whatever K
    # Rounds at K 0 add up to a probe reply, a short one, once PROBE_INTERVAL_ROUNDS of them went by. Each reply
    # here is len(reply_ids) rounds with a Chunk and one more that samples the stop token.
    rounds_off = len(second) + 1
    while True:
        chunks, _ = run(backend, adaptive_request(backend, 6))
        if chunks[0].k:
            break
        rounds_off += len(chunks) + 1
        assert rounds_off < 2 * PROBE_INTERVAL_ROUNDS
    assert PROBE_INTERVAL_ROUNDS <= rounds_off < PROBE_INTERVAL_ROUNDS + len(reply_ids) + 1
    assert {c.k for c in chunks} == {PROBE_LENGTH}
    assert backend.tuner("qa").probes == 1


def test_fixed_k_is_kept_whatever_the_acceptance(standin, make_model, reply_ids):
    target = make_model("target", {"reply": reply_ids, "end": "eos"})
    draft = make_model("draft", {"draft_acceptance": [0]})
    backend = loaded(target, draft=str(draft), num_draft_tokens=4)
    for _ in range(3):
        chunks, _ = run(backend, request_for(backend, 5))
        assert {c.k for c in chunks} == {5}
