"""Whether drafting can pay on this machine, and why: one verdict for `specchat doctor` and the chat alike.

Pure: it reads the backend's `VerifyCostModel` (the verify cost r(1 + k) of a pass of 1 + k tokens in plain steps,
and c, a draft-model step in target steps) and prices every K up to the presets' largest at a high acceptance
(`PROBE_ACCEPTANCE` per position): a round of k drafts emits 1 + a + ... + a^k tokens for r(1 + k) + k c plain
steps. Where no K beats a plain step by `MIN_GAIN` even then, no acceptance can make drafting pay and adaptive K
leaves it off; where some K does, adaptive K drafts whenever the acceptance it measures pays. n-gram drafts take
no draft-model steps (c = 0), so only r decides for them.

A drafter that takes steps (a draft model, an MTP head) has free drafters asked beside it (the name map's
`beside`: the context's n-gram, history): where its own drafts cannot pay, theirs still may, and the verdict counts
them (`free`, `free_k`, `free_speedup`): they are priced at c = 0 as n-gram alone is.

c here is the backend's running estimate (a draft step over a plain target step, both smoothed over every step
since load), so the verdict calls it "running c" wherever it shows it (the chat's line, the status bar, the stats,
doctor), apart from a reply's own "cost ratio c (this reply)" in the inspector: one name for one value.

A figure not measured yet (no pass wider than one token timed, or a draft model whose step was never timed) makes
no verdict: it reads "–", never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from engine.decoding.adaptive_k import MIN_GAIN, PROBE_ACCEPTANCE
from engine.decoding.drafters.registry import DRAFTERS, NO_DRAFTING, spec_of_mode
from engine.events import fmt

VerdictStatus = Literal["pass", "warn", "skip"]


@dataclass(frozen=True, slots=True)
class DraftVerdict:
    """`status`: "pass" (some K can pay), "warn" (none can), "skip" (no verdict: `why` says why)."""

    status: VerdictStatus
    draft_mode: str
    why: str  # the reason, one clause (the figures, or why there is no verdict)
    c: float | None = None  # the draft step in target steps (0.0 for n-gram; None where not measured)
    r2: float | None = None  # r(2): a verify pass of 2 tokens in plain steps (None where not measured)
    k: int = 0  # the best K at PROBE_ACCEPTANCE
    speedup: float | None = None  # what that K gives at PROBE_ACCEPTANCE
    # The free drafters asked beside a drafter that takes steps (labels: "n-gram", "history"), and the best K and
    # speedup of their drafts at PROBE_ACCEPTANCE (c = 0); () / None where the drafter is free itself.
    free: tuple[str, ...] = ()
    free_k: int = 0
    free_speedup: float | None = None

    @property
    def steps(self) -> bool:
        """The drafter's drafts take model steps (c counts), by the name map."""
        spec = spec_of_mode(self.draft_mode)
        return spec is not None and spec.steps

    @property
    def free_pays(self) -> bool:
        """The free drafts asked beside a drafter that takes steps can pay here (at PROBE_ACCEPTANCE)."""
        return bool(self.free) and self.free_speedup is not None and self.free_speedup >= 1.0 + MIN_GAIN

    def _free_words(self) -> str:
        """`n-gram and history drafts`."""
        return " and ".join(self.free) + " drafts"

    @property
    def pays(self) -> bool | None:
        """True / False, or None where there is no verdict."""
        return None if self.status == "skip" else self.status == "pass"

    def body(self) -> str:
        """The reason with its figures, as doctor and the chat both say it."""
        if self.status == "pass":
            return (
                f"{self.why}; at {PROBE_ACCEPTANCE:.0%} acceptance K {self.k} gives {self.speedup:.2f}x, "
                "and adaptive K drafts whenever the acceptance it measures pays"
            )
        if self.status == "warn":
            if self.free_pays:
                return (
                    f"{self.why}, so even at {PROBE_ACCEPTANCE:.0%} acceptance the best K ({self.k}) gives "
                    f"{self.speedup:.2f}x; adaptive K leaves the draft's own drafts off, but "
                    f"{self._free_words()} take no draft steps (K {self.free_k} gives {self.free_speedup:.2f}x) "
                    "and go out whenever they pay"
                )
            hint = "; n-gram drafting (--draft ngram) costs no draft steps" if self.steps else ""
            return (
                f"{self.why}, so even at {PROBE_ACCEPTANCE:.0%} acceptance the best K ({self.k}) gives "
                f"{self.speedup:.2f}x (compute-bound here); adaptive K leaves drafting off{hint}"
            )
        return self.why

    def doctor_line(self) -> str:
        """`specchat doctor`'s draft_pays line."""
        prefix = {"pass": "yes: ", "warn": "no: "}.get(self.status, "")
        return prefix + self.body()

    def figures(self) -> str:
        """`running c 0.42, r(2) 2.00` (n-gram: `r(2) 1.10`); "–" for a figure not measured."""
        r2 = fmt(self.r2, "{:.2f}")
        if not self.steps:
            return f"r(2) {r2}"
        c = fmt(self.c, "{:.2f}")
        return f"running c {c}, r(2) {r2}"

    def status_text(self) -> str:
        """The status bar's words while drafting is off because it cannot pay; "" otherwise."""
        return f"draft off: doesn't pay ({self.figures()})" if self.status == "warn" else ""

    def short(self) -> str:
        """A few words for the stats and the inspector's verdict row."""
        figures = self.figures()
        if self.status == "pass":
            return f"can pay ({figures}: K {self.k} gives {self.speedup:.2f}x at {PROBE_ACCEPTANCE:.0%})"
        if self.status == "warn":
            line = f"doesn't pay ({figures}: the best K gives {self.speedup:.2f}x even at {PROBE_ACCEPTANCE:.0%})"
            if self.free_pays:
                line += f"; free {self._free_words()} can (K {self.free_k} gives {self.free_speedup:.2f}x)"
            return line
        return ""

    def chat_line(self, drafter: str) -> str:
        """The line the chat shows at load and when the verdict changes (`drafter`: "draft qwen2.5-coder-0.5b",
        "n-gram drafting"); "" where there is no verdict."""
        if self.status == "skip":
            return ""
        verb = "can pay" if self.status == "pass" else "doesn't pay"
        return f"{drafter} {verb} on this machine: {self.body()}"


