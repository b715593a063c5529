"""How `specchat tune` decides, per task, from the rows it measured: the K to write (a fixed K, or an adaptive
preset's ceiling), and whether the temperature ramp pays; a change only where it wins by more than the noise."""

from __future__ import annotations

from collections.abc import Sequence

from engine.benchmarks.tune.results import TaskDecision, TuneRow, speedup_text
from engine.request import SamplerSettings

# A preset's K or ramp changes only when the alternative is faster by more than this (a short sweep is noisy).
NOISE_MARGIN = 0.03


def decide_k(
    task: str,
    preset_k: int,
    winner: TuneRow,
    rows: list[TuneRow],
    adaptive_rows: Sequence[TuneRow] = (),
    k_mode: str = "fixed",
) -> TaskDecision:
    """The K to write. A fixed preset: the fastest fixed K, unless it beats the preset's K only by noise. An
    adaptive preset (K is the ceiling): the faster of its own ceiling and the sweep's largest (its own unless the
    other wins by more than noise), or a fixed K where the fastest fixed K beats adaptive by more than noise."""
    if k_mode == "adaptive" and adaptive_rows:
        return _decide_ceiling(task, preset_k, winner, adaptive_rows)
    decision = TaskDecision(task, preset_k, winner.k, winner.measured_speedup, apply_k=winner.k)
    current = next((r for r in rows if r.k == preset_k), None)
    if winner.k == preset_k:
        decision.k_note = f"the preset's K {preset_k} is the best"
    elif current is None:
        decision.k_note = f"K {winner.k} is the best (the preset's K {preset_k} was not swept)"
    elif winner.tokens_per_s > current.tokens_per_s * (1 + NOISE_MARGIN):
        gain = winner.tokens_per_s / current.tokens_per_s - 1
        decision.k_note = f"K {winner.k} beats the preset's K {preset_k} by {gain:.0%}"
    else:
        gain = winner.tokens_per_s / current.tokens_per_s - 1
        decision.apply_k = preset_k
        decision.k_note = (
            f"K {winner.k} beats the preset's K {preset_k} by only {gain:.0%} (noise margin "
            f"{NOISE_MARGIN:.0%}): K {preset_k} stays"
        )
    return decision


def _decide_ceiling(
    task: str, preset_k: int, winner: TuneRow, adaptive_rows: Sequence[TuneRow]
) -> TaskDecision:
    current = next((r for r in adaptive_rows if r.k == preset_k), None)
    fastest = max(adaptive_rows, key=lambda r: r.tokens_per_s)
    if current is None or fastest.tokens_per_s > current.tokens_per_s * (1 + NOISE_MARGIN):
        chosen = fastest
    else:
        chosen = current
    decision = TaskDecision(task, preset_k, winner.k, winner.measured_speedup, apply_k=chosen.k)
    if winner.tokens_per_s > chosen.tokens_per_s * (1 + NOISE_MARGIN):
        gain = winner.tokens_per_s / chosen.tokens_per_s - 1
        decision.apply_k, decision.k_mode = winner.k, "fixed"
        decision.k_note = (
            f"fixed K {winner.k} beats adaptive K (up to {chosen.k}) by {gain:.0%}: k_mode fixed"
        )
    elif chosen.k == preset_k:
        decision.k_note = (
            f"adaptive K up to {preset_k} stays ({speedup_text(chosen.measured_speedup)} vs plain)"
        )
    else:
        decision.k_note = (
            f"adaptive K up to {chosen.k} beats up to {preset_k} ({speedup_text(chosen.measured_speedup)} vs plain): "
            f"ceiling {chosen.k}"
        )
    return decision


def decide_ramp(
    decision: TaskDecision,
    preset_sampler: SamplerSettings,
    on: SamplerSettings,
    on_row: TuneRow,
    off_row: TuneRow,
) -> None:
    if on.temperature <= 0:
        decision.ramp_note = "greedy preset: no ramp to tune"
        return
    gain = on_row.tokens_per_s / off_row.tokens_per_s - 1 if off_row.tokens_per_s > 0 else 0.0
    had_ramp = preset_sampler.ramp_tokens > 0
    if gain > NOISE_MARGIN and not had_ramp:
        decision.ramp = (on.ramp_tokens, on.ramp_start)
        decision.ramp_note = f"a ramp pays ({gain:+.0%} tok/s): added"
    elif gain < -NOISE_MARGIN and had_ramp:
        decision.ramp = (0, 0.0)
        decision.ramp_note = f"the ramp costs speed ({gain:+.0%} tok/s): turned off"
    else:
        decision.ramp_note = f"ramp on vs off {gain:+.0%} tok/s: left as it is"
