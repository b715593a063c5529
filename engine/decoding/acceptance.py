"""Acceptance accounting and the speedup model, shared by status bar, inspector, logs and bench.

Definitions (DESIGN.md):
- acceptance rate = accepted / drafted
- mean accepted length tau = emitted tokens / verification rounds (includes the target's own token)
- per-position acceptance r_i = rounds with at least i accepted / rounds that drafted at least i
- alpha solves alpha + alpha^2 + ... + alpha^K = tau - 1
- predicted speedup S(K) = (1 - alpha^(K+1)) / ((1 - alpha)(cK + 1)), c = draft step time / target step time;
  where the backend measures what a round costs (`Done.round_cost`, in plain steps, from its verify-cost curve),
  the prediction is over all rounds instead: tau / round_cost, rounds without a draft included

A remote server's chunks are not rounds (`Chunk.is_round` False): they carry token and draft counts, rounds are
counted as tokens - accepted drafts, and at the end the server's own figures (`Done.server`) replace what the
chunks summed; whatever it does not report stays empty, with the reason in `MessageStats.unavailable`.

A round that drafted nothing (drafting off, or an n-gram drafter that backed off) is still one target forward
pass, so it counts in tau. A round that emitted no token (its only token was the stop token: the final round of a
reply that ended on end-of-turn) is not a round of the reply: it counts nowhere (tau, rounds, K per round, drafted,
acceptance), so tau >= 1 always (plain decoding's final round, the stop token alone, yields no chunk at all).
Alpha and the speedup model look only at rounds that drafted, with K the mean number of drafts in such a round:
that is the question they answer ("when we draft, how good is it").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.decoding.drafters.registry import spec_of_mode
from engine.decoding.rates import decode_tokens_per_s, time_to_first_token
from engine.events import Chunk, Done, LiveStats, MessageStats, ServerStats

EMA_WEIGHT = 0.2  # weight of the newest round in the live acceptance EMA
SPARKLINE_ROUNDS = 32  # rounds kept for the status bar's sparkline
K_NOW_ROUNDS = 8  # the status bar's current K: the median over this many recent rounds (n-gram K flickers)


def solve_alpha(tau: float, k: int, tol: float = 1e-10) -> float:
    """Per-token acceptance alpha in [0, 1] with alpha + ... + alpha^k = tau - 1 (bisection; the sum is monotone)."""
    if k <= 0:
        raise ValueError("k must be positive")
    target = tau - 1.0
    if target <= 0.0:
        return 0.0
    if target >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Expected speedup of K-token drafting over plain decoding (Leviathan et al.)."""
    if k <= 0:
        return 1.0
    expected_tokens = float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return expected_tokens / (c * k + 1.0)


