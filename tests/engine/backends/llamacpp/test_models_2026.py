"""The architectures of 2026 on llama.cpp: hybrid models (Gated DeltaNet layers beside attention) whose recurrent
state rolls back natively (Qwen3.5) or only through checkpoints (Qwen3-Next), and mixture of experts (Qwen3-MoE).

Tiny random models built from transformers' own classes and converted with the vendored llama.cpp converter
(tests/support/models_2026.py). A random model does not copy its prompt, so drafting is driven by an oracle
drafter that proposes the plain reply's own tokens with one token wrong at a position that moves every round:
rejections at every depth, rounds wider than the rollback depth, and full acceptances.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest
import torch

import engine.decoding.adaptive_k as adaptive_k
import engine.decoding.round_loop as round_loop
from engine.backends.llamacpp.backend import LlamaCppBackend
from engine.backends.llamacpp.memory import ROLLBACK_DEPTH
from engine.decoding.drafters import Plan, common_prefix
from tests.support.models_2026 import gguf_2026
from tests.support.replies import generate
from tests.support.threads import fixed_threads

pytestmark = pytest.mark.slow

PROMPT = "Write a function that adds two numbers, then explain it in one sentence."
FOLLOW_UP = "Now make it subtract."
EDITED = "Now make it multiply, please."


@pytest.fixture(scope="module")
def qwen35(smol_dir: Path) -> Path:
    return gguf_2026("qwen35", smol_dir)


@pytest.fixture(scope="module")
def qwen3next(smol_dir: Path) -> Path:
    return gguf_2026("qwen3next", smol_dir)


@pytest.fixture(scope="module")
def qwen3moe(smol_dir: Path) -> Path:
    return gguf_2026("qwen3moe", smol_dir)


@pytest.fixture(scope="module")
def gptoss(smol_dir: Path) -> Path:
    return gguf_2026("gptoss", smol_dir)


def load(path: Path, rollback: bool | None = None) -> LlamaCppBackend:
    # Threads as given (no thread measuring at load): the tests check behaviour, not speed.
    backend = LlamaCppBackend(
        path, draft="ngram", cache_mode="fp16", max_context=2048, threads=fixed_threads(), rollback=rollback
    )
    backend.load()
    return backend


class OracleDrafter:
    """Drafts the plain reply's own next tokens, the `round % (k + 1)`-th of them wrong (none when that is k)."""

    name = "ngram"
    costs = None

    def __init__(self, prompt: list[int], reference: list[int], vocab: int) -> None:
        self.prompt, self.reference, self.vocab = prompt, reference, vocab
        self.rounds = 0
        self.step_times: list[float] = []

    def begin(self, prompt, cancel) -> None:
        self.rounds = 0

    def plan(self, k: int, k_long: int) -> Plan:
        return Plan(self, k=max(k, k_long), rate=0.9)

    def draft(self, plan: Plan, seq) -> list[int]:
        done = len(seq) - len(self.prompt)
        drafts = list(self.reference[done : done + plan.k])
        wrong = self.rounds % (plan.k + 1)
        self.rounds += 1
        if wrong < len(drafts):
            drafts[wrong] = (drafts[wrong] + 1) % self.vocab
        return drafts

    def accept(self, drafted: int, accepted: int) -> None:
        pass

    def extend(self, token_ids) -> None:
        pass

    def end(self, kept) -> None:
        pass


def oracle_reply(backend, monkeypatch, ids, reference, k: int, **sampler):
    oracle = OracleDrafter(ids, reference, backend.target.n_vocab)
    monkeypatch.setattr(round_loop, "build_drafters", lambda mode, context: [oracle])
    try:
        return generate(backend, ids, k=k, max_new=len(reference), **sampler)
    finally:
        monkeypatch.undo()


def chat_ids(backend, *turns: str) -> list[int]:
    roles = ["user", "assistant"]
    return backend.encode_chat([{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)])