def draft_verdict(costs: Any, draft_mode: str, k_max: int, left_out: Iterable[str] = ()) -> DraftVerdict:
    """The verdict from a backend's measured costs (`VerifyCostModel` or anything with `ratio(width)`,
    `draft_ratio()` and, optionally, `as_dict()`), for K up to `k_max`. `left_out`: drafters of the name map's
    `beside` that are not asked beside this one (the session's "history" where history drafting is off)."""
    k_max = max(int(k_max), 1)
    spec = spec_of_mode(draft_mode)
    if spec is not None and spec.name == NO_DRAFTING:
        return DraftVerdict("skip", draft_mode, "drafting is off")
    if spec is None:
        return DraftVerdict("skip", draft_mode, "the server drafts by its own settings")
    if costs is None:
        return DraftVerdict("skip", draft_mode, "this backend does not measure its verify cost")
    measured = getattr(costs, "as_dict", None)
    if measured is not None and not any(width > 1 for width in measured()):
        return DraftVerdict("skip", draft_mode, "the verify cost has not been measured yet")
    c = costs.draft_ratio() if spec.steps else 0.0
    r2 = costs.ratio(2)
    if spec.steps and c <= 0:
        return DraftVerdict(
            "skip", draft_mode, "the draft model's step has not been timed yet", c=None, r2=r2
        )
    k, best = _best_k(costs, c, k_max)
    free: tuple[str, ...] = ()
    free_k, free_best = 0, None
    if spec.steps:
        skipped = set(left_out)
        free = tuple(DRAFTERS[n].label for n in spec.beside if n not in skipped and not DRAFTERS[n].steps)
        if free:
            free_k, free_best = _best_k(costs, 0.0, k_max)
    why = f"a verify pass of 2 costs r(2) {r2:.2f} plain steps" + (
        f" and a draft step running c {c:.2f} of a target step"
        if spec.steps
        else f" ({spec.label} drafts are free)"
    )
    status: VerdictStatus = "pass" if best >= 1.0 + MIN_GAIN else "warn"
    return DraftVerdict(
        status,
        draft_mode,
        why,
        c=c,
        r2=r2,
        k=k,
        speedup=best,
        free=free,
        free_k=free_k,
        free_speedup=free_best,
    )


def _best_k(costs: Any, c: float, k_max: int) -> tuple[int, float]:
    """The K up to `k_max` that gives the most at PROBE_ACCEPTANCE with draft steps of c, and what it gives."""
    speedups = {
        k: sum(PROBE_ACCEPTANCE**i for i in range(k + 1)) / (costs.ratio(1 + k) + k * c)
        for k in range(1, k_max + 1)
    }
    return max(speedups.items(), key=lambda item: item[1])


def machine_verdict(
    backend: Any, draft_mode: str, presets: dict[str, Any], history_drafting: bool
) -> DraftVerdict:
    """The verdict for a loaded backend, as the chat shows it (at load, after a reply, when history drafting is
    turned on or off) and `specchat doctor`'s draft_pays says it: its measured costs, K up to the built-in task
    presets' largest (all of `presets` where none of them is there), history left out where history drafting is
    off."""
    built_in = [p for name, p in presets.items() if name in ("code", "qa", "creative")] or list(
        presets.values()
    )
    left_out = () if history_drafting else ("history",)
    return draft_verdict(verify_costs_of(backend), draft_mode, verdict_k_max(built_in), left_out)


def verdict_k_max(presets: Iterable[Any]) -> int:
    """The K the verdict prices up to: the largest K of the presets that draft (1 where none does)."""
    return max((p.k for p in presets if getattr(p, "drafting", True) and p.k > 0), default=1)


def verify_costs_of(backend: Any) -> Any:
    """The backend's verify-cost model, where it keeps one (`costs`, or its target's), else None."""
    costs = getattr(backend, "costs", None)
    if costs is None:
        costs = getattr(getattr(backend, "target", None), "costs", None)
    return costs
