"""Best-of timings of verify passes for a model as loaded: measured once, kept on disk, confirmed at each load.

A load times passes twice: the cost model's prior (`LlamaCppBackend._calibrate`: widths up to the widest pass the
loop sends, over 64 cached tokens) and the busy-CPU guard's idea of an idle machine (`ThreadControl.
measure_pass_cost`: 1, 9 and the widest, over 64 and ~576 cached tokens), and the draft model's one-token step.
On the Qwen2.5-Coder pair that was ~34 of a 42 s load on 2 cores, paid again at every start and every reload.
Here each (width, cached tokens) is timed once, both consumers read the same figure, and the table is kept per
model as loaded (file, llama.cpp build, CPU flags, repacking, cache type, thread count, context, padded plain
steps, rollback, MTP head): in the process (a reload: F12 switching drafters, a benchmark's second backend) and in
`<cache>/pass-timings.json` (the next start).

A table read from disk is a claim about this machine at another moment, so the first use in a process checks it:
a one-token pass over 64 cached tokens is timed again (best of ROUNDS). The table is kept where that pass is at
most CONFIRM_TOLERANCE faster than the stored figure and at most BUSY_SLOWDOWN times slower: slower is a busy moment
now (another process on the cores, a host that swings between two speeds), and re-timing then would replace an
idle machine's figures, which is what both consumers want, with a busy moment's. A pass faster than that (the table
was timed at a busy moment) or far slower (another host behind the same CPU flags) has everything timed afresh
and stored. Live passes refine the cost model and the guard as before (`VerifyCostModel.observe`,
`PassCost.learn`): these are priors. A kept table is written back with the time it was used, so the file's
KEPT_TABLES are the ones used last, not the ones timed last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

# Rounds of each width, the best kept (a disturbed sample is dropped, not averaged in).
ROUNDS = 3
DRAFT_ROUNDS = 4
STORE_FILE = "pass-timings.json"
# A stored table is used where the one-token pass timed at load is at most this share faster than the stored one
# (faster still: the table was timed at a busy moment) ...
CONFIRM_TOLERANCE = 0.15
# ... and at most this many times slower (a busy moment now: one process beside us on 2 cores halves the speed;
# slower still: another machine). On a 2-core host that swings between two speeds, the table was timed afresh at
# each of three loads of the Qwen2.5-Coder pair watched (13 s of a 19 s load).
BUSY_SLOWDOWN = 3.0
CHECK = (1, 64)  # the (width, cached tokens) a stored table is confirmed by
KEPT_TABLES = 64  # models as loaded the file remembers, the most recently timed or confirmed

_kept: dict[str, PassTimings] = {}
_store: Path | None = None  # where the tables are kept (None: `<cache>/pass-timings.json`)


def store_path() -> Path:
    from engine.paths import cache_dir

    return _store if _store is not None else cache_dir() / STORE_FILE


class PassTimings:
    """Seconds of a pass of `width` tokens over `context` cached tokens (best of ROUNDS), and draft steps.
    `key` None: a fresh table, neither read from nor written to disk (a test's planted kernel)."""

    def __init__(self, key: str | None = None) -> None:
        self.key = key
        self.best: dict[tuple[int, int], float] = {}
        self.draft_steps: dict[str, float] = {}
        self.stored = False  # read from disk and not confirmed yet
        self.confirmation: str | None = None  # what the check at load found ("kept" / "timed afresh")

    @classmethod
    def kept(cls, key: str | None) -> PassTimings:
        """The timings for `key`: the process's, else the stored ones (to be confirmed), else a new table; a fresh,
        unshared one where key is None."""
        if key is None:
            return cls()
        if key not in _kept:
            _kept[key] = cls(key)._read()
        return _kept[key]

    def passes(self, target, widths: Sequence[int], context: int) -> dict[int, float]:
        """Best-of seconds by width over `context` cached tokens; only widths not timed before are decoded (on an
        emptied cache, left empty)."""
        if self.stored:
            self._confirm(target)
        missing = [w for w in dict.fromkeys(widths) if (w, context) not in self.best]
        if missing:
            self._time(target, missing, context, self.best)
            self._write()
        return {w: self.best[(w, context)] for w in widths}

    def draft_step(self, key: str, draft, feeder) -> float:
        """Best-of seconds of the draft's one-token step over 64 cached tokens (`feeder` fills the cache: the draft
        model itself, or the target where an MTP head follows its decodes)."""
        if self.stored:  # confirmed by a pass of the target only: a draft step read from disk is timed again
            self.draft_steps.clear()
        if key not in self.draft_steps:
            filler = _filler(draft, 65)
            best = float("inf")
            try:
                feeder.clear()
                feeder.prefill(filler[:64])
                for _ in range(DRAFT_ROUNDS):
                    start = time.perf_counter()
                    draft.next_logits(filler[64:65])
                    best = min(best, time.perf_counter() - start)
                    draft.crop(64)
            finally:
                feeder.clear()
            self.draft_steps[key] = best
            self._write()
        return self.draft_steps[key]

    # --- timing, and the table on disk ----------------------------------------------------------------------

    @staticmethod
    def _time(target, widths: Sequence[int], context: int, into: dict[tuple[int, int], float]) -> None:
        filler = _filler(target, context + max(widths))
        try:
            target.clear()
            target.prefill(filler[:context])
            for _ in range(ROUNDS):
                for width in widths:
                    tokens = filler[context : context + width]  # one token: padded where plain steps are
                    start = time.perf_counter()
                    target.decode(tokens, outputs=len(tokens))
                    seconds = time.perf_counter() - start
                    into[(width, context)] = min(into.get((width, context), seconds), seconds)
                    target.crop(context)
        finally:
            target.clear()

    def _confirm(self, target) -> None:
        """Keep the stored table where a one-token pass takes what it says, or longer as at a busy moment (and mark
        it used); else time everything afresh."""
        self.stored = False
        now: dict[tuple[int, int], float] = {}
        self._time(target, [CHECK[0]], CHECK[1], now)
        then = self.best.get(CHECK)
        if then is not None and 1.0 - CONFIRM_TOLERANCE <= now[CHECK] / then <= BUSY_SLOWDOWN:
            self.confirmation = "kept"
            self._write()
            return
        self.confirmation = "timed afresh"
        self.best = now
        self.draft_steps = {}
        self._write()

    def _read(self) -> PassTimings:
        from engine.backends.llamacpp.native import load_verdicts

        entry = load_verdicts(store_path()).get(self.key)
        try:
            best = {(int(w), int(c)): float(s) for w, c, s in entry["best"]}
            steps = {str(k): float(v) for k, v in entry["draft_steps"].items()}
        except (TypeError, KeyError, ValueError, AttributeError):
            return self
        if best:
            self.best, self.draft_steps, self.stored = best, steps, True
        return self

    def _write(self) -> None:
        """This table into the file, which keeps the KEPT_TABLES written (timed or confirmed) last: tests build
        models afresh, and a suite loads more models as loaded than the file keeps."""
        from engine.backends.llamacpp.native import load_verdicts, write_verdicts

        if self.key is None:
            return
        data = load_verdicts(store_path())
        best = [[w, c, s] for (w, c), s in sorted(self.best.items())]
        data[self.key] = {"best": best, "draft_steps": self.draft_steps, "at": time.time()}

        def written(key: str) -> float:
            entry = data[key]
            return float(entry.get("at", 0.0)) if isinstance(entry, dict) else 0.0

        write_verdicts(store_path(), {key: data[key] for key in sorted(data, key=written)[-KEPT_TABLES:]})


def _filler(model, length: int) -> list[int]:
    """Tokens to time with: distinct ones. A dense model's pass costs the same whatever they are; a mixture of
    experts routes distinct tokens apart, so each wakes its own experts, as text mostly does (the dearer case)."""
    return [(7 + 13 * i) % max(model.n_vocab - 1, 1) + 1 for i in range(length)]


def forget(store: Path | None = None) -> None:
    """Drop every timing kept in the process, and keep tables in `store` from now on (None: the cache's file) —
    tests that need a first load again."""
    global _store
    _kept.clear()
    _store = store
