"""The backend contract (engine/backends/base.py), one suite run against every engine: the scripted backend,
transformers and llama.cpp on a tiny model built to copy, the ExLlamaV2 and ExLlamaV3 stand-ins, the remote backend
on a recorded vLLM server (tests/support/contract_engines.py builds them; a new engine adds itself to `ENGINES` there).

Each engine streams Chunks then exactly one Done; a cancel ends the reply at once with "cancelled"; greedy
speculation gives plain decoding's reply; a stop token ends the reply and its text is not in it; a request past the
context ends cleanly, as each engine says it does (`ContractEngine.at_limit` / `past_limit`), and the engine answers
the next request as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from engine.backends.base import Backend
from engine.errors import BackendError
from engine.events import Chunk, Done
from engine.request import GenerationRequest
from tests.support.contract_engines import ENGINES, SLOW, ContractEngine, build
from tests.support.replies import ChunkTotals

K = 4  # drafts a round where drafting is on


@pytest.fixture(
    scope="module",
    params=[pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in ENGINES],
)
def engine(request: pytest.FixtureRequest) -> Iterator[ContractEngine]:
    """Each engine once for the module (pytest runs one engine's tests together)."""
    built = build(request.param, request)
    yield built
    built.close()


@dataclass
class Stream(ChunkTotals):
    events: list[Chunk | Done]
    after_cancel: int = 0  # chunks that came after the cancel was set

    @property
    def chunks(self) -> list[Chunk]:
        return [e for e in self.events if isinstance(e, Chunk)]

    @property
    def done(self) -> Done:
        return self.events[-1]  # type: ignore[return-value]


def stream(
    engine: ContractEngine,
    request: GenerationRequest,
    cancel_after: int | None = None,
    cancelled: bool = False,
) -> Stream:
    """Every event of one reply; the cancel set after `cancel_after` chunks, or before the reply (`cancelled`)."""
    cancel = threading.Event()
    if cancelled:
        cancel.set()
    result = Stream([])
    for event in engine.backend.generate(request, cancel):
        result.events.append(event)
        if isinstance(event, Chunk):
            if cancel.is_set():
                result.after_cancel += 1
            elif cancel_after is not None and len(result.chunks) >= cancel_after:
                cancel.set()
    assert result.events, "a reply ends with a Done, never with nothing"
    assert all(isinstance(e, Chunk) for e in result.events[:-1]), "only Chunks before the Done"
    assert isinstance(result.events[-1], Done), "the last event is the Done"
    return result


def assert_answers_as_before(engine: ContractEngine) -> None:
    """The engine answers the next request as it did before (nothing left behind by a cancel or a refusal)."""
    again = stream(engine, engine.request(engine.copy_prompt, k=K))
    assert again.text == engine.reply_text
    assert again.done.stop_reason == engine.stop_reason


def assert_one_line(error: BackendError) -> None:
    message = str(error)
    assert message and "\n" not in message and "context" in message


# --- 1. Chunks, then exactly one Done ----------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, K])
def test_chunks_then_exactly_one_done_whose_counts_add_up(engine: ContractEngine, k: int) -> None:
    assert isinstance(engine.backend, Backend)
    request = engine.request(engine.copy_prompt, k=k)
    reply = stream(engine, request)
    assert reply.chunks
    assert sum(isinstance(e, Done) for e in reply.events) == 1
    for chunk in reply.chunks:
        assert 0 <= chunk.accepted <= chunk.drafted
    done = reply.done
    assert done.prompt_tokens == len(request.prompt_ids)
    assert 0 <= done.cached_tokens <= done.prompt_tokens
    if engine.token_ids:
        for chunk in reply.chunks:
            assert len(chunk.token_ids) == len(chunk.origins) >= 1
            assert sum(chunk.origins) == chunk.accepted  # the drafts it kept are the tokens marked drafted
        assert engine.backend.decode(reply.tokens) == reply.text
        assert sum(c.n_tokens for c in reply.chunks) == len(reply.tokens)
        if k == 0:
            assert reply.drafted == 0
    else:  # a server sends text and counts: the counts add up to the server's own
        assert all(c.token_ids == () and c.origins == () for c in reply.chunks)
        assert done.server is not None
        assert sum(c.n_tokens for c in reply.chunks) == done.server.new_tokens > 0


# --- 2. cancel -----------------------------------------------------------------------------------------------


def test_a_cancel_after_the_first_chunk_ends_the_reply_at_once(engine: ContractEngine) -> None:
    request = engine.request(engine.long_prompt, k=0, max_new=16)
    whole = stream(engine, request)
    assert len(whole.chunks) > 2 and whole.done.stop_reason != "cancelled"
    cut = stream(engine, request, cancel_after=1)
    assert cut.done.stop_reason == "cancelled"
    assert cut.after_cancel == 0, f"{cut.after_cancel} chunks came after the cancel"
    assert len(cut.chunks) == 1 and cut.text == whole.chunks[0].text
    assert sum(isinstance(e, Done) for e in cut.events) == 1
    # A cancel set before the reply starts: no Chunk, only the Done (or one round, where the engine says so).
    before = stream(engine, request, cancelled=True)
    assert before.done.stop_reason == "cancelled"
    assert len(before.chunks) <= (0 if engine.cancel_before_first_round else 1)
    assert_answers_as_before(engine)


# --- 3. greedy speculation equals plain decoding -----------------------------------------------------------


def test_greedy_speculative_equals_plain(engine: ContractEngine) -> None:
    plain = stream(engine, engine.request(engine.copy_prompt, k=0))
    drafted = stream(engine, engine.request(engine.copy_prompt, k=K))
    assert drafted.text == plain.text == engine.reply_text
    if engine.token_ids:
        assert drafted.tokens == plain.tokens
        assert plain.drafted == 0
        # Drafting really ran: drafts were proposed and accepted (the prompt has the reply to copy).
        assert drafted.accepted > 0
        assert len(drafted.chunks) < len(plain.chunks)
    else:
        # The server drafts by its own settings: what the client can hold to is that it asks the same either
        # way, but for the draft length where the server takes one (then plain asks for none).
        assert engine.sent is not None
        with_k, without = engine.sent()[-1], engine.sent()[-2]

        def asked(body: dict) -> dict:
            return {key: value for key, value in body.items() if not key.startswith("speculative.")}

        assert asked(with_k) == asked(without)
        assert without.get("speculative.n_max", 0) == 0


# --- 4. stop tokens ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, K])
def test_a_stop_token_ends_the_reply_and_its_text_is_not_in_it(engine: ContractEngine, k: int) -> None:
    reply = stream(engine, engine.request(engine.copy_prompt, k=k, max_new=48))
    assert reply.done.stop_reason == engine.stop_reason
    assert reply.done.stop_reason in ("end_of_turn", "eos")
    assert reply.text == engine.reply_text
    if engine.token_ids:
        assert reply.tokens == list(engine.reply_ids or ())
        assert len(reply.tokens) < 48
        if engine.stop_id is not None:
            assert engine.stop_id not in reply.tokens
    if engine.stop_text is not None:
        assert engine.stop_text not in reply.text


# --- 5. the context limit ------------------------------------------------------------------------------------

ROOM = 8  # positions the prompt leaves free


def test_a_reply_that_would_pass_the_context_ends_cleanly(engine: ContractEngine) -> None:
    prompt = engine.fill(engine.max_context - ROOM)
    assert len(prompt) == engine.max_context - ROOM
    request = engine.request(prompt, k=K, max_new=engine.max_context)
    if engine.at_limit == "refused":
        with engine.refusing(), pytest.raises(BackendError) as info:
            stream(engine, request)
        assert_one_line(info.value)
    else:
        reply = stream(engine, request)
        if engine.at_limit == "stops":
            assert reply.done.stop_reason == "context"
            used = len(prompt) + len(reply.tokens)
            # Full, but for at most the K positions a round may need for its drafts.
            assert engine.max_context - K <= used <= engine.max_context
        else:  # "unchecked": the engine replies as if the context were endless
            assert reply.done.stop_reason == engine.stop_reason and reply.text == engine.reply_text
            assert len(prompt) + len(reply.tokens) > engine.max_context
    assert_answers_as_before(engine)


def test_a_prompt_that_fills_the_context_ends_cleanly(engine: ContractEngine) -> None:
    prompt = engine.fill(engine.max_context + 3)
    request = engine.request(prompt, k=K, max_new=48)
    if engine.past_limit == "refused":
        with engine.refusing(), pytest.raises(BackendError) as info:
            stream(engine, request)
        assert_one_line(info.value)
    else:
        reply = stream(engine, request)
        if engine.past_limit == "done":
            assert reply.events == [reply.done]
            assert reply.done.stop_reason == "context" and reply.done.prompt_tokens == len(prompt)
        else:  # "unchecked"
            assert reply.done.stop_reason == engine.stop_reason and reply.text == engine.reply_text
    assert_answers_as_before(engine)
