"""llama.cpp's kernel probe: how wide a pass may be and still compute each row as a plain step does.

Contract: `probe_widths(target, encode_text, max_context)` decodes a fixed text on the target model's context (left
empty afterwards), one token at a time and as passes of every width from 2 to `widest` (by default the widest
pass the round loop can send: the last token plus LONG_DRAFT_MAX drafts), near the start and across
LONG_PROBE_POSITION cached positions (later in the probe text where the context is too short), and returns a
`ProbeVerdict`:

- `pad`: one-token decodes round otherwise than the rows of a 2-row pass, so plain steps decode a throw-away second
  position (`LlamaCppModel.pad_single`); the reference rows are then those padded steps.
- `widest`: the widest pass whose rows, and every narrower pass's rows, are bit-identical to the reference (plain
  steps) at every probed position; the backend never sends a wider pass (drafts are capped at `widest - 1`).
  0 where not even a 2-row pass was proven (no drafting at all).

A probe that cannot judge (a context too small for the probe text) proves nothing and says so: `widest` 0.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.decoding.drafters.ngram import LONG_DRAFT_MAX

# From this many cached positions too, so that a pass straddles 512 keys: stock llama.cpp's CPU flash attention
# takes another path for a single query row over >= 512 keys, and specchat's patched build attends in fixed chunks
# of 256 cache cells (a pass whose rows fall in two chunks is compared with one-token decodes in each).
LONG_PROBE_POSITION = 508
# The widest pass the round loop sends: the last token plus a long-match draft (engine/decoding/drafters/ngram.py).
PROBE_MAX_WIDTH = LONG_DRAFT_MAX + 1
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 1, 2, 3, 4, 5: def f(x): return x * 2 # done"
# Cached positions before the first probed pass: a few, so that attention reads a short cache.
SHORT_PROBE_POSITION = 8
# Verdicts remembered per model file, build, CPU, cache type and thread count (the probe decodes ~2,600 rows, twice that padded:
# seconds on a small model, more on a big one), in the cache dir; on the patched build any thread count's (recall_for).
PROBES_FILE = "llamacpp-probes.json"
# Bumped whenever what the probe checks changes: older verdicts are then measured again.
PROBE_VERSION = 4


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    pad: bool  # plain steps go through the batched kernels (a throw-away second position)
    widest: int  # widest pass proven exact; 0: none (no drafts)
    checked: int  # the widest pass the probe was asked to prove
    first_mismatch: int | None = None  # the narrowest width whose rows differed (None: none did)
    reason: str = ""  # why nothing could be proven, where widest is 0 without a mismatch

    @property
    def max_drafts(self) -> int:
        """The most drafts a round may carry: the last token plus them is a proven width."""
        return max(0, self.widest - 1)

    def cap_note(self) -> str | None:
        """The line users see where the verdict caps drafts below what the loop could send; None otherwise."""
        if self.widest >= self.checked:
            return None
        if self.widest < 2:
            why = self.reason or f"a pass of {self.first_mismatch} tokens rounds differently than plain steps"
            return f"drafting off: {why} on this build"
        return f"drafts capped at {self.max_drafts}: width {self.widest + 1} rounds differently on this build"

    def describe(self) -> str:
        """One line for `specchat doctor`: the verdict, the widest proven width and the cap."""
        steps = "plain steps padded to 2 rows" if self.pad else "plain steps one-token"
        if self.widest < 2:
            return f"{steps}; no pass width proven ({self.cap_note()})"
        cap = self.cap_note() or f"drafts up to {self.max_drafts} (every width the loop sends)"
        return f"{steps}; widths 2-{self.widest} proven exact of {self.checked}; {cap}"


def _probe_ids(encode_text, length: int) -> list[int]:
    """At least `length` tokens of the probe text (repeated): a short text must not leave widths unproven."""
    unit = encode_text(PROBE_TEXT)
    if not unit:
        return []
    return (unit * (length // len(unit) + 1))[:length]


def probe_starts(max_context: int, widest: int = PROBE_MAX_WIDTH) -> list[int]:
    """The cached prefix lengths the probe decodes `widest` positions after, all within the context: near the
    start, and across 512 cached positions where the context has room (else later in the probe text). Each case
    decodes ~1,300 rows, so a third would cost a first load seconds more for no kernel path the two miss. Each leaves
    one cell past its widest pass: a padded plain step's throw-away position (a probe at start + widest ==
    max_context found no room in the cache for the last padded reference)."""
    room = widest + 1
    late = LONG_PROBE_POSITION
    if late + room > max_context:
        late = SHORT_PROBE_POSITION + 2 * widest
    return [s for s in (SHORT_PROBE_POSITION, late) if s + room <= max_context]


def probe_widths(target, encode_text, max_context: int, widest: int = PROBE_MAX_WIDTH) -> ProbeVerdict:
    """The probe described in the module docstring. `target` is a LlamaCppModel (decode / prefill / crop / clear)."""
    import numpy as np

    widest = max(2, widest)
    starts = probe_starts(max_context, widest)
    if not starts:
        return ProbeVerdict(
            False, 0, widest, reason=f"the context ({max_context} tokens) is too small for the kernel probe"
        )
    ids = _probe_ids(encode_text, max(starts) + widest)
    if len(ids) < max(starts) + widest:
        return ProbeVerdict(False, 0, widest, reason="the probe text did not tokenize")

    def references(start: int, pad: bool) -> list:
        target.crop(start)
        rows = [target.decode([ids[start + j]], outputs=1, pad=pad)[0] for j in range(widest)]
        target.crop(start)
        return rows

    def agrees(start: int, width: int, reference: list) -> bool:
        target.crop(start)
        rows = target.decode(ids[start : start + width], outputs=width)
        return all(np.array_equal(rows[j], reference[j]) for j in range(width))

    def scan(start: int, reference: list, upto: int) -> int:
        """The widest width <= upto whose rows, and every narrower width's, equal the reference; 1 if none."""
        for width in range(2, upto + 1):
            if not agrees(start, width, reference):
                return width - 1
        return upto

    try:
        target.clear()
        proven, pad = widest, False
        for start in starts:  # one-token decodes as the reference (no throw-away position)
            target.prefill(ids[:start])
            singles = references(start, pad=False)
            if not agrees(start, 2, singles):
                pad = True  # then every position is judged again against padded plain steps
                break
            proven = scan(start, singles, proven)
        if pad:
            proven = widest
            for start in starts:
                target.prefill(ids[:start])
                proven = scan(start, references(start, pad=True), proven)
        mismatch = proven + 1 if proven < widest else None
        return ProbeVerdict(pad, proven if proven >= 2 else 0, widest, mismatch)
    finally:
        target.clear()


