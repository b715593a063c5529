"""Whether draft-model or n-gram speculation pays on a machine we do not have: a pass-cost model and the speedup.

Contract: pure functions over plain numbers, no I/O. A forward pass of `width` tokens costs

    t(width) = layers x layer_overhead + weight_bytes / bandwidth + width x 2 x params / (cores x flops_per_core)

a fixed part per layer (kernel launches, thread syncs), the weights read once per pass (memory-bound), and the
matrix work of every token in the pass (compute). The parts are added, not overlapped: conservative, and what a
2-core CPU shows (every extra token in a pass adds a fixed share of a one-token pass; docs/performance.md). From it,
r(1 + k) = t(1 + k) / t(1) and c = t_draft(1) / t(1); with the measured per-position acceptance r_i (rounds that
accepted at least i / rounds that drafted at least i), a draft model's round of k drafts emits E(k) = 1 + r_1 +
... + r_k tokens for r(1 + k) + k c plain steps, so its speedup is E(k) / (r(1 + k) + k c). n-gram rounds are
re-priced one by one (what they drafted and accepted, measured) on the machine's curve, at no drafting cost.

`draft_pays_verdict` is the doctor's line for the machine at hand, from the backend's measured costs.
`fit_machine` calibrates bandwidth and per-core throughput from this machine's measured one-token pass and verify
curve, so the table's first row is the machine the bench ran on, in the same model as the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.events import fmt


@dataclass(frozen=True)
class Machine:
    name: str
    bandwidth_gbs: float  # sustained memory bandwidth, GB/s
    cores: int  # cores (a GPU: its streaming multiprocessors)
    gflops_per_core: float  # sustained matrix throughput per core on these weights, GFLOP/s
    layer_overhead_s: float = 0.0  # fixed cost per layer per pass (a GPU's kernel launches)


@dataclass(frozen=True)
class ModelShape:
    name: str
    weight_bytes: int
    params: int
    layers: int


# The pair (GGUF file sizes; parameters and layers from the models' configs).
QWEN_1_5B = ModelShape("Qwen2.5-Coder-1.5B Q4_K_M", 1_117_320_768, 1_543_714_304, 28)
QWEN_0_5B = ModelShape("Qwen2.5-Coder-0.5B Q4_K_M", 491_400_064, 494_032_768, 24)
# A bigger target of the same family (not fetched here): what the pair's acceptance would buy at 7B, if the 0.5B
# drafted for it as well as for the 1.5B (an assumption: a bigger target usually agrees a little less).
QWEN_7B = ModelShape("Qwen2.5-Coder-7B Q4_K_M (acceptance assumed)", 4_683_073_536, 7_615_616_512, 28)

# Machines we do not have. The desktop: dual-channel DDR5 and this machine's per-core throughput (fitted). The GPU:
# an RTX 4090-class card, 128 SMs x 600 GFLOP/s of quantized matrix work, ~60 us per layer per pass of launches
# and syncs (what keeps small models far below the bandwidth bound on a GPU).
DESKTOP_8_CORE = Machine("8-core desktop (DDR5, 60 GB/s)", 60.0, 8, 0.0)
GPU_24GB = Machine("24 GB GPU (1000 GB/s)", 1000.0, 128, 600.0, 60e-6)


def pass_seconds(machine: Machine, model: ModelShape, width: int) -> float:
    memory = model.weight_bytes / (machine.bandwidth_gbs * 1e9)
    compute = width * 2.0 * model.params / (machine.cores * machine.gflops_per_core * 1e9)
    return model.layers * machine.layer_overhead_s + memory + compute


def verify_curve(machine: Machine, target: ModelShape, k_max: int) -> list[float]:
    """r(1 + k) for k = 0..k_max (r(1) = 1)."""
    one = pass_seconds(machine, target, 1)
    return [pass_seconds(machine, target, 1 + k) / one for k in range(k_max + 1)]


def draft_cost_ratio(machine: Machine, target: ModelShape, draft: ModelShape) -> float:
    """c: a one-token draft step in one-token target passes."""
    return pass_seconds(machine, draft, 1) / pass_seconds(machine, target, 1)


def fit_machine(
    name: str, target: ModelShape, one_token_s: float, curve: dict[int, float], cores: int
) -> Machine:
    """This machine in the model: t(w) = a + b w fitted (least squares) to the measured curve t(1) r(w), a the
    weights read (so the bandwidth), b the compute per token (so the per-core throughput)."""
    points = [(w, one_token_s * r) for w, r in sorted(curve.items())]
    if len(points) < 2:
        raise ValueError("fit_machine needs the verify cost at two widths at least")
    n = len(points)
    mean_w = sum(w for w, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    spread = sum((w - mean_w) ** 2 for w, _ in points)
    slope = sum((w - mean_w) * (t - mean_t) for w, t in points) / spread
    slope = max(slope, 1e-9)
    intercept = max(mean_t - slope * mean_w, 1e-9)
    return Machine(
        name,
        bandwidth_gbs=target.weight_bytes / intercept / 1e9,
        cores=cores,
        gflops_per_core=2.0 * target.params / slope / cores / 1e9,
    )


def with_throughput_of(machine: Machine, measured: Machine) -> Machine:
    """`machine` with the per-core throughput fitted here, where it does not give its own."""
    if machine.gflops_per_core > 0:
        return machine
    return replace(machine, gflops_per_core=measured.gflops_per_core)


def expected_tokens(per_position: Sequence[float], k: int) -> float:
    return 1.0 + sum(per_position[:k])


def draft_speedup(per_position: Sequence[float], curve: Sequence[float], c: float, k: int) -> float:
    """Tokens per unit time against plain decoding, for a draft model drafting k tokens every round."""
    if k <= 0:
        return 1.0
    return expected_tokens(per_position, k) / (curve[k] + k * c)


def best_draft_k(per_position: Sequence[float], curve: Sequence[float], c: float) -> tuple[int, float]:
    """The k (0 = do not draft) with the highest speedup, for k up to the measured positions and the curve."""
    best = (0, 1.0)
    for k in range(1, min(len(per_position), len(curve) - 1) + 1):
        speedup = draft_speedup(per_position, curve, c, k)
        if speedup > best[1]:
            best = (k, speedup)
    return best


def repriced_speedup(rounds: Sequence[tuple[int, int]], curve: Sequence[float]) -> float | None:
    """Measured rounds (drafted, accepted) re-priced on a curve: tokens / plain steps (n-gram: drafting is free).
    Rounds that drafted past the curve take its last slope."""
    if not rounds:
        return None
    slope = curve[-1] - curve[-2] if len(curve) > 1 else 0.0

    def r(width: int) -> float:
        return curve[width - 1] if width <= len(curve) else curve[-1] + slope * (width - len(curve))

    tokens = sum(accepted + 1 for _, accepted in rounds)
    return tokens / sum(r(1 + drafted) for drafted, _ in rounds)


@dataclass(frozen=True)
class PredictionRow:
    machine: str
    target: str
    r2: float  # r(2): what one draft token adds to a verify pass
    c: float
    draft_k: int
    draft_speedup: float
    ngram_speedup: float | None

    def verdict(self) -> str:
        best = max(self.draft_speedup, self.ngram_speedup or 0.0)
        if best < 1.03:
            return "neither pays: decode plainly"
        if self.ngram_speedup is not None and self.ngram_speedup >= self.draft_speedup:
            return f"n-gram pays {self.ngram_speedup:.2f}x"
        return f"draft model K={self.draft_k} pays {self.draft_speedup:.2f}x"


def predict(
    machine: Machine,
    target: ModelShape,
    draft: ModelShape,
    per_position: Sequence[float],
    ngram_rounds: Sequence[tuple[int, int]] = (),
    k_max: int = 8,
    measured_curve: Sequence[float] | None = None,
    measured_c: float | None = None,
) -> PredictionRow:
    """A machine's row; `measured_curve` (r(1 + k), k = 0..) and `measured_c` replace the model's figures where
    the machine is the one the bench ran on (the model is linear, a measured curve is not)."""
    curve = list(measured_curve) if measured_curve else verify_curve(machine, target, max(k_max, 16))
    c = measured_c if measured_c is not None else draft_cost_ratio(machine, target, draft)
    k, speedup = best_draft_k(per_position[:k_max], curve, c)
    return PredictionRow(
        machine.name, target.name, curve[1], c, k, speedup, repriced_speedup(ngram_rounds, curve)
    )


def prediction_table(rows: Sequence[PredictionRow]) -> str:
    lines = [
        f"{'machine':<34} {'target':<28} {'r(2)':>5} {'c':>5} {'draft K':>7} {'draft':>6} {'n-gram':>7}  verdict",
    ]
    for row in rows:
        ngram = fmt(row.ngram_speedup, "{:.2f}x")
        lines.append(
            f"{row.machine[:34]:<34} {row.target[:28]:<28} {row.r2:>5.2f} {row.c:>5.2f} {row.draft_k:>7} "
            f"{row.draft_speedup:>5.2f}x {ngram:>7}  {row.verdict()}"
        )
    return "\n".join(lines)


def draft_pays_verdict(costs, draft_mode: str, k_max: int) -> tuple[str, str]:
    """Whether drafting can pay on this machine, and why, in one line (the chat shows the same verdict:
    `engine.decoding.verdict`). ("warn", ...) where no K could pay."""
    from engine.decoding.verdict import draft_verdict

    verdict = draft_verdict(costs, draft_mode, k_max)
    return verdict.status, verdict.doctor_line()
