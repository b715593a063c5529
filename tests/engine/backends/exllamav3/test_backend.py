"""The ExLlamaV3 backend against a scripted stand-in of exllamav3 1.6.5's API (tests/exl3_standin).

CUDA cannot run here: the stand-in follows the real generator's constructor checks, result dicts, live draft
counters, K rules and stop rules (each stand-in module cites the real file and lines), and scripts the tokens and the
per-round acceptance, so every number below is known in advance. tests/engine/backends/exllamav3/test_signatures.py holds the backend to
the real package's signatures; scripts/gpu_check.sh runs it on the real thing.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.backends.exllamav3 import (
    MAX_DRAFT_TOKENS,
    ExLlamaV3Backend,
    has_mtp_head,
    import_exllamav3,
    probe_exllamav3,
)
from engine.backends.exllamav3.backend import K_FLOOR_NOTE
from engine.backends.exllamav3.sampling import CACHE_BITS, combo_sampler_kwargs
from engine.decoding.acceptance import AcceptanceAccounting
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.models import folder_format
from engine.request import GenerationRequest, SamplerSettings
from tests.engine.backends.exllamav3.conftest import MESSAGES, TOKENIZER_FILES, forget_exllamav3

IM_END = 2  # SmolLM2's <|im_end|>
ENDOFTEXT = 0  # SmolLM2's <|endoftext|>


# ------------------------------------------------------------------------------------------------ fixtures


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
        quant_method: str | None = "exl3",
        mtp_layers: int = 0,
        weights: bool = True,
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for file_name in TOKENIZER_FILES:
            if (smol_dir / file_name).is_file():
                shutil.copy(smol_dir / file_name, folder / file_name)
        config: dict = {
            # exllamav3 1.6.5 builds Qwen3.5's MTP head only from the class it is released as (folder.py)
            "architectures": ["Qwen3_5ForConditionalGeneration" if mtp_layers else "LlamaForCausalLM"],
            "vocab_size": 49152,
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": max_positions,
            "bos_token_id": 1,
            "eos_token_id": eos_token_id,
        }
        if quant_method:
            config["quantization_config"] = {"quant_method": quant_method, "bits": 4.0}
        if mtp_layers:
            config["text_config"] = {"mtp_num_hidden_layers": mtp_layers}
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        if weights:
            (folder / "model.safetensors").write_bytes(b"")
        (folder / "standin.json").write_text(json.dumps(script or {}), encoding="utf-8")
        return folder

    return make


def loaded(folder: Path, **kwargs) -> ExLlamaV3Backend:
    backend = ExLlamaV3Backend(folder, **kwargs)
    backend.load()
    return backend


def request_for(
    backend: ExLlamaV3Backend, k: int, max_new_tokens: int = 64, k_mode: str = "fixed", **sampler
) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(backend.encode_chat(MESSAGES)),
        sampler=SamplerSettings(**sampler),
        max_new_tokens=max_new_tokens,
        num_draft_tokens=k,
        k_mode=k_mode,
        tuning_key="qa",
    )


def run(backend: ExLlamaV3Backend, request: GenerationRequest) -> tuple[list[Chunk], Done]:
    events = list(backend.generate(request, threading.Event()))
    assert isinstance(events[-1], Done) and all(isinstance(e, Chunk) for e in events[:-1])
    return events[:-1], events[-1]  # type: ignore[return-value]


def expected_rounds(n_tokens: int, k: int, schedule: list[int]) -> list[tuple[int, int, int]]:
    """(emitted, drafted, accepted) per round for a reply of n_tokens followed by a stop token, as exllamav3 1.6.5
    counts: the drafts a stop token leaves unresolved count as rejected, so every round drafted K."""
    rounds, position, r = [], 0, 0
    while True:
        accept = min(schedule[r % len(schedule)], k)
        r += 1
        left = n_tokens - position
        if accept >= left:
            if left:
                rounds.append((left, k, left))
            return rounds
        rounds.append((accept + 1, k, accept))
        position += accept + 1


# --------------------------------------------------------------------------------------------- pure parts


def test_sampler_and_cache_settings():
    kwargs = combo_sampler_kwargs(SamplerSettings(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05), 0.7)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], kwargs["min_p"]) == (0.7, 0.9, 40, 0.05)
    assert kwargs["rep_p"] == 1.0 and kwargs["adaptive_target"] == 1.0
    assert CACHE_BITS == {"fp16": None, "q8": (8, 8), "q6": (6, 6), "q4": (4, 4)}


def test_folder_format_and_mtp_head(make_model):
    assert folder_format(make_model("exl3")) == "exl3"
    assert folder_format(make_model("exl2", quant_method="exl2")) == "exl2"
    assert folder_format(make_model("gptq", quant_method="gptq")) == "gptq"
    assert folder_format(make_model("plain", quant_method=None)) == "fp16"
    assert has_mtp_head(make_model("mtp", mtp_layers=1)) and not has_mtp_head(make_model("no-mtp"))


def test_without_the_package_or_a_gpu_it_is_one_line(monkeypatch):
    forget_exllamav3()
    monkeypatch.setitem(sys.modules, "exllamav3", None)  # not importable, as on this machine
    with pytest.raises(BackendError) as info:
        import_exllamav3()
    assert str(info.value).startswith("exllamav3 is unusable here: ") and "\n" not in str(info.value)
    assert probe_exllamav3() == (False, "no CUDA GPU visible to torch")  # no GPU: not even imported


# ------------------------------------------------------------------------------------ loading and caches


def test_load_draft_first_caches_before_load_q8_and_q4(standin, make_model):
    target = make_model("target")
    draft = make_model("draft")
    stages: list[str] = []
    backend = ExLlamaV3Backend(
        target, draft=str(draft), cache_mode="q8", draft_cache_mode="q4", max_context=1000
    )
    backend.load(lambda stage, fraction: stages.append(stage))
    m = backend._m
    assert [f"text {draft}", f"text {target}"] == standin.standin.LOAD_LOG  # the draft loads first
    assert m.cache.max_num_tokens == m.draft_cache.max_num_tokens == 1024  # 1000 up to a page multiple
    assert {layer.bits for layer in m.cache.layers} == {(8, 8)}
    assert {layer.bits for layer in m.draft_cache.layers} == {(4, 4)}
    assert m.cache.initialized and m.draft_cache.initialized  # built before load(), so load() allocated them
    g = m.generator
    assert g.draft_model is m.draft_model and g.ngram_match_min == 0
    assert g.max_draft_tokens == MAX_DRAFT_TOKENS and g.num_draft_tokens == 4  # built with the largest K
    assert g.record_draft_stats and m.calibrator is not None and g.draft_calibrator is None
    assert backend.info.draft_mode == "model" and backend.info.draft_cache_mode == "q4"
    assert "drafter: draft model" in backend.info.notes
    assert "loading draft model" in stages and stages[-1] == "ready"


def test_fp16_and_q6_caches_and_a_plain_folder(standin, make_model):
    backend = loaded(make_model("target", quant_method=None), draft="none", cache_mode="fp16")
    m = backend._m
    assert {layer.bits for layer in m.cache.layers} == {(16, 16)} and m.draft_cache is None
    assert m.generator.num_draft_tokens == 0 and m.generator.max_draft_tokens == 0
    q6 = loaded(make_model("q6"), cache_mode="q6")
    assert {layer.bits for layer in q6._m.cache.layers} == {(6, 6)}


# ----------------------------------------------------------------------------------------- per reply


def test_reply_sampler_is_built_from_the_request_and_stops_on_end_of_turn(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "end_of_turn"}, eos_token_id=ENDOFTEXT))
    request = request_for(backend, 4, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05)
    chunks, done = run(backend, request)
    job = backend._m.generator.standin_jobs[-1]
    assert job.stop_tokens == {ENDOFTEXT, IM_END}
    assert type(job.sampler).__name__ == "ComboSampler" and not job.sampler.greedy
    settings = job.sampler.settings
    assert (settings["temperature"], settings["top_p"], settings["top_k"], settings["min_p"]) == (
        0.7,
        0.9,
        40,
        0.05,
    )
    assert done.stop_reason == "end_of_turn"
    assert [t for c in chunks for t in c.token_ids] == reply_ids  # the stop token is no part of the reply
    assert "".join(c.text for c in chunks) == backend.decode(reply_ids)


def test_greedy_only_at_temperature_exactly_zero(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids[:4], "end": "eos"}))
    run(backend, request_for(backend, 2, temperature=0.0))
    assert backend._m.generator.standin_jobs[-1].sampler.greedy
    run(backend, request_for(backend, 2, temperature=0.01))
    job = backend._m.generator.standin_jobs[-1]
    assert not job.sampler.greedy and job.sampler.settings["temperature"] == 0.01


def test_reply_stops_on_eos_and_exactly_at_max_new_tokens(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids[:5], "end": "eos"}, eos_token_id=ENDOFTEXT))
    chunks, done = run(backend, request_for(backend, 4))
    assert done.stop_reason == "eos" and [t for c in chunks for t in c.token_ids] == reply_ids[:5]
    long = loaded(make_model("long", {"reply": reply_ids, "end": "none", "ngram_acceptance": [4, 1]}))
    for k in (0, 4):
        chunks, done = run(long, request_for(long, k, max_new_tokens=10))
        assert long._m.generator.standin_jobs[-1].max_new_tokens == 10  # no +K: 1.6.5 stops exactly there
        assert sum(len(c.token_ids) for c in chunks) == 10 and done.stop_reason == "max_new_tokens"


def test_context_clamp_is_exllamav3_s_own_and_says_context(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none"}), max_context=256)
    request = request_for(backend, 4, max_new_tokens=1000)
    chunks, done = run(backend, request)
    # Job.prepare_for_queue: cache - prompt - 1 - max_draft_tokens (the K the generator was built with)
    assert sum(len(c.token_ids) for c in chunks) == 256 - len(request.prompt_ids) - 1 - MAX_DRAFT_TOKENS
    assert done.stop_reason == "context"
    with pytest.raises(BackendError, match="does not fit the 256-token context"):
        run(backend, GenerationRequest(prompt_ids=(5,) * 250, sampler=SamplerSettings(), max_new_tokens=8))


def test_live_and_final_acceptance_from_draft_counters(standin, make_model, reply_ids):
    schedule = [3, 0, 4, 1, 2]
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "eos"}), draft=str(make_model("draft", {
        "draft_acceptance": schedule})))  # fmt: skip
    chunks, done = run(backend, request_for(backend, 4))
    job = backend._m.generator.standin_jobs[-1]
    expected = expected_rounds(len(reply_ids), 4, schedule)
    assert [(len(c.token_ids), c.drafted, c.accepted) for c in chunks] == expected
    for c in chunks:
        assert c.origins == (True,) * c.accepted + (False,) * (len(c.token_ids) - c.accepted) and c.k == 4
    assert sum(c.accepted for c in chunks) == job.accepted_draft_tokens
    # A round whose only sample is the stop token drafted K, which exllamav3 1.6.5 counts as rejected, but it
    # emits nothing, so no Chunk carries it: the counters add up to the Chunks plus K per such round.
    stop_only_rounds = len(job.draft_stats) - len(chunks)
    assert stop_only_rounds == 1
    assert sum(c.drafted for c in chunks) + 4 * stop_only_rounds == (
        job.accepted_draft_tokens + job.rejected_draft_tokens
    )
    assert [(w, a) for _, w, a in job.draft_stats][: len(chunks)] == [(4, a) for _, _, a in expected]
    accounting = AcceptanceAccounting(t_start=chunks[0].t - 0.01)
    for c in chunks:
        accounting.add(c)
    stats = accounting.finish(
        done, chunks[-1].t, preset="qa", num_draft_tokens=4, temperature=0.0, draft_mode="model",
        backend="exllamav3", model="target",
    )  # fmt: skip
    assert stats.new_tokens == len(reply_ids) and stats.rounds == len(expected)
    assert stats.acceptance_rate == pytest.approx(job.accepted_draft_tokens / stats.drafted_tokens)
    assert done.notes[0] == "drafter: draft model, K 4 by fixed K"


def test_k_changes_between_replies_and_is_floored_at_1_with_a_draft(standin, make_model, reply_ids):
    target = make_model("target", {"reply": reply_ids, "end": "eos"})
    backend = loaded(target, draft=str(make_model("draft", {"draft_acceptance": [99]})))
    m = backend._m
    ids = id(m.generator), id(m.cache), id(m.draft_cache), id(m.generator.draft_ids_pinned)
    chunks4, _ = run(backend, request_for(backend, 4))
    assert (chunks4[0].drafted, chunks4[0].accepted) == (4, 4)
    chunks2, done2 = run(backend, request_for(backend, 2))
    assert m.generator.num_draft_tokens == 2 and (chunks2[0].drafted, len(chunks2[0].token_ids)) == (2, 3)
    assert done2.cached_tokens == len(request_for(backend, 2).prompt_ids) - 1  # the prefix cache survived
    chunks0, done0 = run(backend, request_for(backend, 0))  # K 0 asked: floored at 1, the draft keeps up
    assert m.generator.num_draft_tokens == 1 and all(c.drafted == 1 for c in chunks0)
    assert K_FLOOR_NOTE in done0.notes and not m.generator.standin_draft_behind
    again, _ = run(backend, request_for(backend, 4))
    assert again[0].accepted == 4  # drafting after the K-0 reply is as good as before
    big, _ = run(backend, request_for(backend, MAX_DRAFT_TOKENS + 5))
    assert big[0].drafted == MAX_DRAFT_TOKENS and any("at most" in n for n in backend.info.notes)
    assert (id(m.generator), id(m.cache), id(m.draft_cache), id(m.generator.draft_ids_pinned)) == ids
    for chunks in (chunks4, chunks2, chunks0, again, big):
        assert [t for c in chunks for t in c.token_ids] == reply_ids  # same tokens whatever K


def test_the_k0_hazard_the_floor_avoids(standin, make_model, reply_ids):
    """What the floor is for: the stand-in's model of exllamav3 skipping the draft forward at K 0."""
    backend = loaded(make_model("t", {"reply": reply_ids, "end": "eos"}), draft=str(make_model("d", {
        "draft_acceptance": [99]})))  # fmt: skip
    generator = backend._m.generator
    import torch

    generator.num_draft_tokens = 0  # a reply at K 0 without the floor, driven on the generator itself
    job = standin.Job(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=8, sampler=standin.ArgmaxSampler())
    generator.enqueue(job)
    while generator.num_remaining_jobs():
        generator.iterate()
    assert generator.standin_draft_behind
    chunks, _ = run(backend, request_for(backend, 4))
    assert sum(c.accepted for c in chunks) == 0  # every draft is now wrong