def probe_key(trial: str, cache_type: str, threads: int, max_context: int) -> str:
    """What a verdict depends on: the file, the build, the CPU's flags, repacking (`trial`: engine/backends/llamacpp/
    native.py trial_key), and the context it ran on: cache type, thread count, the positions the context allows."""
    starts = ",".join(map(str, probe_starts(max_context)))
    text = f"{trial}|cache={cache_type}|threads={threads}|starts={starts}|widest={PROBE_MAX_WIDTH}|v{PROBE_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# The thread counts whose verdicts a thread-free build may borrow (recall_for).
THREAD_COUNTS = range(1, 65)
X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})


def thread_free_build(patched: bool, machine: str | None = None) -> bool:
    """Whether the loaded build's rows are the same at every thread count: specchat's patched build on x86, where
    its kernels replace the stock ones (tested on 1 and 2 threads, AVX-512). On ARM the stock NEON/i8mm kernels stay
    and nothing has checked them across thread counts: their verdicts stay per count."""
    import platform

    return patched and (machine or platform.machine()).lower() in X86_MACHINES


def recall_for(
    path: Path, repack: bool, *, cache_type: str, threads: int, max_context: int, thread_free: bool
) -> tuple[str, ProbeVerdict | None]:
    """The key of these settings (probe_key) and the verdict remembered under it (None: none).

    `thread_free`: the build's rows do not depend on the thread count (specchat's patch: attention in fixed key
    chunks, each row whole on one thread; tests/engine/backends/llamacpp/test_backend.py holds 1 and 2 threads
    bit-identical), so a verdict measured at another thread count holds too: a load whose thread timing met a busy
    moment (1 thread) probes nothing again (the Qwen2.5-Coder 0.5B's probe takes 46 s at 1 thread on 2 cores).
    Stock builds split one row's keys by thread count: their verdicts stay per count."""
    from engine.backends.llamacpp.native import load_verdicts, trial_key

    trial = trial_key(path, repack)
    key = probe_key(trial, cache_type, threads, max_context)
    known = load_verdicts(probes_path())
    others = [t for t in THREAD_COUNTS if t != threads] if thread_free else []
    for candidate in [key] + [probe_key(trial, cache_type, t, max_context) for t in others]:
        try:
            if isinstance(known.get(candidate), dict):
                return key, ProbeVerdict(**known[candidate])
        except TypeError:
            continue
    return key, None


def probes_path() -> Path:
    from engine.paths import cache_dir

    return cache_dir() / PROBES_FILE


def remember(key: str, verdict: ProbeVerdict, store: Path | None = None) -> None:
    from engine.backends.llamacpp.native import remember_verdict

    remember_verdict(store or probes_path(), key, asdict(verdict))