def test_the_load_note_and_doctor_say_how_each_model_speculates(qwen35, qwen3next, qwen3moe) -> None:
    from engine.benchmarks.doctor.model_runs import check_architecture
    from engine.benchmarks.doctor.report import DoctorReport

    expected = {
        qwen35: ("qwen35", "checkpoints", 0, 0),  # n-gram drafting: checkpoints (no per-step snapshots)
        qwen3next: ("qwen3next", "checkpoints", 0, 4),
        qwen3moe: ("qwen3moe", "attention", 0, 8),
    }
    for path, (arch, memory, depth, experts) in expected.items():
        backend = load(path)
        try:
            shape = backend.shape
            assert (shape.arch, shape.memory, shape.rollback_depth, shape.experts) == (
                arch,
                memory,
                depth,
                experts,
            )
            assert shape.mtp_layers == 0 and "no MTP layers" in shape.describe()
            assert shape.describe() in backend.info.notes  # the chat's load notes
            if path == qwen35:  # it has native rollback; n-gram drafting does not ask for it
                assert "asked for only with a draft model or MTP head" in shape.describe()
            if path == qwen3next:
                assert "no native rollback for qwen3next" in shape.describe()
            report = DoctorReport()
            check_architecture(report, backend)
            assert report.checks[-1].reason == shape.describe()  # doctor says the same line
        finally:
            backend.close()


@pytest.mark.parametrize(
    ("which", "rollback"),
    [("qwen35", True), ("qwen35", False), ("qwen3next", None)],
    ids=["native-rollback", "checkpoints", "qwen3next-checkpoints"],
)
def test_a_hybrid_drafts_exactly_at_every_depth(which, request, monkeypatch, rollback) -> None:
    """Greedy and seeded: the reply with drafts rejected at every depth (up to 40) equals plain decoding. With
    native rollback (16 snapshots) tails within the depth roll back and longer ones restore a checkpoint and replay;
    with checkpoints only (n-gram drafting's default) every rejection restores and replays. Nothing is prefilled
    again. Qwen3-Next (no native rollback; a mixture of experts whose float32 shared-expert gate once rounded a
    2-row pass otherwise, which kept drafting off) drafts through checkpoints."""
    backend = load(request.getfixturevalue(which), rollback=rollback)
    try:
        assert backend.target.memory.depth == (ROLLBACK_DEPTH if rollback else 0)
        assert backend.probe.widest >= 41 and not backend.probe.pad, backend.probe.describe()
        ids = chat_ids(backend, PROMPT)
        for sampler in ({}, {"temperature": 0.8, "top_p": 0.95}):
            reference = generate(backend, ids, k=0, max_new=160, seed=7, **sampler)
            counters = backend.target.memory.counters
            before = counters.as_dict()
            spec = oracle_reply(backend, monkeypatch, ids, reference.tokens, k=40, seed=7, **sampler)
            assert spec.tokens == reference.tokens
            assert spec.drafted > 0 and spec.accepted > 0
            assert max(c.drafted for c in spec.chunks) > ROLLBACK_DEPTH  # wide rounds really sent
            assert (counters.rollbacks > before["rollbacks"]) == bool(rollback)
            assert counters.restores > before["restores"] and counters.replayed > before["replayed"]
            assert counters.reprefilled == before["reprefilled"] == 0
            assert list(backend.target.ids) == (ids + reference.tokens)[: len(backend.target.ids)]
    finally:
        backend.close()