def test_ngram_drafting_on_and_off_and_a_plain_folder(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "eos", "ngram_acceptance": [2]}))
    generator = backend._m.generator
    assert generator.ngram_match_min == 2 and generator.draft_model is None
    off, _ = run(backend, request_for(backend, 0))
    assert generator.num_draft_tokens == 0 and all(c.drafted == 0 for c in off)
    on, done = run(backend, request_for(backend, 3))
    assert generator.num_draft_tokens == 3 and (on[0].drafted, on[0].accepted) == (3, 2)
    assert done.notes[0] == "drafter: n-gram, K 3 by fixed K"
    plain = loaded(make_model("plain", {"reply": reply_ids, "end": "eos"}, quant_method=None), draft="none")
    chunks, done = run(plain, request_for(plain, 4))
    assert all(c.drafted == 0 for c in chunks) and plain._m.generator.num_draft_tokens == 0 and not done.notes


def test_mtp_head_drafts_from_the_model_s_own_folder(standin, make_model, reply_ids):
    folder = make_model(
        "qwen-mtp", {"reply": reply_ids, "end": "eos", "mtp_acceptance": [2, 1]}, mtp_layers=1
    )
    backend = loaded(folder, draft="mtp", draft_cache_mode="q4")
    m = backend._m
    assert m.draft_model.component == "mtp" and m.generator.mtp_draft
    assert [f"mtp {folder}", f"text {folder}"] == standin.standin.LOAD_LOG
    assert {layer.bits for layer in m.draft_cache.layers} == {(4, 4)}
    assert backend.info.draft_model == "MTP head" and "drafter: MTP head" in backend.info.notes
    assert m.draft_model.attached_model is m.model  # the generator bound the head to its target
    # Qwen3.5's head has no depth-specialized layers (no "mtp_depths"): no warning (test_hybrid_mtp.py: MiMo-V2's)
    assert not any(n.startswith("exllamav3: Warning") for n in backend.info.notes)
    chunks, done = run(backend, request_for(backend, 3))
    assert [(c.drafted, c.accepted) for c in chunks[:2]] == [(3, 2), (3, 1)]
    assert done.notes[0] == "drafter: MTP head, K 3 by fixed K"
    assert [t for c in chunks for t in c.token_ids] == reply_ids
    with pytest.raises(BackendError, match="declares no MTP head") as info:
        loaded(make_model("no-head", {}), draft="mtp")
    assert "\n" not in str(info.value)