def best_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The K in 1..k_max that maximises the predicted speedup (0 if no K beats plain decoding)."""
    best, best_s = 0, 1.0
    for k in range(1, k_max + 1):
        s = predicted_speedup(alpha, k, c)
        if s > best_s + 1e-12:
            best, best_s = k, s
    return best


@dataclass(slots=True)
class AcceptanceAccounting:
    """Folds a reply's Chunk stream into live figures and, at the end, MessageStats."""

    t_start: float
    live: LiveStats = field(default_factory=LiveStats)
    t_first: float | None = None
    t_last: float | None = None
    drafting_rounds: int = 0
    drafting_round_tokens: int = 0
    # accepted_counts[a] = drafting rounds that accepted exactly a drafts
    accepted_counts: list[int] = field(default_factory=list)
    # drafted_at_least[i] / accepted_at_least[i]: rounds that drafted / accepted at least i+1 tokens
    drafted_at_least: list[int] = field(default_factory=list)
    accepted_at_least: list[int] = field(default_factory=list)
    # The first chunk's tokens arrive with the prefill; decode speed counts the tokens after it.
    first_chunk_tokens: int = 0
    k_per_round: list[int] = field(default_factory=list)  # Chunk.k of every round that reported one
    # The same per-position counts over the rounds a draft model drafted, where lookup drafted others beside it.
    model_drafted_at_least: list[int] = field(default_factory=list)
    model_accepted_at_least: list[int] = field(default_factory=list)
    # Drafting rounds whose drafts took no model steps (a lookup: n-gram, Chunk.drafter "ngram", by the name map).
    lookup_rounds: int = 0
    # Drafted and accepted tokens per source (Chunk.drafter), where the round says who drafted.
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)

    # Rounds that emitted no token, held back: counted when a later chunk comes (their tokens' text was held
    # back for a stop string), dropped at the end (the final round's only token was the stop token).
    empty_rounds: list[Chunk] = field(default_factory=list)

    def add(self, chunk: Chunk) -> None:
        """Fold one chunk in. A verification round counts where it emitted a token (τ ≥ 1, see the module doc)."""
        if chunk.is_round and chunk.n_tokens == 0:
            self.empty_rounds.append(chunk)
            return
        held, self.empty_rounds = self.empty_rounds, []
        for empty in held:
            self._fold(empty)
        self._fold(chunk)

    def _fold(self, chunk: Chunk) -> None:
        live = self.live
        n = chunk.n_tokens
        if self.t_first is None:
            self.t_first = chunk.t
            self.first_chunk_tokens = n
        self.t_last = chunk.t
        live.new_tokens += n
        live.drafted += chunk.drafted
        live.accepted += chunk.accepted
        live.temperature = chunk.temperature
        if not chunk.is_round:
            # A remote server's update: counts, not a round. Every round emits one token of the target's own,
            # so rounds = tokens - accepted drafts; the EMA follows the server's updates.
            live.rounds = max(live.new_tokens - live.accepted, 0)
            if chunk.drafted > 0:
                self._follow_rate(chunk.accepted / chunk.drafted)
            self._update_rates()
            return
        live.rounds += 1
        if chunk.k is not None:
            self.k_per_round.append(chunk.k)
            recent = sorted(self.k_per_round[-K_NOW_ROUNDS:])
            live.k_now = recent[len(recent) // 2]
        if chunk.drafted > 0:
            self.drafting_rounds += 1
            self.drafting_round_tokens += n
            _bump(self.accepted_counts, chunk.accepted)
            for i in range(chunk.drafted):
                _bump(self.drafted_at_least, i)
            for i in range(chunk.accepted):
                _bump(self.accepted_at_least, i)
            if chunk.drafter is not None:
                self.drafted_by[chunk.drafter] = self.drafted_by.get(chunk.drafter, 0) + chunk.drafted
                self.accepted_by[chunk.drafter] = self.accepted_by.get(chunk.drafter, 0) + chunk.accepted
            if _is_lookup(chunk.drafter):
                self.lookup_rounds += 1
            else:
                for i in range(chunk.drafted):
                    _bump(self.model_drafted_at_least, i)
                for i in range(chunk.accepted):
                    _bump(self.model_accepted_at_least, i)
            self._follow_rate(chunk.accepted / chunk.drafted)
        self._update_rates()

    def _follow_rate(self, rate: float) -> None:
        live = self.live
        live.ema_acceptance = (
            rate
            if live.ema_acceptance is None
            else (1 - EMA_WEIGHT) * live.ema_acceptance + EMA_WEIGHT * rate
        )
        live.recent_round_acceptance.append(rate)
        del live.recent_round_acceptance[:-SPARKLINE_ROUNDS]

    def _update_rates(self) -> None:
        live = self.live
        live.ttft_s = time_to_first_token(self.t_start, self.t_first)
        live.tokens_per_s = decode_tokens_per_s(
            live.new_tokens - self.first_chunk_tokens, self.t_first, self.t_last
        )

    def per_position_acceptance(self) -> list[float]:
        return _rates(self.accepted_at_least, self.drafted_at_least)

    def model_per_position_acceptance(self) -> list[float] | None:
        """r_i over the draft model's rounds alone, where lookup drafted other rounds beside it; else None."""
        if not self.lookup_rounds or self.lookup_rounds == self.drafting_rounds:
            return None
        return _rates(self.model_accepted_at_least, self.model_drafted_at_least)

    def alpha_and_k(self) -> tuple[float | None, int]:
        if not self.drafting_rounds:
            return None, 0
        k = max(1, round(self.live.drafted / self.drafting_rounds))
        tau_drafting = self.drafting_round_tokens / self.drafting_rounds
        return solve_alpha(tau_drafting, k), k

    def finish(
        self,
        done: Done,
        t_end: float,
        *,
        preset: str,
        num_draft_tokens: int,
        temperature: float,
        draft_mode: str,
        backend: str,
        model: str,
        router_reason: str = "",
        cache_mode: str = "",
        k_mode: str = "fixed",
    ) -> MessageStats:
        """The reply's stats: the counted figures, the server's own where it reports them, times and settings."""
        live = self.live
        ttft = (self.t_first - self.t_start) if self.t_first is not None else t_end - self.t_start
        prefill_s = done.prefill_s if done.prefill_s > 0 else ttft
        figures = self._figures(done)
        fresh_prompt = max(figures["prompt_tokens"] - figures["cached_tokens"], 0)
        return MessageStats(
            **figures,
            ttft_s=ttft,
            prefill_tokens_per_s=fresh_prompt / prefill_s if prefill_s > 0 and fresh_prompt else None,
            decode_tokens_per_s=decode_tokens_per_s(
                live.new_tokens - self.first_chunk_tokens, self.t_first, self.t_last
            ),
            total_s=t_end - self.t_start,
            preset=preset,
            num_draft_tokens=num_draft_tokens,
            temperature=temperature,
            draft_mode=draft_mode,  # type: ignore[arg-type]
            backend=backend,
            model=model,
            stop_reason=done.stop_reason,
            router_reason=router_reason,
            cache_mode=cache_mode,
            k_mode=k_mode,
            k_per_round=list(self.k_per_round),
            notes=list(done.notes),
            drafted_by=dict(self.drafted_by),
            accepted_by=dict(self.accepted_by),
        )

    def _cost_and_speedup(
        self, done: Done, alpha: float | None, k_eff: int
    ) -> tuple[float | None, float | None]:
        """The cost ratio c and the predicted speedup. Nothing measured reads "–" (None), never 0: c where no draft
        step was timed, the speedup where no round drafted."""
        live = self.live
        c = (
            done.draft_step_s / done.target_step_s
            if done.target_step_s > 0 and done.draft_step_s > 0
            else None
        )
        if not self.drafting_rounds:
            speedup = None
        elif done.round_cost and live.rounds:
            # Over all rounds (those without a draft count): tokens per round / cost of a round in plain steps.
            speedup = (live.new_tokens / live.rounds) / done.round_cost
        else:
            speedup = (
                predicted_speedup(alpha, k_eff, c if c is not None else 0.0) if alpha is not None else None
            )
        return c, speedup

    def _figures(self, done: Done) -> dict:
        """The MessageStats fields counted over the reply's rounds (a server's own figures over them where it
        reports them)."""
        live = self.live
        alpha, k_eff = self.alpha_and_k()
        c, speedup = self._cost_and_speedup(done, alpha, k_eff)
        figures = {
            "prompt_tokens": done.prompt_tokens,
            "cached_tokens": done.cached_tokens,
            "new_tokens": live.new_tokens,
            "drafted_tokens": live.drafted,
            "accepted_tokens": live.accepted,
            "rounds": live.rounds,
            "acceptance_rate": live.acceptance_rate,
            "mean_accepted_length": live.mean_accepted_length,
            "per_position_acceptance": self.per_position_acceptance(),
            "model_per_position_acceptance": self.model_per_position_acceptance(),
            "acceptance_histogram": list(self.accepted_counts),
            "alpha": alpha,
            "predicted_speedup": speedup,
            "cost_ratio": c,
            "verify_cost": list(done.verify_cost),
            "unavailable": {},
        }
        if done.server is not None:
            figures.update(server_figures(done.server, live.new_tokens))
        return figures


# Reasons shown in the inspector for what no server reports.
NO_HISTOGRAM = "the server does not report accepted drafts per round"
NO_COST_RATIO = "the server does not report draft and target step times"


def server_figures(server: ServerStats, counted_tokens: int) -> dict:
    """MessageStats fields from a remote server's own figures: what it did not say stays empty, with a reason."""
    unavailable = dict(server.unavailable)
    new_tokens = server.new_tokens if server.new_tokens is not None else counted_tokens
    drafted, accepted = server.drafted, server.accepted
    figures: dict = {
        "new_tokens": new_tokens,
        "drafted_tokens": drafted or 0,
        "accepted_tokens": accepted or 0,
        "acceptance_rate": accepted / drafted if drafted and accepted is not None else None,
        "acceptance_histogram": [],
        "predicted_speedup": None,
        "cost_ratio": None,
        "per_position_acceptance": [],
        "alpha": None,
    }
    unavailable.setdefault("acceptance_histogram", NO_HISTOGRAM)
    unavailable.setdefault("cost_ratio", NO_COST_RATIO)
    unavailable.setdefault("predicted_speedup", "needs the cost ratio c: " + NO_COST_RATIO)
    if server.prompt_tokens is not None:
        figures["prompt_tokens"] = server.prompt_tokens
    if server.cached_tokens is not None:
        figures["cached_tokens"] = server.cached_tokens
    if accepted is not None:
        # Every round emits one token of the target's own: rounds = tokens - accepted drafts.
        rounds = max(new_tokens - accepted, 0)
        figures["rounds"] = rounds
        figures["mean_accepted_length"] = new_tokens / rounds if rounds else None
    else:
        figures["rounds"] = 0
        figures["mean_accepted_length"] = None
        unavailable.setdefault("mean_accepted_length", "the server did not report accepted drafts")
        unavailable.setdefault("rounds", "the server did not report accepted drafts")
    dr = server.drafting_rounds
    if dr and drafted and accepted is not None:
        figures["alpha"] = solve_alpha((accepted + dr) / dr, max(1, round(drafted / dr)))
    else:
        unavailable.setdefault("alpha", "the server did not report how many rounds drafted")
    if server.position_drafted and server.position_accepted:
        figures["per_position_acceptance"] = [
            a / d for a, d in zip(server.position_accepted, server.position_drafted, strict=False) if d
        ]
    else:
        unavailable.setdefault("per_position_acceptance", "the server does not report drafts per position")
    figures["unavailable"] = unavailable
    return figures


def _rates(accepted_at_least: list[int], drafted_at_least: list[int]) -> list[float]:
    accepted = accepted_at_least + [0] * (len(drafted_at_least) - len(accepted_at_least))
    return [a / d for a, d in zip(accepted, drafted_at_least, strict=True)]


def _is_lookup(drafter: str | None) -> bool:
    """A round's drafter whose drafts take no model steps (the name map's `steps`); None: a draft model's or not said."""
    spec = spec_of_mode(drafter)
    return spec is not None and not spec.steps


def _bump(counts: list[int], index: int) -> None:
    if index >= len(counts):
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1