@pytest.mark.parametrize("which", ["qwen35", "qwen3next"])
def test_padded_plain_steps_on_a_recurrent_memory_never_re_prefill(which, request) -> None:
    """The old hang: a padded one-token step cropped its throw-away position, a recurrent memory re-prefilled,
    whose one-token last slice was padded again... Now the throw-away row is dropped by a rollback or a
    checkpoint: 560 padded steps (past 513 cached positions) run with nothing prefilled again."""
    backend = load(request.getfixturevalue(which), rollback=True)  # qwen3next has none: checkpoints
    try:
        target = backend.target
        assert target.memory.depth == (ROLLBACK_DEPTH if which == "qwen35" else 0)
        target.pad_single = True
        ids = chat_ids(backend, PROMPT)
        target.clear()
        target.prefill(ids)
        token = ids[-1]
        start = time.perf_counter()
        for _ in range(560):
            logits = target.decode([token], outputs=1)
            token = int(logits[0].argmax())
        elapsed = time.perf_counter() - start
        assert len(target.ids) == len(ids) + 560 > 513
        assert target.memory.counters.reprefilled == 0
        # The re-prefill count is the check; the time only says the loop ended in a sane time, generous enough for
        # a machine someone else is using (a re-prefill per step took ~0.2 s per 1,000 cached tokens, alone).
        assert elapsed < 300, f"560 padded steps took {elapsed:.1f} s"
    finally:
        backend.close()


def test_a_regenerate_and_an_edited_question_replay_at_most_the_new_turn(qwen3next) -> None:
    """A model without native rollback: regenerating restores the checkpoint at the prompt's end (nothing
    decoded again), and an edited last question replays at most that turn, not the conversation."""
    backend = load(qwen3next)
    try:
        counters = backend.target.memory.counters
        first = chat_ids(backend, PROMPT)
        reply = generate(backend, first, k=0, max_new=40)
        second = chat_ids(backend, PROMPT, backend.decode(reply.tokens), FOLLOW_UP)
        # The new turn starts where the cached conversation (prompt + reply) and the next prompt part: the
        # template closes the reply and opens the user's turn there.
        turn_start = common_prefix(backend.target.ids, second)
        assert turn_start >= len(first) - 1
        answer = generate(backend, second, k=0, max_new=40)
        replayed = counters.replayed
        again = generate(backend, second, k=0, max_new=40)  # regenerate
        assert again.tokens == answer.tokens
        assert again.done.cached_tokens == len(second) - 1 and counters.replayed == replayed
        edited = chat_ids(backend, PROMPT, backend.decode(reply.tokens), EDITED)
        generate(backend, edited, k=0, max_new=8)
        assert 0 < counters.replayed - replayed <= len(edited) - turn_start
        assert counters.reprefilled == 0
    finally:
        backend.close()


@pytest.mark.parametrize("which", ["qwen3moe", "gptoss"])
def test_a_mixture_of_experts_model_is_exact_at_every_width(which, request, monkeypatch) -> None:
    """Every width up to the widest the loop sends is proven, and wide rounds (many tokens routed to one expert)
    equal plain decoding. gpt-oss adds attention sinks over a float16 cache (stock llama.cpp's tiled attention
    takes such passes of 64 rows and more over <= 256 cells; the patch keeps every pass in its fixed chunks) and
    sliding-window layers."""
    backend = load(request.getfixturevalue(which))
    try:
        # every width, and one-token plain steps (its float32 router once rounded a 2-row pass otherwise)
        assert backend.probe.widest == backend.probe.checked and not backend.probe.pad
        ids = chat_ids(backend, PROMPT)
        reference = generate(backend, ids, k=0, max_new=120)
        spec = oracle_reply(backend, monkeypatch, ids, reference.tokens, k=40)
        assert spec.tokens == reference.tokens and max(c.drafted for c in spec.chunks) > 16
    finally:
        backend.close()


@pytest.mark.parametrize("kind", ["qwen3moe", "olmoe"])
def test_a_quantized_mixture_of_experts_model_proves_every_width(smol_dir, kind) -> None:
    """Q4_K_M experts: stock llama.cpp takes the tiled kernel from 8 tokens routed to one expert (the probe proved
    widths 2-7 only); the patched build keeps passes of up to 64 tokens off it. Qwen3-MoE and OLMoE (its QK norms
    over the whole width, 8 experts, top 2)."""
    from engine.backends.llamacpp.library import patched_build

    if not patched_build():
        pytest.skip(
            "the stock llama.cpp build (the patch did not apply): its tiled expert kernel rounds otherwise"
        )
    backend = load(gguf_2026(kind, smol_dir, quant="Q4_K_M"))
    try:
        assert backend.shape.experts == 8 and backend.shape.experts_used == 2
        assert backend.probe.widest == backend.probe.checked, backend.probe.describe()
    finally:
        backend.close()


