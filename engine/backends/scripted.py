"""A real Backend that streams predetermined replies: for TUI tests, demos and the UI benchmark.

It honours the whole contract (load, encode_chat, decode, generate with cancel, close) with a tiny word-level
tokenizer, so `ChatSession` runs unchanged on top of it. What it does not do is think: each `generate` streams
the next scripted reply, split into verification rounds whose accepted counts follow `accept_pattern`, at a
chosen token rate. Replies, acceptance and timings are therefore exactly reproducible.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from engine.backends.base import ProgressCallback
from engine.errors import BackendError
from engine.events import BackendInfo, Chunk, Done
from engine.request import GenerationRequest

# A token is a run of whitespace followed by a run of non-space characters, or trailing whitespace alone:
# joining the pieces gives back the text exactly, so decode(encode(text)) == text.
_TOKEN_RE = re.compile(r"\s*\S+|\s+")

DEFAULT_REPLY = (
    "Here is a small example.\n\n"
    "```python\n"
    "def greet(name):\n"
    "    return f'hello {name}'\n"
    "```\n\n"
    "It returns a greeting for `name`."
)


def scripted_words(count: int, width: int = 12, paragraph_lines: int = 0, code_every: int = 0) -> str:
    """`count` word tokens in lines of `width` words: a long reply for streaming benchmarks.

    `paragraph_lines` > 0 puts a blank line after that many lines (prose has paragraphs); `code_every` > 0
    turns every n-th paragraph into a fenced Python block, so the stream also exercises code highlighting.
    """
    words = [f"word{i}" for i in range(count)]
    lines = [" ".join(words[i : i + width]) for i in range(0, count, width)]
    if paragraph_lines <= 0:
        return "\n".join(lines)
    paragraphs = []
    for number, start in enumerate(range(0, len(lines), paragraph_lines), start=1):
        block = lines[start : start + paragraph_lines]
        if code_every and number % code_every == 0:
            body = "\n".join(f"    {line.replace(' ', ' = ', 1)}" for line in block)
            paragraphs.append(f"```python\ndef f{number}():\n{body}\n```")
        else:
            paragraphs.append("\n".join(block))
    return "\n\n".join(paragraphs)


class ScriptedBackend:
    """Streams `replies` in turn (cycling), `accept_pattern[i]` drafts accepted in round i (capped at K), drafted
    by `drafter_pattern[i]` where given (the round's `Chunk.drafter`).

    `tokens_per_s` paces the stream (0 = as fast as possible). `clock` supplies the `Chunk.t` timestamps; pass
    a fake clock to freeze timings for snapshots. `gate`, when given, is waited on before each round after the
    first `gate_after_rounds` rounds: tests hold a reply mid-stream by leaving it clear. `load_error` makes
    `load()` fail with that message, as a missing model would.
    """

    name = "scripted"

    def __init__(
        self,
        replies: Sequence[str] | str = (DEFAULT_REPLY,),
        *,
        accept_pattern: Sequence[int] = (3, 1, 4, 0, 2, 4),
        tokens_per_s: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
        gate: threading.Event | None = None,
        gate_after_rounds: int = 0,
        load_error: str | None = None,
        load_delay_s: float = 0.0,
        prefill_s: float = 0.0,
        max_context: int = 2048,
        model: str = "scripted-model",
        device: str = "cpu",
        cache_mode: str = "fp16",
        draft_mode: str = "ngram",
        costs: Any = None,
        drafter_pattern: Sequence[str | None] = (),
    ) -> None:
        self.replies = [replies] if isinstance(replies, str) else list(replies)
        if not self.replies:
            raise ValueError("ScriptedBackend needs at least one reply")
        self.accept_pattern = tuple(accept_pattern) or (0,)
        # Who drafted round i (Chunk.drafter: "ngram", "history", ...), cycling; empty: the rounds do not say.
        self.drafter_pattern = tuple(drafter_pattern)
        # A planted VerifyCostModel (tests of the draft verdict); None: this backend measures no costs.
        self.costs = costs
        self.tokens_per_s = tokens_per_s
        self.clock = clock
        self.gate = gate
        self.gate_after_rounds = gate_after_rounds
        self.load_error = load_error
        self.load_delay_s = load_delay_s
        self.prefill_s = prefill_s
        self.loaded = False
        self.closed = False
        self.requests: list[GenerationRequest] = []
        self._reply_index = 0
        self._vocab: dict[str, int] = {}
        self._pieces: list[str] = []
        self._info = BackendInfo(
            backend=self.name,
            model=model,
            device=device,
            cache_mode=cache_mode,
            draft_cache_mode=cache_mode,
            draft_mode=draft_mode,  # type: ignore[arg-type]
            draft_model="scripted-draft" if draft_mode == "model" else None,
            max_context=max_context,
        )

    # --- Backend protocol ---------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        return self._info

    def load(self, progress: ProgressCallback | None = None) -> None:
        steps = 4
        for step in range(steps):
            if progress is not None:
                progress("loading scripted model", step / steps)
            if self.load_delay_s:
                time.sleep(self.load_delay_s / steps)
        if self.load_error:
            raise BackendError(self.load_error)
        if progress is not None:
            progress("ready", 1.0)
        self.loaded = True

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        rendered = "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages) + "<assistant>\n"
        return self.encode(rendered)

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _TOKEN_RE.findall(text):
            token_id = self._vocab.get(piece)
            if token_id is None:
                token_id = len(self._pieces)
                self._vocab[piece] = token_id
                self._pieces.append(piece)
            ids.append(token_id)
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in token_ids)

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        if not self.loaded:
            raise BackendError("scripted backend: generate() before load()")
        self.requests.append(request)
        reply = self.replies[self._reply_index % len(self.replies)]
        self._reply_index += 1
        token_ids = self.encode(reply)[: request.max_new_tokens]
        k = request.effective_k
        start = self.clock()
        # The prefill honours cancel at once, as a backend that prefills in slices does between slices.
        prefill_cancelled = bool(self.prefill_s) and cancel.wait(self.prefill_s)
        emitted = 0
        round_index = 0
        stop_reason = "end_of_turn" if len(token_ids) < request.max_new_tokens else "max_new_tokens"
        if prefill_cancelled:
            stop_reason, token_ids = "cancelled", []
        while emitted < len(token_ids):
            if cancel.is_set():
                stop_reason = "cancelled"
                break
            if self.gate is not None and round_index >= self.gate_after_rounds:
                while not self.gate.wait(0.02):
                    if cancel.is_set():
                        break
                if cancel.is_set():
                    stop_reason = "cancelled"
                    break
            accepted = min(self.accept_pattern[round_index % len(self.accept_pattern)], k) if k else 0
            accepted = min(accepted, len(token_ids) - emitted - 1)
            n = accepted + 1
            ids = tuple(token_ids[emitted : emitted + n])
            if self.tokens_per_s > 0:
                # Pace against the start so sleep granularity does not accumulate into drift.
                delay = start + (emitted + n) / self.tokens_per_s - self.clock()
                if delay > 0:
                    time.sleep(delay)
            yield Chunk(
                text=self.decode(list(ids)),
                token_ids=ids,
                drafted=k,
                accepted=accepted,
                origins=(True,) * accepted + (False,),
                t=self.clock(),
                temperature=request.sampler.temperature_at(emitted),
                drafter=self.drafter_pattern[round_index % len(self.drafter_pattern)]
                if self.drafter_pattern and k
                else None,
            )
            emitted += n
            round_index += 1
        yield Done(
            stop_reason=stop_reason,  # type: ignore[arg-type]
            prompt_tokens=len(request.prompt_ids),
            cached_tokens=0,
            prefill_s=self.prefill_s,
        )

    def close(self) -> None:
        self.closed = True
        self.loaded = False


class SteppingClock:
    """A fake clock for frozen timings: every reading advances by `step` seconds."""

    def __init__(self, start: float = 1000.0, step: float = 0.01) -> None:
        self._now = start
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._now += self.step
            return self._now