def test_dynamic_draft_length_or_adaptive_k_one_per_reply(standin, make_model, reply_ids):
    target = make_model("target", {"reply": reply_ids, "end": "eos", "dynamic_window": [2, 1, 3]})
    backend = loaded(target, draft=str(make_model("draft", {"draft_acceptance": [99]})))
    m = backend._m
    chunks, done = run(backend, request_for(backend, 4, k_mode="dynamic"))
    assert [c.drafted for c in chunks[:3]] == [2, 1, 3]  # the library's calibrator cut each round
    assert done.notes[0] == "drafter: draft model, K 4 by the library's dynamic draft length"
    assert m.generator.draft_calibrator is m.calibrator
    chunks, done = run(backend, request_for(backend, 4, k_mode="adaptive"))
    assert m.generator.draft_calibrator is None and done.notes[0].endswith("by adaptive K")
    assert len({c.drafted for c in chunks}) == 1  # our K is one per reply
    chunks, done = run(backend, request_for(backend, 4))
    assert m.generator.draft_calibrator is None and [c.drafted for c in chunks[:3]] == [4, 4, 4]


def test_cancel_from_another_thread(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "none"}))
    cancel, first_chunk, events = threading.Event(), threading.Event(), []

    def consume() -> None:
        for event in backend.generate(request_for(backend, 4, max_new_tokens=500), cancel):
            events.append(event)
            first_chunk.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert first_chunk.wait(10)
    cancel.set()
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "cancelled"
    assert sum(len(e.token_ids) for e in events[:-1]) < 500
    assert backend._m.generator.num_remaining_jobs() == 0
    stream = backend.generate(request_for(backend, 2, max_new_tokens=200), threading.Event())
    next(stream)
    stream.close()  # closing the stream early cancels the job too
    assert backend._m.generator.num_remaining_jobs() == 0
    _, done = run(backend, request_for(backend, 2, max_new_tokens=5))
    assert done.stop_reason == "max_new_tokens"