@pytest.fixture(scope="module")
def qwen35mtp(smol_dir: Path) -> Path:
    return gguf_2026("qwen35mtp", smol_dir)


def load_mtp(path: Path) -> LlamaCppBackend:
    backend = LlamaCppBackend(path, draft="mtp", cache_mode="fp16", max_context=2048, threads=fixed_threads())
    backend.load()
    return backend


@pytest.mark.parametrize(
    ("kind", "quant"), [("qwen35mtp", "F16"), ("qwen35moemtp", "F16"), ("qwen35moemtp", "Q4_K_M")]
)
def test_the_mtp_head_drafts_on_llama_cpp_and_the_reply_stays_exact(
    smol_dir, kind, quant, monkeypatch
) -> None:
    """--draft mtp on a GGUF with an MTP layer: the head (a second context on the target's model) drafts every
    round, greedy and seeded replies equal plain decoding, and the head's cache follows the target's. Also on
    Qwen3.5's hybrid mixture of experts (native rollback, experts routed anew in every pass), F16 and Q4_K_M."""
    from engine.backends.llamacpp.pool import ThreadPool

    attached: list[tuple[int, int]] = []
    real_attach = ThreadPool.attach_to

    def spy(pool, raw, ctx) -> None:
        attached.append((pool.handle, ctx))
        real_attach(pool, raw, ctx)

    monkeypatch.setattr(ThreadPool, "attach_to", spy)
    backend = load_mtp(gguf_2026(kind, smol_dir, quant=quant))
    try:
        # The head computes on the target's workers (pool.py: with a set of its own, a 2 ms step ran 13-40 ms).
        assert (backend.target.pool.handle, backend.draft_state.ctx.ctx) in attached
        assert backend.shape.mtp_layers == 1 and "1 MTP layer" in backend.shape.describe()
        assert backend.shape.moe == (kind == "qwen35moemtp") and backend.shape.memory == "rollback"
        assert backend.probe.widest == backend.probe.checked and not backend.probe.pad
        assert backend.info.draft_model == "MTP head" and backend.target.mtp is backend.draft_state
        ids = chat_ids(backend, PROMPT)
        for sampler in ({}, {"temperature": 0.8, "top_p": 0.95}):
            plain = generate(backend, ids, k=0, max_new=60, seed=3, **sampler)
            spec = generate(backend, ids, k=4, max_new=60, seed=3, **sampler)
            assert spec.tokens == plain.tokens
            assert spec.drafted > 0 and {c.drafter for c in spec.chunks if c.drafted} == {"mtp"}
            head, target = backend.draft_state, backend.target
            assert head.ids == target.ids  # no draft left behind, nothing missing
        assert spec.done.draft_step_s > 0
    finally:
        backend.close()


def test_the_mtp_head_pairs_each_token_with_the_hidden_row_before_it(qwen35mtp) -> None:
    """The head's rows pair token q with the target's hidden row of q - 1, across the target's batches: a prompt
    prefilled in one pass or stepped one token at a time leaves the head drafting the same tokens (a head that
    lost the row at a batch's edge drafts from zeros there), and the row matters (zeros give other logits)."""
    backend = load_mtp(qwen35mtp)
    try:
        head, target = backend.draft_state, backend.target
        ids = chat_ids(backend, PROMPT)

        def drafts_after(feed) -> list[int]:
            target.clear()
            feed()
            drafted = [int(head.next_logits([ids[-1]]).argmax())]
            for _ in range(3):
                drafted.append(int(head.next_logits([drafted[-1]]).argmax()))
            return drafted

        at_once = drafts_after(lambda: target.prefill(ids[:-1]))
        stepped = drafts_after(lambda: [target.decode([t], outputs=0) for t in ids[:-1]])
        assert at_once == stepped
        target.clear()
        target.prefill(ids[:-1])
        real = head.next_logits([ids[-1]])
        head.crop(len(ids) - 1)
        head.hidden.clear()  # what a head that never got the target's rows would see
        assert not torch.equal(real, head.next_logits([ids[-1]]))
    finally:
        backend.close()


