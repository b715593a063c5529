"""Acceptance accounting and the speedup model, shared by status bar, inspector, logs and bench.

Definitions (DESIGN.md):
- acceptance rate = accepted / drafted
- mean accepted length tau = emitted tokens / verification rounds (includes the target's own token)
- per-position acceptance r_i = rounds with at least i accepted / rounds that drafted at least i
- alpha solves alpha + alpha^2 + ... + alpha^K = tau - 1
- predicted speedup S(K) = (1 - alpha^(K+1)) / ((1 - alpha)(cK + 1)), c = draft step time / target step time;
  where the backend measures what a round costs (`Done.round_cost`, in plain steps, from its verify-cost curve),
  the prediction is over all rounds instead: tau / round_cost, rounds without a draft included

A round that drafted nothing (drafting off, or an n-gram drafter that backed off) is still one target forward
pass, so it counts in tau. Alpha and the speedup model look only at rounds that drafted, with K the mean number of
drafts in such a round: that is the question they answer ("when we draft, how good is it").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import Chunk, Done, LiveStats, MessageStats
from engine.rates import decode_tokens_per_s, time_to_first_token

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

    def add(self, chunk: Chunk) -> None:
        live = self.live
        n = len(chunk.token_ids)
        if self.t_first is None:
            self.t_first = chunk.t
            self.first_chunk_tokens = n
        self.t_last = chunk.t
        live.new_tokens += n
        live.rounds += 1
        live.drafted += chunk.drafted
        live.accepted += chunk.accepted
        live.temperature = chunk.temperature
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
            rate = chunk.accepted / chunk.drafted
            live.ema_acceptance = (
                rate
                if live.ema_acceptance is None
                else (1 - EMA_WEIGHT) * live.ema_acceptance + EMA_WEIGHT * rate
            )
            live.recent_round_acceptance.append(rate)
            del live.recent_round_acceptance[:-SPARKLINE_ROUNDS]
        live.ttft_s = time_to_first_token(self.t_start, self.t_first)
        live.tokens_per_s = decode_tokens_per_s(
            live.new_tokens - self.first_chunk_tokens, self.t_first, self.t_last
        )

    def per_position_acceptance(self) -> list[float]:
        return [
            a / d
            for a, d in zip(
                self.accepted_at_least + [0] * (len(self.drafted_at_least) - len(self.accepted_at_least)),
                self.drafted_at_least,
                strict=True,
            )
        ]

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
        live = self.live
        alpha, k_eff = self.alpha_and_k()
        c = done.draft_step_s / done.target_step_s if done.target_step_s > 0 else None
        if done.round_cost and live.rounds:
            # Over all rounds (those without a draft count): tokens per round / cost of a round in plain steps.
            speedup = (live.new_tokens / live.rounds) / done.round_cost
        else:
            speedup = (
                predicted_speedup(alpha, k_eff, c if c is not None else 0.0) if alpha is not None else None
            )
        ttft = (self.t_first - self.t_start) if self.t_first is not None else t_end - self.t_start
        prefill_s = done.prefill_s if done.prefill_s > 0 else ttft
        fresh_prompt = max(done.prompt_tokens - done.cached_tokens, 0)
        return MessageStats(
            prompt_tokens=done.prompt_tokens,
            new_tokens=live.new_tokens,
            drafted_tokens=live.drafted,
            accepted_tokens=live.accepted,
            rounds=live.rounds,
            acceptance_rate=live.acceptance_rate,
            mean_accepted_length=live.mean_accepted_length,
            per_position_acceptance=self.per_position_acceptance(),
            acceptance_histogram=list(self.accepted_counts),
            alpha=alpha,
            predicted_speedup=speedup,
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
            cached_tokens=done.cached_tokens,
            cost_ratio=c,
            router_reason=router_reason,
            cache_mode=cache_mode,
            k_mode=k_mode,
            k_per_round=list(self.k_per_round),
        )


def _bump(counts: list[int], index: int) -> None:
    if index >= len(counts):
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1
