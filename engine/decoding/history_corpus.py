"""The history drafter's corpus, tokenized and indexed for the loaded model, off the reply path.

A backend whose loop is the round loop holds one `HistoryIndexes` (one tokenizer). Each reply hands it the
request's `HistoryCorpus` (`view`): the parts already built under their keys are there at once, the missing ones
are built in a background thread, in priority order, and join the reply when ready (`CorpusView`); nothing waits.
A part is read (`CorpusPart.load`, the session's, lazily) and tokenized text by text until the budget is spent:
`BUDGET_TOKENS` over the whole corpus, the parts ahead taking theirs first. A text's tokens are kept while the
corpus holds it, so a part rebuilt under a new key tokenizes only its new texts; parts no longer handed in are
dropped. Build time and memory: docs/performance.md, "History drafting".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import numpy as np

from engine.decoding.drafters.history import TokenIndex
from engine.request import CorpusPart, HistoryCorpus

# The most tokens the corpus indexes (about 16 MB of index: 8 bytes a token), parts in priority order.
BUDGET_TOKENS = 2_000_000

log = logging.getLogger(__name__)


class CorpusView:
    """One reply's corpus: the parts built so far, in priority order (engine/decoding/drafters/history.py)."""

    def __init__(self, indexes: HistoryIndexes, keys: tuple[str, ...]) -> None:
        self._indexes = indexes
        self._keys = keys
        self._found: dict[str, TokenIndex] = {}
        self._parts: tuple[TokenIndex, ...] = ()

    def parts(self) -> tuple[TokenIndex, ...]:
        if len(self._found) < len(self._keys):
            found = self._indexes.built(self._keys)
            if len(found) != len(self._found):
                self._found = found
                self._parts = tuple(found[key] for key in self._keys if key in found and len(found[key]))
        return self._parts

    def may_offer(self) -> bool:
        return bool(self.parts()) or len(self._found) < len(self._keys)


class HistoryIndexes:
    """The corpus's parts as token indexes for one tokenizer (`encode`), built in a background thread."""

    def __init__(self, encode: Callable[[str], list[int]], budget: int = BUDGET_TOKENS) -> None:
        self._encode = encode
        self.budget = budget
        self._lock = threading.Lock()
        self._built: dict[str, TokenIndex] = {}
        self._wanted: tuple[CorpusPart, ...] = ()
        self._tokens: dict[str, np.ndarray] = {}  # a text's tokens, while a built part holds it
        self._texts: dict[str, tuple[str, ...]] = {}  # each built part's texts
        self._worker: threading.Thread | None = None
        self.failures: list[str] = []  # one line per part that could not be built (it is left out)

    def view(self, corpus: HistoryCorpus | None) -> CorpusView | None:
        """The reply's view of `corpus`; builds the missing parts in the background. Never waits."""
        if corpus is None or not corpus.parts:
            return None
        keys = tuple(part.key for part in corpus.parts)
        with self._lock:
            self._wanted = corpus.parts
            for key in [k for k in self._built if k not in keys]:
                del self._built[key], self._texts[key]
            missing = any(key not in self._built for key in keys)
            if missing and (self._worker is None or not self._worker.is_alive()):
                self._worker = threading.Thread(target=self._work, name="specchat-history", daemon=True)
                self._worker.start()
        return CorpusView(self, keys)

    def built(self, keys: tuple[str, ...]) -> dict[str, TokenIndex]:
        with self._lock:
            return {key: self._built[key] for key in keys if key in self._built}

    @property
    def tokens_indexed(self) -> int:
        """Tokens in the parts built (separators included)."""
        with self._lock:
            return sum(len(index) for index in self._built.values())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the builds under way (tests, the benchmark); True when none is left."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
            return not worker.is_alive()
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                wanted = self._wanted
                todo = next((p for p in wanted if p.key not in self._built), None)
                if todo is None:
                    self._worker = None
                    return
                ahead = sum(
                    len(self._built[p.key]) for p in wanted[: wanted.index(todo)] if p.key in self._built
                )
            index, texts = self._build(todo, max(self.budget - ahead, 0))
            with self._lock:
                if any(p.key == todo.key for p in self._wanted):
                    self._built[todo.key], self._texts[todo.key] = index, texts
                held = {text for part in self._texts.values() for text in part}
                for text in [t for t in self._tokens if t not in held]:
                    del self._tokens[text]

    def _build(self, part: CorpusPart, budget: int) -> tuple[TokenIndex, tuple[str, ...]]:
        documents: list[np.ndarray] = []
        texts: list[str] = []
        total = 0
        try:
            for text in _texts(part.load()):
                if total >= budget:
                    break
                ids = self._tokens.get(text)
                if ids is None:
                    ids = np.asarray(self._encode(text), dtype=np.int32)
                    self._tokens[text] = ids
                ids = ids[: budget - total]
                documents.append(ids)
                texts.append(text)
                total += len(ids) + 1
            index = TokenIndex.from_documents(documents)
        except Exception as exc:  # a store gone, a model closed: the part is left out, the chat goes on
            log.warning("history part %s not indexed: %s", part.key, exc)
            self.failures.append(f"{part.key}: {type(exc).__name__}: {exc}")
            index, texts = TokenIndex.from_documents([]), []
        return index, tuple(texts)


def _texts(texts: Iterable[str]) -> Iterable[str]:
    for text in texts:
        if text and text.strip():
            yield text