def test_a_probe_after_a_long_prompt_feeds_the_head_its_last_tokens_only_and_the_reply_stays_exact(
    qwen35mtp, monkeypatch
) -> None:
    """Where no K pays, a probe lets the head skip all but the last MTP_PROBE_WINDOW tokens it lags behind (its
    cache emptied, restarted at that position: llama.cpp takes any start in an empty memory); the reply still
    equals plain decoding and the head follows the target again after it."""
    from engine.backends.llamacpp.mtp import MtpHead
    from engine.decoding.drafters.mtp import MTP_PROBE_WINDOW

    skips: list[tuple[int, int]] = []
    real = MtpHead.skip_behind

    def spy(head, keep: int) -> None:
        behind = len(head.ids) - head.done
        real(head, keep)
        skips.append((behind, len(head.ids) - head.done))

    monkeypatch.setattr(MtpHead, "skip_behind", spy)
    # The tiny model's wide passes cost too much for any draft to pay, so no probe would go out at all; and a probe
    # every 8 rounds whatever it costs (no PROBE_BUDGET), so that one goes out within the reply.
    monkeypatch.setattr(adaptive_k, "drafting_can_pay", lambda costs, k: True)
    monkeypatch.setattr(adaptive_k, "PROBE_BUDGET", math.inf)
    backend = load_mtp(qwen35mtp)
    try:
        # The random head: nothing accepted, so adaptive K turns drafting off.
        generate(backend, chat_ids(backend, PROMPT), k=4, max_new=60, seed=3, k_mode="adaptive")
        for tuner in backend.tuners.values():
            assert tuner.plan(4, backend.target.costs)[0] == 0  # drafting off: only probes go out
            tuner.interval = tuner.probe_interval = 8
        # Words in no order the context's n-gram could draft from (its plan would win the rounds, not a probe's).
        pick = random.Random(5).choice
        words = [
            "apple",
            "river",
            "stone",
            "quiet",
            "orange",
            "seven",
            "window",
            "cloud",
            "paper",
            "green",
            "shadow",
            "silver",
            "north",
            "candle",
        ]
        long = chat_ids(backend, PROMPT, "Here it is.", " ".join(pick(words) for _ in range(320)))
        assert len(long) > 300
        spec = generate(backend, long, k=4, max_new=48, seed=3, k_mode="adaptive")
        plain = generate(backend, long, k=0, max_new=48, seed=3)
        assert spec.tokens == plain.tokens and spec.drafted > 0
        # the first reply's probes lagged less than the window (nothing skipped); the long prompt's was skipped
        assert any(behind > 300 and left == MTP_PROBE_WINDOW for behind, left in skips), skips
        head = backend.draft_state
        assert head.ids == backend.target.ids
    finally:
        backend.close()


def test_mtp_on_a_gguf_without_mtp_layers_is_one_line(qwen35) -> None:
    from engine.errors import BackendError

    with pytest.raises(
        BackendError, match=r"^--draft mtp: .*has no MTP layers \(llama_model_n_layer_nextn is 0\)"
    ):
        load_mtp(qwen35)


def test_auto_runs_draft_mtp_on_a_gguf_with_llama_cpp(qwen35mtp) -> None:
    from engine.backends.select import create_backend
    from tests.support.settings import backend_settings

    backend, why = create_backend(backend_settings(qwen35mtp, "auto", draft="mtp", threads=fixed_threads()))
    assert isinstance(backend, LlamaCppBackend) and backend.use_mtp and why.endswith("-> llama.cpp")