def test_a_failed_job_is_one_line_and_the_generator_stays_usable(standin, make_model, reply_ids):
    backend = loaded(make_model("target", {"reply": reply_ids, "end": "eos", "error_at": 3}))
    with pytest.raises(BackendError, match="^exllamav3 failed the reply: RuntimeError: CUDA error") as info:
        run(backend, request_for(backend, 2))
    assert "\n" not in str(info.value) and backend._m.generator.num_remaining_jobs() == 0


def test_close_releases_the_generator(standin, make_model):
    backend = loaded(make_model("target"))
    generator, model = backend._m.generator, backend._m.model
    backend.close()
    assert generator.closed and not model.loaded and backend._m is None


# ---------------------------------------------------------------------------------------------- errors


def test_folder_errors_are_one_line(standin, make_model, tmp_path):
    with pytest.raises(BackendError, match="not found"):
        loaded(tmp_path / "missing")
    with pytest.raises(BackendError, match="is EXL2: exllamav3 loads only EXL3 .*use --backend exllamav2$"):
        loaded(make_model("exl2", quant_method="exl2"))
    with pytest.raises(BackendError, match=r"has no weights \(\*\.safetensors\): exllamav3 loads only EXL3"):
        loaded(make_model("empty", weights=False))
    with pytest.raises(BackendError, match="out of memory loading model target"):
        loaded(make_model("target", {"oom_on_load": True}))


