"""What `specchat bench --tasks` sums and prints: each variant's figures per family, the table, the exactness lines.

One row per family (the code family's two halves apart), then `overall`: decode tok/s of every variant, our
drafting modes over our plain (measured, and what their τ and the measured verify costs r(k) predict), our plain over
llama-server's plain, our best drafting mode over the server's best speculation (naming both), τ, acceptance (the
servers' own counts) and, per drafting mode, the prompts whose greedy output equals our plain's on every repeat.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.benchmarks.task_sets import ROW_NAMES
from engine.events import DASH, fmt, percent

# Our modes that draft, each checked against ours-plain's output; the short names the table uses.
DRAFTING = {"ours-ngram": "ngram", "ours-draft": "draft"}


@dataclass
class Figures:
    """One variant's sums over prompts (each prompt's counted run)."""

    tokens: int = 0  # decode tokens: after the first chunk
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    emitted: int = 0  # every token of our replies (tau's numerator)
    cost_steps: float = 0.0  # our rounds priced in plain steps by the backend's verify-cost curve

    @property
    def predicted(self) -> float | None:
        """Speedup over plain decoding that tau and the measured r(k) predict: tokens per plain-step of cost."""
        return self.emitted / self.cost_steps if self.cost_steps > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None

    def add(self, other: Figures) -> None:
        for name in ("tokens", "decode_s", "drafted", "accepted", "rounds", "emitted", "cost_steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class FamilyResult:
    family: str
    prompt_tokens: list[int] = field(default_factory=list)
    figures: dict[str, Figures] = field(default_factory=dict)
    # Per drafting mode: prompts whose output == ours-plain's, greedy (every repeat) and seeded.
    identical: dict[str, int] = field(default_factory=dict)
    seeded_identical: dict[str, int] = field(default_factory=dict)
    prompts: int = 0


def first_difference(expected: list[int], got: list[int]) -> int | None:
    """The first token position where `got` leaves `expected` (a shorter or longer reply counts); None: equal."""
    if expected == got:
        return None
    for position, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return position
    return min(len(expected), len(got))


def print_families(out, results: dict[str, FamilyResult], variants: tuple[str, ...]) -> dict[str, Figures]:
    """The family table and its legend; returns the overall figures per variant."""
    modes = [v for v in DRAFTING if v in variants]
    heads = [
        "family",
        "prompts",
        "prompt tok",
        *variants,
        *(f"{DRAFTING[m]}/plain (pred)" for m in modes),
        "plain/srv-plain",
        "best/srv-spec",
        "tau",
        "accept",
        "greedy same",
    ]
    print(" | ".join(heads), file=out)
    totals = {v: Figures() for v in variants}
    every = FamilyResult("overall", identical=dict.fromkeys(modes, 0))
    for res in results.values():
        for v in variants:
            totals[v].add(res.figures[v])
        every.prompts += res.prompts
        every.prompt_tokens += res.prompt_tokens
        for mode in modes:
            every.identical[mode] += res.identical.get(mode, 0)
        print(" | ".join(_cells(ROW_NAMES.get(res.family, res.family), res, res.figures, variants)), file=out)
    print(" | ".join(_cells("overall", every, totals, variants)), file=out)
    print(
        "tok/s: decode tokens after the first over first-to-last chunk; pred: the speedup that the mode's tau and "
        "the measured verify costs r(k) predict; best/srv-spec: our best drafting mode over llama.cpp's best "
        "speculation of the row (which: ours/theirs); server acceptance is its own count (accepted/drafted); "
        "greedy same: prompts where the mode's output == ours-plain on every repeat",
        file=out,
    )
    return totals


def _cells(name: str, res: FamilyResult, figures: dict[str, Figures], variants) -> list[str]:
    tps = {v: figures[v].tokens_per_s for v in variants}
    modes = [v for v in DRAFTING if v in variants]
    plain, server = tps.get("ours-plain"), tps.get("server-plain")
    speculating = [v for v in variants if v.startswith("server-") and v != "server-plain"]
    ours_best = max((m for m in modes if tps[m]), key=lambda m: tps[m], default=None)
    theirs_best = max((v for v in speculating if tps[v]), key=lambda v: tps[v], default=None)
    best = DASH
    if ours_best and theirs_best:
        best = (
            f"{tps[ours_best] / tps[theirs_best]:.2f}x "
            f"({DRAFTING[ours_best]}/{theirs_best.removeprefix('server-')})"
        )
    ratios = [
        f"{fmt(tps[m] / plain if plain and tps[m] else None, '{:.2f}x')} "
        f"({fmt(figures[m].predicted, '{:.2f}x')})"
        for m in modes
    ]
    accept = [f"{DRAFTING[m]} {percent(figures[m].acceptance)}" for m in modes]
    accept += [f"{v.removeprefix('server-')} {percent(figures[v].acceptance)}" for v in speculating]
    return [
        name,
        str(res.prompts),
        str(round(statistics.mean(res.prompt_tokens))) if res.prompt_tokens else DASH,
        *(fmt(tps[v]) for v in variants),
        *ratios,
        fmt(plain / server if plain and server else None, "{:.2f}x"),
        best,
        ", ".join(f"{DRAFTING[m]} {fmt(figures[m].tau, '{:.2f}')}" for m in modes),
        ", ".join(accept),
        ", ".join(f"{DRAFTING[m]} {res.identical.get(m, 0)}/{res.prompts}" for m in modes),
    ]


def print_exactness(out, results: dict[str, FamilyResult], mismatches: list[str], seeded_tokens: int) -> None:
    """Greedy (and seeded) output == ours-plain, per drafting mode over every prompt, then each mismatch."""
    prompts = sum(r.prompts for r in results.values())
    modes = [m for m in DRAFTING if any(m in r.identical for r in results.values())]
    greedy = ", ".join(f"{m} {sum(r.identical.get(m, 0) for r in results.values())}/{prompts}" for m in modes)
    print(f"greedy output == ours-plain on every repeat: {greedy}", file=out)
    if seeded_tokens:
        seeded = ", ".join(
            f"{m} {sum(r.seeded_identical.get(m, 0) for r in results.values())}/{prompts}" for m in modes
        )
        print(
            f"seeded sampling (the family's preset sampler, first {seeded_tokens} tokens, one seed) == "
            f"ours-plain sampled: {seeded}",
            file=out,
        )
    for line in mismatches:
        print(f"MISMATCH {line}", file=out)
