"""The llama.cpp backend on the embedded model's real GGUF: exact speculation, rollback, stops, reuse, errors.

Skipped where llama-cpp-python is not installed (`make install` builds it; a failed build is allowed).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.drafting import FreeVerify
from tests.support.replies import Reply, generate

pytest.importorskip("llama_cpp")

from engine.backends.base import Backend
from engine.backends.llamacpp import (  # noqa: E402
    LONG_PROBE_POSITION,
    LlamaCppBackend,
    LlamaCppModel,
    ggml_cpu_library,
    patched_build,
    physical_cores,
    resolve_gguf,
)
from engine.backends.llamacpp.probe import SHORT_PROBE_POSITION, probe_starts, probe_widths  # noqa: E402
from engine.decoding.drafters.ngram import LONG_DRAFT_MAX  # noqa: E402
from engine.errors import BackendError
from engine.events import Done  # noqa: E402
from engine.request import GenerationRequest, SamplerSettings  # noqa: E402

# The reply repeats its own lines ('echo', loop syntax), so the n-gram drafter finds matches: measured, this
# prompt gives fully, partly and not accepted rounds alike.
REPEAT_PROMPT = "Write a bash script that prints the numbers 1 to 10, then explain each line."
PALINDROME_PROMPT = (
    "Write a Python function that checks whether a string is a palindrome, then show how to call it."
)


def chat(backend, text: str) -> list[int]:
    return backend.encode_chat([{"role": "user", "content": text}])


def assert_round_accounting(reply: Reply) -> None:
    for i, chunk in enumerate(reply.chunks):
        assert len(chunk.origins) == len(chunk.token_ids)
        assert 0 <= chunk.accepted <= chunk.drafted
        if i < len(reply.chunks) - 1:
            assert len(chunk.token_ids) == chunk.accepted + 1
            assert chunk.origins == (True,) * chunk.accepted + (False,)


@pytest.fixture(scope="module")
def gguf() -> Path:
    from engine.models import ensure_embedded_gguf

    return ensure_embedded_gguf()


@pytest.fixture(scope="module")
def smol(gguf: Path) -> LlamaCppBackend:
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=2048)
    stages: list[str] = []
    backend.load(lambda stage, fraction: stages.append(stage))
    assert stages[-1] == "ready"
    yield backend
    backend.close()


# --- no model needed ----------------------------------------------------------------------------------------


def test_physical_cores_is_at_least_one_and_at_most_the_cpus() -> None:
    import os

    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


def test_a_file_that_is_not_gguf_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(BackendError, match="not a GGUF file"):
        resolve_gguf(bad)
    with pytest.raises(BackendError, match="not found"):
        resolve_gguf(tmp_path / "missing.gguf")
    with pytest.raises(BackendError, match="0 .gguf files"):
        resolve_gguf(tmp_path / ".." / tmp_path.name / "..")
    with pytest.raises(BackendError) as info:
        LlamaCppBackend(bad).load()
    assert "\n" not in str(info.value)


def test_generate_before_load_is_an_error(gguf: Path) -> None:
    with pytest.raises(BackendError, match="not loaded"):
        LlamaCppBackend(gguf).encode_chat([{"role": "user", "content": "hi"}])


# --- the embedded GGUF ------------------------------------------------------------------------------------


def test_backend_satisfies_the_protocol_and_reports_itself(smol: LlamaCppBackend) -> None:
    assert isinstance(smol, Backend)
    info = smol.info
    assert (info.backend, info.device, info.draft_mode) == ("llama.cpp", "cpu", "ngram")
    assert info.max_context == 2048
    assert smol.end_of_turn_id == 2 and 2 in smol.stop_token_ids  # <|im_end|>


def test_chat_tokens_and_text_match_the_hugging_face_tokenizer(smol: LlamaCppBackend, smol_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    messages = [{"role": "user", "content": "Héllo, wörld! 你好 ```code``` <b>x</b>"}]
    ids = smol.encode_chat(messages)
    text = smol.template.render(messages)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(1) == 3  # <|im_start|> parsed as one special token: system, user, assistant
    assert smol.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_cache_modes_map_to_llama_cpp_types(gguf: Path) -> None:
    backend = LlamaCppBackend(gguf, draft="none", cache_mode="q6", max_context=512)
    backend.load()
    try:
        assert any("6-bit" in note for note in backend.info.notes)
        reply = generate(backend, chat(backend, "Say hi."), max_new=4)
        assert len(reply.tokens) == 4
    finally:
        backend.close()


@pytest.mark.slow
def test_greedy_speculative_equals_plain_and_drafts_are_accepted(smol: LlamaCppBackend) -> None:
    ids = chat(smol, REPEAT_PROMPT)
    plain = generate(smol, ids, k=0, max_new=96)
    assert (plain.drafted, plain.accepted) == (0, 0)
    measured = smol.target.costs
    smol.target.costs = FreeVerify()  # draft every match: how much pays depends on the machine's load
    try:
        ngram = generate(smol, ids, k=6, max_new=96)
    finally:
        smol.target.costs = measured
    assert ngram.tokens == plain.tokens
    assert ngram.text == plain.text == smol.decode(plain.tokens)
    assert_round_accounting(ngram)
    # The path under test ran: drafts were accepted, and some rounds were rolled back after a partial accept.
    assert ngram.accepted >= 20
    assert any(0 < c.accepted < c.drafted for c in ngram.chunks)
    assert len(ngram.chunks) < len(ngram.tokens)
    assert ngram.done.draft_step_s > 0 and ngram.done.target_step_s > 0
    assert ngram.done.prompt_tokens == len(ids)


@pytest.mark.slow
def test_seeded_sampling_speculative_equals_plain(smol: LlamaCppBackend) -> None:
    ids = chat(smol, REPEAT_PROMPT)
    sampler = dict(temperature=0.5, top_k=40, top_p=0.95)
    plain = generate(smol, ids, k=0, max_new=80, seed=11, **sampler)
    ngram = generate(smol, ids, k=5, max_new=80, seed=11, **sampler)
    assert ngram.tokens == plain.tokens
    assert ngram.accepted > 0
    assert all(c.temperature == 0.5 for c in ngram.chunks)
    other_seed = generate(smol, ids, k=0, max_new=80, seed=12, **sampler)
    assert other_seed.tokens != plain.tokens


# Wider than any pass of K 5 (the speculative reply below), far narrower than the loop's widest (49).
PADDED_PROBE_WIDTH = 9


@pytest.mark.slow
def test_padded_plain_steps_equal_speculation_too(gguf: Path, smol: LlamaCppBackend, monkeypatch) -> None:
    # Where one-token decodes round otherwise than the rows of a batch, the probe pads plain steps (a throw-away
    # second position) and judges every wider pass against those padded steps. Planted: an unpadded one-token
    # decode pushes one token's logit far up, so a plain step that was not padded would pick that token every
    # time, and the probe (run by load) must see it.
    ids = chat(smol, PALINDROME_PROMPT)
    reference = generate(smol, ids, k=0, max_new=120)
    real = LlamaCppModel._decode
    pushed = 1234

    def single_rounds_otherwise(self, tokens, outputs):
        logits = real(self, tokens, outputs)
        if len(tokens) == 1 and logits is not None:
            logits[:, pushed] += 100.0
        return logits

    monkeypatch.setattr(LlamaCppModel, "_decode", single_rounds_otherwise)
    # The load's probe, up to PADDED_PROBE_WIDTH: the planted kernel moves one-token decodes only, so every
    # batched width sees the same kernels (a full probe, 2 x 1,224 rows on one core, took 40 of this test's 80 s).
    # That the batched rows of every width up to 49 equal one-token decodes on this build is proven by
    # test_the_patched_build_decodes_one_token_exactly_as_a_row_of_a_batch. The 256-token context holds the
    # replies (the prompt and 120 tokens) and leaves out the long-context pass timings a load takes.
    monkeypatch.setattr(
        LlamaCppBackend,
        "_probe",
        lambda self: probe_widths(self.target, self.encode_text, self.max_context, widest=PADDED_PROBE_WIDTH),
    )
    padded = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=256)
    padded.load()
    try:
        assert padded.pad_plain_steps and padded.probe.pad and padded.target.pad_single
        assert padded.probe.widest == padded.probe.checked == PADDED_PROBE_WIDTH  # every wider pass agrees
        assert padded.max_verify_width == PADDED_PROBE_WIDTH
        plain = generate(padded, ids, k=0, max_new=120)
        assert plain.tokens == reference.tokens and pushed not in plain.tokens
        assert generate(padded, ids, k=5, max_new=120).tokens == reference.tokens
    finally:
        padded.close()


def nudged_probe_pads(backend: LlamaCppBackend) -> bool:
    """The kernel probe on a target whose one-token decode a test nudged: does it pad plain steps (the verdict
    `_kernels_agree` reads as False)? Widths 2-4 only: a nudged single step differs from every row of every pass, so
    the 49 widths of a full probe (twice, the second time padded) would only take seconds to say the same."""
    verdict = probe_widths(backend.target, backend.encode_text, backend.max_context, widest=4)
    assert verdict.checked == 4 and backend.target.ids == []
    return verdict.pad


def test_the_probe_leaves_each_start_room_for_a_padded_steps_throw_away_position() -> None:
    # A padded plain step decodes one position past itself: the last padded reference of a start sits at
    # start + widest. A context of exactly start + widest cells had no room for it (the load's probe failed).
    assert probe_starts(LONG_PROBE_POSITION + 4, widest=4) == [SHORT_PROBE_POSITION, SHORT_PROBE_POSITION + 8]
    assert probe_starts(LONG_PROBE_POSITION + 5, widest=4) == [SHORT_PROBE_POSITION, LONG_PROBE_POSITION]
    assert probe_starts(SHORT_PROBE_POSITION + 4, widest=4) == []


@pytest.mark.slow
def test_the_kernel_probe_notices_single_token_kernels_that_round_differently() -> None:
    # On the Q4_1 GGUF llama.cpp's single-token and batched kernels agree here (on F16 they do not): the probe
    # must see one planted ulp.
    from engine.models import ensure_embedded_gguf
    from tests.support.native_guard import survives

    q4_1 = ensure_embedded_gguf(precision="q4_1")
    survives(q4_1)  # a native crash (llama.cpp's AMX repack) fails this test alone, not the suite
    backend = LlamaCppBackend(q4_1, draft="ngram", cache_mode="fp16", max_context=512)
    backend.load()
    try:
        target = backend.target
        real_decode = target.decode

        def nudged(tokens, outputs, timed=False, pad=None):  # a single-token kernel one ulp off in one logit
            logits = real_decode(tokens, outputs, timed, pad)
            if len(tokens) == 1 and logits is not None:
                logits[0, 100] = np.nextafter(logits[0, 100], np.inf)
            return logits

        target.decode = nudged
        assert nudged_probe_pads(backend)
        target.decode = real_decode
        assert backend._kernels_agree() is True  # this build and CPU: bit-identical rows, every width
        assert target.ids == []  # the probe leaves an empty cache behind
    finally:
        backend.close()


@pytest.mark.slow
def test_the_patched_build_decodes_one_token_exactly_as_a_row_of_a_batch(smol: LlamaCppBackend) -> None:
    # make install builds llama.cpp with scripts/patch_llama_cpp.py: on the F16 GGUF, one-token decodes equal the
    # rows of a batch bit for bit, near the start and past 512 cached positions, so plain steps are not padded.
    if not patched_build():
        pytest.skip("stock llama.cpp build (make install printed why the patched one did not build)")
    assert smol.pad_plain_steps is False and smol.target.pad_single is False
    target = smol.target
    real_decode = target.decode

    def nudged_when_long(tokens, outputs, timed=False, pad=None):  # one ulp off only past the long position
        logits = real_decode(tokens, outputs, timed, pad)
        if len(tokens) == 1 and logits is not None and len(target.ids) > LONG_PROBE_POSITION:
            logits[0, 100] = np.nextafter(logits[0, 100], np.inf)
        return logits

    try:
        target.decode = nudged_when_long
        assert nudged_probe_pads(smol)  # the probe does look past 512 positions
        target.decode = real_decode
        assert smol._kernels_agree() is True
    finally:
        target.decode = real_decode


@pytest.mark.slow
@pytest.mark.all_cores
def test_the_patched_build_computes_the_same_rows_on_1_and_2_threads(gguf: Path) -> None:
    # Why a kernel probe verdict measured at one thread count serves every other on the patched build
    # (probe.recall_for): one-token steps near the start and past 512 cached tokens, and the rows of a 20-token pass,
    # bit for bit the same on 1 and 2 threads.
    if not patched_build():
        pytest.skip("stock llama.cpp build (make install printed why the patched one did not build)")
    chat_ids: list[int] = []
    rows = {}
    for threads in (1, 2):
        backend = LlamaCppBackend(gguf, draft="none", cache_mode="fp16", max_context=1024, threads=threads)
        backend.load()
        try:
            assert backend.threads == threads
            target = backend.target
            chat_ids = chat_ids or chat(backend, PALINDROME_PROMPT)
            ids = (chat_ids * 40)[:560]
            target.clear()
            target.prefill(ids[:8])
            singles = [target.decode([token], outputs=1)[0] for token in ids[8:28]]
            target.crop(8)
            batch = target.decode(ids[8:28], outputs=20)
            target.clear()
            target.prefill(ids[:520])
            late = [target.decode([token], outputs=1)[0] for token in ids[520:528]]
            target.clear()
            rows[threads] = (np.stack(singles), batch, np.stack(late))
        finally:
            backend.close()
    for one, two in zip(rows[1], rows[2], strict=True):
        assert np.array_equal(one, two)


def test_a_thread_free_build_recalls_a_verdict_measured_at_another_thread_count(
    gguf: Path, tmp_path, monkeypatch
) -> None:
    from engine.backends.llamacpp import probe
    from engine.backends.llamacpp.native import trial_key

    monkeypatch.setattr(probe, "probes_path", lambda: tmp_path / "probes.json")
    verdict = probe.ProbeVerdict(pad=False, widest=33, checked=49, first_mismatch=34)
    probe.remember(probe.probe_key(trial_key(gguf, True), "f16", 2, 2048), verdict)
    settings = {"cache_type": "f16", "max_context": 2048}
    key, found = probe.recall_for(gguf, True, threads=1, thread_free=True, **settings)
    assert found == verdict and key == probe.probe_key(trial_key(gguf, True), "f16", 1, 2048)
    assert probe.recall_for(gguf, True, threads=1, thread_free=False, **settings)[1] is None  # a stock build
    assert probe.recall_for(gguf, True, threads=2, thread_free=False, **settings)[1] == verdict
    assert probe.thread_free_build(True, "x86_64") and probe.thread_free_build(True, "AMD64")
    assert not probe.thread_free_build(True, "aarch64")  # stock NEON/i8mm kernels: not checked across counts
    assert not probe.thread_free_build(False, "x86_64")  # a stock build splits one row's keys by thread count
    other_cache = {"cache_type": "q8_0", "max_context": 2048}
    assert probe.recall_for(gguf, True, threads=1, thread_free=True, **other_cache)[1] is None
    if not probe.thread_free_build(patched_build()):
        return
    # A load on 1 thread takes the verdict measured on 2 and probes nothing (planted: widest 33, repacked or not).
    for repack in (True, False):
        probe.remember(probe.probe_key(trial_key(gguf, repack), "f16", 2, 2048), verdict)
    monkeypatch.setattr(
        "engine.backends.llamacpp.backend.probe_widths", lambda *args, **kwargs: pytest.fail("probed again")
    )
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=2048, threads=1)
    backend.load()
    try:
        assert backend.probe == verdict
    finally:
        backend.close()


def test_the_built_library_runs_its_own_thread_pool_not_openmp() -> None:
    # scripts/build_llama_cpp.sh builds without OpenMP: with libgomp, a decode from the chat's reply thread ran 2x
    # slower than from the thread that ran llama.cpp first (its idle OpenMP worker makes libgomp throttle its
    # spinning at every barrier). The library must not link libgomp.
    if not patched_build():
        pytest.skip("stock llama.cpp build (make install printed why the patched one did not build)")
    library = ggml_cpu_library()
    assert library is not None
    assert b"libgomp.so" not in library.read_bytes()


@pytest.mark.slow
def test_rows_of_a_pass_equal_one_token_decodes_across_key_chunks_at_long_contexts(
    smol: LlamaCppBackend,
) -> None:
    # The patched build attends in fixed chunks of 256 cache cells (a one-token decode over thousands of keys then
    # shares its chunks among the threads): a pass whose rows straddle a chunk boundary, deep into the context,
    # still computes each row as a one-token decode at that position does, bit for bit.
    if not patched_build():
        pytest.skip("stock llama.cpp build (make install printed why the patched one did not build)")
    target = smol.target
    words = " ".join(
        f"item {i}: the {['red', 'blue', 'green'][i % 3]} box holds {i * 7 % 13} coins." for i in range(400)
    )
    ids = smol.encode_text(words)
    try:
        # a long-match draft's widest pass (LONG_DRAFT_MAX + 1 rows) from 1,000 straddles 1,024; rows 1019..1027
        # straddle 1,024; 1787..1795 straddle 1,792. In that order each start's prefill reuses the cache the one
        # before left (a crop, then only the new positions): 1,759 positions prefilled instead of 3,806. Each start
        # compares its pass with one-token decodes over the same cached prefix, however that prefix was made.
        target.clear()
        for start, width in ((1000, LONG_DRAFT_MAX + 1), (1019, 9), (1787, 9)):
            assert len(ids) >= start + width
            cached = len(target.ids)
            assert target.prefill(ids[:start]) == min(start, cached)  # the prefix reused
            singles = [target.decode([ids[start + j]], outputs=1, pad=False)[0] for j in range(width)]
            target.crop(start)
            rows = target.decode(ids[start : start + width], outputs=width)
            assert all(np.array_equal(rows[j], singles[j]) for j in range(width)), start
    finally:
        target.clear()


def test_each_context_keeps_a_thread_pool_whose_workers_outlive_a_decode(smol: LlamaCppBackend) -> None:
    # llama-cpp-python attaches no pool: ggml then starts and joins its workers on every decode (0.91-0.95x
    # llama-server's one-token step at 2 threads on a Zen 4 EPYC). Each context gets its own pool of the
    # load-time thread count; a pool's workers are real threads that stay until it is freed.
    import os

    from engine.backends.llamacpp import raw_bindings
    from engine.backends.llamacpp.pool import ThreadPool

    pool = smol.target.pool
    assert pool is not None and pool.handle and pool.threads >= smol.threads

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    before = tasks()
    extra = ThreadPool.attach(raw_bindings(), smol.target.ctx.ctx, 3)
    try:
        assert extra is not None
        smol.target.clear()
        smol.target.prefill(smol.encode_text("The pool keeps its workers."))
        assert tasks() == before + 2  # three threads: the caller and two workers that stay
    finally:
        # The context's own pool back, and one pass on it before the extra is freed: ggml's CPU backend pauses the
        # pool it last computed with when the next compute brings another (ggml-cpu.cpp:265-268,
        # ggml_backend_cpu_set_threadpool); freed first, that pause locked a freed mutex and a later test hung.
        pool.attach_to(raw_bindings(), smol.target.ctx.ctx)
        smol.target.clear()
        smol.target.prefill(smol.encode_text("Back."))
        if extra is not None:
            extra.close()
        smol.target.clear()
    assert tasks() == before


def test_the_pool_uses_the_ggml_that_libllama_loaded_not_a_second_copy(smol: LlamaCppBackend) -> None:
    # A pip-installed wheel holds libggml-cpu.so, .so.0, .so.0.x as separate files. libllama maps its soname; the
    # pool opening the .so file by path mapped a second copy of ggml-cpu (the pool's workers in one, the graph in
    # the other), which deadlocked in ggml_barrier once the two files differed. One file of each, by identity.
    assert smol.target.pool is not None
    mapped: dict[str, set[tuple[str, str]]] = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6:
            name = Path(fields[5]).name
            for lib in ("libggml-cpu.so", "libggml-base.so"):
                if name.startswith(lib):
                    mapped.setdefault(lib, set()).add((fields[3], fields[4]))  # (device, inode)
    assert set(mapped) == {"libggml-cpu.so", "libggml-base.so"}
    assert all(len(files) == 1 for files in mapped.values()), mapped


@pytest.mark.slow
def test_the_verify_cost_model_reads_its_ratios_at_the_pass_context(smol: LlamaCppBackend) -> None:
    # Load measured what a pass costs over 64 and 576 cached tokens; the round loop's cost model reads its
    # ratios at the context of the latest pass (a wide pass over a long chat costs more plain steps).
    costs = smol.target.costs
    assert smol.thread_control.pass_cost is not None and smol.thread_control.pass_cost.growth
    before = costs.context
    try:
        costs.context = 64
        short = costs.ratio(9)
        costs.context = 1800
        long = costs.ratio(9)
    finally:
        costs.context = before
    shape = smol.thread_control.pass_cost
    assert long / short == pytest.approx(
        (shape.predict(9, 1800) / shape.predict(1, 1800)) / (shape.predict(9, 64) / shape.predict(1, 64)),
        rel=1e-6,
    )
    assert (
        costs._shape == shape.predict
    )  # wired at load; the arithmetic itself: tests/engine/decoding/test_cost_model_context.py
    ids = chat(smol, "Tell me about the sea.")
    generate(smol, ids, k=3, max_new=8)
    assert costs.context >= len(ids)  # set by the timed passes of the reply


def test_torch_samples_on_one_thread_during_a_reply_and_gets_its_count_back(smol, monkeypatch) -> None:
    # torch's OpenMP workers spun on llama.cpp's cores after a many-row argmax: the next pass ran ~40% slower.
    seen: list[int] = []
    score = smol.target.score

    def watched(tokens):
        seen.append(torch.get_num_threads())
        return score(tokens)

    monkeypatch.setattr(smol.target, "score", watched)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        generate(smol, chat(smol, "Tell me about the sea."), k=3, max_new=8)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_stop_token_inside_an_accepted_draft(smol: LlamaCppBackend, monkeypatch) -> None:
    ids = chat(smol, REPEAT_PROMPT)
    reference = generate(smol, ids, k=0, max_new=96)
    ngram = generate(smol, ids, k=6, max_new=96)
    # Tokens the n-gram drafter proposed and the target accepted (origin True: never a round's last token), at
    # their first occurrence in the reply. The drafter adapts from round to round, so a later run may cut its
    # rounds elsewhere: try a few, and require that at least one stop really fell inside an accepted draft.
    origins = [o for c in ngram.chunks for o in c.origins]
    inside = [i for i, token in enumerate(ngram.tokens) if origins[i] and ngram.tokens.index(token) == i]
    assert inside, "the drafter must have accepted a draft holding a token's first occurrence"
    cut_inside_a_draft = 0
    for first in inside[:4]:
        stop_token = reference.tokens[first]
        monkeypatch.setattr(smol, "stop_token_ids", frozenset({stop_token}))
        monkeypatch.setattr(smol, "end_of_turn_id", stop_token)
        reply = generate(smol, ids, k=6, max_new=96)
        assert reply.tokens == reference.tokens[:first]
        assert reply.done.stop_reason == "end_of_turn"
        assert reply.text == smol.decode(reference.tokens[:first])
        assert_round_accounting(reply)
        last = reply.chunks[-1]
        # What was kept of the cut round counts as accepted, no more.
        assert last.accepted == sum(last.origins)
        cut_inside_a_draft += len(last.token_ids) < last.drafted and last.accepted == len(last.token_ids)
        plain = generate(smol, ids, k=0, max_new=96)
        assert plain.tokens == reference.tokens[:first]
    assert cut_inside_a_draft >= 1


@pytest.mark.slow
def test_prefix_reuse_across_turns_is_exact(smol: LlamaCppBackend, gguf: Path) -> None:
    first_ids = chat(smol, REPEAT_PROMPT)
    first = generate(smol, first_ids, k=5, max_new=24)
    follow_up = (
        first_ids + first.tokens + smol.encode_text("<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n")
    )
    follow_up += smol.encode_text("<|im_start|>assistant\n")
    second = generate(smol, follow_up, k=5, max_new=24)
    assert second.done.cached_tokens >= len(first_ids)
    fresh = LlamaCppBackend(gguf, draft="none", cache_mode="fp16", max_context=2048)
    fresh.load()
    try:
        assert generate(fresh, follow_up, k=0, max_new=24).tokens == second.tokens
    finally:
        fresh.close()


def test_cancel_before_and_during_generation(smol: LlamaCppBackend) -> None:
    ids = chat(smol, REPEAT_PROMPT)
    reply = generate(smol, ids, k=4, max_new=64, cancel_after=2)
    assert len(reply.chunks) == 2 and reply.done.stop_reason == "cancelled"
    request = GenerationRequest(prompt_ids=tuple(ids + [28, 29]), sampler=SamplerSettings(), max_new_tokens=8)
    cancelled = threading.Event()
    cancelled.set()
    events = list(smol.generate(request, cancelled))
    assert len(events) == 1 and events[0].stop_reason == "cancelled"


@pytest.mark.slow
def test_a_gguf_draft_model_drafts_exactly(gguf: Path, smol: LlamaCppBackend) -> None:
    backend = LlamaCppBackend(
        gguf, draft=str(gguf), cache_mode="fp16", draft_cache_mode="fp16", max_context=2048
    )
    backend.load()
    try:
        assert backend.info.draft_mode == "model"
        # One set of workers for both contexts (pool.py: two polled the same cores), freed once, by the target.
        assert backend.draft_state.pool is backend.target.pool and not backend.draft_state.owns_pool
        ids = chat(backend, PALINDROME_PROMPT)
        reply = generate(backend, ids, k=4, max_new=48)
        assert reply.tokens == generate(smol, ids, k=0, max_new=48).tokens
        assert reply.accepted / reply.drafted >= 0.8  # the model drafting for itself
        assert reply.done.draft_step_s > 0
    finally:
        backend.close()


@pytest.mark.slow
def test_context_full_stops_with_context(gguf: Path) -> None:
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=256)
    backend.load()
    try:
        ids = chat(backend, "Count from one to two hundred in words.")
        room = 256 - len(ids)
        reply = generate(backend, ids, k=5, max_new=400)
        assert reply.done.stop_reason in ("context", "end_of_turn")
        if reply.done.stop_reason == "context":
            assert len(reply.tokens) == room
        too_long = GenerationRequest(tuple(ids * 10), SamplerSettings(), 5)
        assert list(backend.generate(too_long, threading.Event())) == [
            Done("context", prompt_tokens=len(ids) * 10)
        ]
    finally:
        backend.close()


@pytest.mark.slow
def test_a_refused_crop_re_prefills_and_the_text_stays_exact(gguf: Path) -> None:
    """Recurrent and hybrid models' memory refuses to drop a tail (kv_cache_seq_rm returns False): the prefix
    is decoded again, never lost; drafting is turned off with a note, and the reply equals plain decoding."""
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=2048)
    backend.load()
    try:
        ids = chat(backend, REPEAT_PROMPT)
        reference = generate(backend, ids, k=0, max_new=48)
        target = backend.target
        target.ctx.kv_cache_seq_rm = lambda *args: False  # what llama.cpp answers for such a memory
        target.crop(len(target.ids) - 7)
        assert target.ids == (ids + reference.tokens)[: len(target.ids)] and not target.can_crop
        refused = generate(backend, ids, k=5, max_new=48)
        assert refused.tokens == reference.tokens
        assert refused.drafted == 0 and any("drafting off" in note for note in refused.done.notes)
        # A follow-up turn on the rebuilt cache continues with the whole context, not from position 0.
        follow = backend.encode_chat(
            [
                {"role": "user", "content": REPEAT_PROMPT},
                {"role": "assistant", "content": backend.decode(reference.tokens)},
                {"role": "user", "content": "Say it again."},
            ]
        )
        fresh = LlamaCppBackend(gguf, draft="none", cache_mode="fp16", max_context=2048)
        fresh.load()
        try:
            assert (
                generate(backend, follow, k=5, max_new=24).tokens
                == generate(fresh, follow, max_new=24).tokens
            )
        finally:
            fresh.close()
    finally:
        backend.close()