# ----------------------------------------------------------------------------------- backend selection


def _settings(model: Path | None, backend: str, draft: str = "ngram") -> SimpleNamespace:
    return SimpleNamespace(
        model=model, draft=draft, backend=backend, cache_mode="auto", draft_cache_mode="auto", max_context=1024,
        gpu_split=None,
    )  # fmt: skip


def test_backend_exllamav3_without_cuda_is_one_line(make_model):
    from engine.backends.select import create_backend

    with pytest.raises(BackendError) as info:
        create_backend(_settings(make_model("m"), "exllamav3"))
    assert str(info.value) == (
        "exllamav3 is unusable here: no CUDA GPU visible to torch; use --backend auto for the CPU backends"
    )
    with pytest.raises(BackendError, match="^an EXL3 folder needs exllamav3 .*no CUDA GPU visible to torch$"):
        create_backend(_settings(make_model("e"), "auto"))
    with pytest.raises(BackendError, match="^--draft mtp drafts with the model's own MTP head"):
        create_backend(_settings(make_model("p", quant_method=None), "transformers", draft="mtp"))


def test_auto_on_a_gpu_picks_the_engine_the_folder_needs(make_model, monkeypatch):
    from engine.backends import exllamav2, exllamav3, select
    from engine.backends.exllamav2 import ExLlamaV2Backend

    monkeypatch.setattr(
        exllamav3.library, "probe_exllamav3", lambda progress=None: (True, "exllamav3 1.6.5 on H200")
    )
    monkeypatch.setattr(
        exllamav2.library, "probe_exllamav2", lambda progress=None: (True, "exllamav2 0.3.2 on H200")
    )
    backend, why = select.create_backend(_settings(make_model("exl3"), "auto"))
    assert (
        isinstance(backend, ExLlamaV3Backend)
        and why == "auto: an EXL3 folder and exllamav3 1.6.5 on H200 -> exllamav3"
    )
    assert backend.cache_mode == "q8"  # "auto" cache mode: exllamav3's default
    backend, why = select.create_backend(_settings(make_model("exl2", quant_method="exl2"), "auto"))
    assert isinstance(backend, ExLlamaV2Backend) and why.endswith("-> exllamav2")
    backend, why = select.create_backend(
        _settings(make_model("fp16", quant_method=None), "auto", draft="mtp")
    )
    assert (
        isinstance(backend, ExLlamaV3Backend)
        and backend.drafter == "mtp"
        and why.startswith("auto: --draft mtp")
    )
    monkeypatch.setattr(
        exllamav2.library, "probe_exllamav2", lambda progress=None: (False, "exllamav2 is not installed")
    )
    backend, why = select.create_backend(_settings(make_model("fp16b", quant_method=None), "auto"))
    assert isinstance(backend, ExLlamaV3Backend)
    assert (
        why == "auto: exllamav2 unusable (exllamav2 is not installed); exllamav3 1.6.5 on H200 -> exllamav3"
    )
    backend, why = select.create_backend(_settings(make_model("named"), "exllamav3"))
    assert (
        isinstance(backend, ExLlamaV3Backend)
        and why == "exllamav3: chosen in settings (exllamav3 1.6.5 on H200)"
    )
