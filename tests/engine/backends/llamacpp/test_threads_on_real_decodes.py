"""The thread count on the embedded GGUF: measured at load and applied to llama.cpp's context, a stall mid-reply
drops to one thread with a note, an explicit count is left alone.

Real decodes at each count; the timings that decide are planted on top of them (seconds added to what the real
decodes took), so the outcome does not depend on how busy the test machine is.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

import engine.backends.llamacpp.backend as llamacpp_module  # noqa: E402
from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.backends.llamacpp.threads import STALL_ROUNDS, StallWatch, ThreadControl  # noqa: E402
from engine.decoding.acceptance import AcceptanceAccounting  # noqa: E402
from engine.events import Chunk, Done  # noqa: E402
from engine.request import GenerationRequest, SamplerSettings  # noqa: E402
from tui.formatting import stats_line  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.all_cores]

QUESTION = "What is the capital of France? Explain briefly."


@pytest.fixture(scope="module")
def gguf() -> Path:
    from engine.models import ensure_embedded_gguf

    return ensure_embedded_gguf()


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice is between 1 and 2 threads wherever the test runs (llama.cpp runs 2 on one core too)."""
    monkeypatch.setattr(llamacpp_module, "physical_cores", lambda: 2)


def plant_measurement(monkeypatch: pytest.MonkeyPatch, slow_count: int, seen: list[int]) -> None:
    """Load-time decodes at `slow_count` threads seem 60 ms a token, the other count 10 ms; `seen` gets the thread
    count llama.cpp reported for every timed run."""
    real = ThreadControl.time_decodes

    def timed(self: ThreadControl, tokens) -> float:
        count = self.context_threads()
        seen.append(count)
        real(self, tokens)  # the decodes really run at that count; the figure that decides is planted whole,
        # so a busy test machine (where 1 thread can be 50 ms a token slower than 2 for real) cannot flip it
        return 0.06 if count == slow_count else 0.01

    monkeypatch.setattr(ThreadControl, "time_decodes", timed)


def load(gguf: Path, threads: int | None = None) -> LlamaCppBackend:
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=1024, threads=threads)
    backend.load()
    return backend


def reply(backend: LlamaCppBackend, max_new: int = 40) -> tuple[list[Chunk], Done]:
    ids = backend.encode_chat([{"role": "user", "content": QUESTION}])
    request = GenerationRequest(
        prompt_ids=tuple(ids),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=4,
        drafting=True,
        seed=0,
    )
    chunks: list[Chunk] = []
    done: list[Done] = []
    for event in backend.generate(request, threading.Event()):
        (chunks if isinstance(event, Chunk) else done).append(event)
    assert len(done) == 1
    return chunks, done[0]


def plant_normal_speed(backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real pass counts as one at normal speed from here on: a second process busy on the test machine must
    not make a reply that should run undisturbed look stalled (a fresh clone's suite failed so beside one)."""

    def generous(width: int, context: int = 0) -> float:
        return 3600.0

    monkeypatch.setattr(backend.thread_control, "predicted_cost", lambda: generous)
    if backend.thread_control.stall_watch is not None:
        backend.thread_control.stall_watch = StallWatch(generous)


def plant_stall(backend: LlamaCppBackend, at_threads: int) -> list[int]:
    """Every verify pass at `at_threads` threads seems a second slower (what a descheduled thread does); the
    thread count of each pass is recorded."""
    target = backend.target
    real = target.score
    counts: list[int] = []

    def score(tokens):
        logits = real(tokens)
        counts.append(backend.context_threads())
        if counts[-1] == at_threads:
            target.step_times[-1] += 1.0
        return logits

    target.score = score
    return counts


def test_the_faster_count_measured_at_load_is_the_one_llama_cpp_runs(
    gguf: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    plant_measurement(monkeypatch, slow_count=1, seen=seen)
    backend = load(gguf)
    try:
        assert set(seen) == {1, 2}, "both counts were really set on the context and timed"
        assert backend.threads == 2 and backend.context_threads() == 2
        assert any(n.startswith("2 threads: measured at load") for n in backend.info.notes)
        plant_normal_speed(backend, monkeypatch)
        chunks, done = reply(backend)
        assert chunks and backend.context_threads() == 2 and done.notes == ()
    finally:
        backend.close()

    seen.clear()
    plant_measurement(monkeypatch, slow_count=2, seen=seen)
    backend = load(gguf)
    try:
        assert backend.threads == 1 and backend.context_threads() == 1
        assert any(n.startswith("1 thread: measured at load") for n in backend.info.notes)
    finally:
        backend.close()


def test_a_stall_mid_reply_drops_to_one_thread_for_the_session_with_a_note(
    gguf: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant_measurement(monkeypatch, slow_count=1, seen=[])
    backend = load(gguf)
    try:
        assert backend.context_threads() == 2
        counts = plant_stall(backend, at_threads=2)
        chunks, done = reply(backend)
        assert counts[:STALL_ROUNDS] == [2] * STALL_ROUNDS
        assert set(counts[STALL_ROUNDS:]) == {1}, "from the round after the stall on, one thread"
        assert len(counts) > STALL_ROUNDS and done.stop_reason in ("eos", "end_of_turn", "max_new_tokens")
        assert len(done.notes) == 1 and done.notes[0].startswith("dropped to 1 thread")
        assert done.notes[0] in backend.info.notes
        assert not any(n.startswith("2 threads") for n in backend.info.notes)
        # The note reaches the reply's stats and the line under it.
        accounting = AcceptanceAccounting(t_start=chunks[0].t - 0.1)
        for chunk in chunks:
            accounting.add(chunk)
        stats = accounting.finish(
            done, chunks[-1].t, preset="qa", num_draft_tokens=4, temperature=0.0, draft_mode="ngram",
            backend=backend.name, model="smol",
        )  # fmt: skip
        assert stats.notes == list(done.notes)
        assert stats_line(stats).endswith(" · " + done.notes[0])
        assert backend.threads == 1 and backend.context_threads() == 1
        # From now on a reply is judged against what a pass costs at one thread (the load-time medians: one
        # thread planted 6x slower), not at the load-time count.
        measured = backend.thread_control.pass_cost.predict(1, 64)
        assert backend.thread_control.predicted_cost()(1, 64) == pytest.approx(6 * measured)
        # The rest of the session stays at one thread, and the note is the first reply's alone.
        plant_normal_speed(backend, monkeypatch)
        _, later = reply(backend)
        assert later.notes == () and backend.context_threads() == 1
    finally:
        backend.close()


def test_an_explicit_count_is_neither_measured_nor_switched_and_a_stall_is_said(
    gguf: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    plant_measurement(monkeypatch, slow_count=2, seen=seen)
    backend = load(gguf, threads=2)
    try:
        assert seen == [] and backend.threads == 2 and backend.context_threads() == 2
        assert "2 threads (set in the config)" in backend.info.notes
        counts = plant_stall(backend, at_threads=2)
        _, done = reply(backend)
        # Not switched; the stall is said under the reply instead (the count cannot drop).
        assert set(counts) == {2} and backend.context_threads() == 2
        assert len(done.notes) == 1 and done.notes[0].startswith("slow: verify passes ran")
        assert "at 2 threads (another process busy on the CPU?)" in done.notes[0]
        # A reply at normal speed says nothing.
        del backend.target.score  # the planted stall ends
        plant_normal_speed(backend, monkeypatch)
        assert reply(backend)[1].notes == ()
    finally:
        backend.close()


def test_a_count_measured_by_another_backend_is_taken_as_measured_with_the_guard_armed(
    gguf: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench's variants (ours-plain and ours-draft are two backends): the second takes the first's measured
    # count as its own, not as a count set in the config, so a stall drops both alike.
    seen: list[int] = []
    plant_measurement(monkeypatch, slow_count=1, seen=seen)
    first = load(gguf)
    seen.clear()
    second = LlamaCppBackend(
        gguf,
        draft="ngram",
        cache_mode="fp16",
        max_context=1024,
        thread_choice=first.thread_control.thread_choice,
    )
    second.load()
    try:
        assert seen == [], "not measured again"
        assert second.threads == first.threads == 2 and second.context_threads() == 2
        assert any(n.startswith("2 threads: measured at load") for n in second.info.notes)
        assert "2 threads (set in the config)" not in second.info.notes
        counts = plant_stall(second, at_threads=2)
        _, done = reply(second)
        assert set(counts[STALL_ROUNDS:]) == {1} and done.notes[0].startswith("dropped to 1 thread")
    finally:
        second.close()
        first.close()


def one_token_cost(target, prompt: list[int], cached: int) -> float:
    """The best of 7 one-token passes after `cached` tokens of `prompt` (timed here: time_decodes is planted)."""
    target.prefill(prompt[:cached])
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        target.decode(prompt[cached : cached + 1], outputs=1)
        best = min(best, time.perf_counter() - start)
        target.crop(cached)
    return best


def long_document(backend: LlamaCppBackend, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: a log of numbered entries to summarize (what a user pastes)."""
    crops = ("barley", "rye", "beans", "flax", "turnips", "oats", "hops")
    entries: list[str] = []
    ids: list[int] = []
    while len(ids) < tokens:
        i = len(entries) + 1
        entries.append(
            f"Day {i}: the north field was weeded before noon; {crops[i % 7]} looked {('dry', 'fair', 'good')[i % 3]} "
            f"and {i % 4 + 2} carts of it went to the mill at {i % 5 + 7} in the morning."
        )
        text = "Here is the farm log.\n\n" + "\n".join(entries) + "\n\nSummarize the log in three sentences."
        ids = backend.encode_chat([{"role": "user", "content": text}])
    return ids


def test_a_long_context_alone_keeps_the_threads_and_a_stall_there_still_drops(
    gguf: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a pass over ~3,000 cached tokens was judged against the one-token cost over 64 measured at load:
    # 4x slower on an idle machine, read as a busy CPU, and the session went down to one thread.
    plant_measurement(monkeypatch, slow_count=1, seen=[])
    backend = LlamaCppBackend(gguf, draft="ngram", cache_mode="fp16", max_context=4096)
    backend.load()
    try:
        assert backend.context_threads() == 2 and backend.thread_control.pass_cost is not None
        assert backend.thread_control.pass_cost.growth, "load timed passes over a longer context too"
        prompt = long_document(backend, 3000)
        target = backend.target
        # What a one-token pass over this context and over 64 tokens really cost here (best of several: what the
        # machine does when nothing disturbs it), against what the guard predicts for each.
        short = one_token_cost(target, prompt, 64)
        idle = one_token_cost(target, prompt, len(prompt) - 1)
        predicted_cost = backend.thread_control.predicted_cost()
        predicted = predicted_cost(1, len(prompt) - 1)
        # Never under half the real cost (then a pass at idle speed stays far below the 4x of a stall; before, a
        # long context was predicted at its 64-token cost, ~1/4 of it); a load-time figure that another process
        # inflated may predict more (seen: 0.31x on a machine at load average 15; 0.1x beside a busy process, whose
        # load-time passes took 3 s), never absurdly more. Where a process busy beside the whole test slows every
        # pass measured here against timings stored on an idle machine (seen: 2.8x), the growth with the context
        # must still be predicted within the same bounds (the old prediction grew by 1x where the cost grew ~4x).
        growth, predicted_growth = idle / short, predicted / predicted_cost(1, 64)
        assert 0.05 < idle / predicted < 2.0 or 0.05 < growth / predicted_growth < 2.0, (
            idle,
            predicted,
            growth,
            predicted_growth,
        )

        judged: list[float] = []
        dropped_at: list[int] = []
        real_on_round = backend.thread_control.on_round

        def on_round(seconds, width, notes, busy=None):
            watching = backend.thread_control.stall_watch is not None
            real_on_round(seconds, width, notes, busy)
            # The pass against this context's idle cost, scaled to its width as the guard scales it.
            judged.append(
                target.step_times[-1]
                / (idle * backend.thread_control.predicted_cost()(width, target.pass_context) / predicted)
            )
            if watching and backend.thread_control.stall_watch is None:
                dropped_at.append(len(judged))

        monkeypatch.setattr(backend.thread_control, "on_round", on_round)
        request = GenerationRequest(
            prompt_ids=tuple(prompt),
            sampler=SamplerSettings(temperature=0.0),
            max_new_tokens=32,
            num_draft_tokens=4,
            drafting=True,
            seed=0,
        )
        done = [e for e in backend.generate(request, threading.Event()) if isinstance(e, Done)][0]
        if dropped_at:
            # Another process took a core during the test (this machine is shared): the drop must rest on passes
            # far slower than this context's idle cost, not on the context itself.
            stalled = judged[dropped_at[0] - STALL_ROUNDS : dropped_at[0]]
            assert min(stalled) > 2, (stalled, idle)
        else:
            assert done.notes == () and backend.context_threads() == 2
        # Another process taking a core at that length is a stall: every pass at 2 threads seems 5x what the guard
        # predicts for it (relative, so that a busy test machine's load-time figures cannot hide it).
        backend.set_threads(2)
        backend.thread_control.stall_watch = StallWatch(backend.thread_control.predicted_cost())
        real_score = target.score
        counts: list[int] = []

        def score(tokens):
            logits = real_score(tokens)
            counts.append(backend.context_threads())
            if counts[-1] == 2:
                target.step_times[-1] += 5 * backend.thread_control.predicted_cost()(
                    len(tokens), target.pass_context
                )
            return logits

        target.score = score
        done = [e for e in backend.generate(request, threading.Event()) if isinstance(e, Done)][0]
        assert counts[:STALL_ROUNDS] == [2] * STALL_ROUNDS and set(counts[STALL_ROUNDS:]) == {1}
        assert len(done.notes) == 1 and done.notes[0].startswith("dropped to 1 thread")
    finally:
        backend.close()
