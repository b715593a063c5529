"""What a loaded GGUF is, as far as speculation cares: its memory (attention only, recurrent with native
rollback, recurrent with checkpoints), mixture of experts or dense, MTP layers. The load notes, the inspector and
`specchat doctor` all print `ModelShape.describe()`, so they say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.backends.llamacpp.memory import ROLLBACK_ARCHS


@dataclass(frozen=True)
class ModelShape:
    arch: str
    memory: str  # "attention", "rollback" or "checkpoints"
    rollback_depth: int = 0
    experts: int = 0  # 0: dense
    experts_used: int = 0
    mtp_layers: int = 0
    rollback_asked: bool = True  # the context asked for native rollback (n_rs_seq > 0)
    params: int = 0  # every weight of the file (0: not read)
    expert_params: int = 0  # the routed experts' weights (tensors named *_exps), all experts together

    @property
    def active_params(self) -> int:
        """The weights one token runs through: all but the routed experts it is not sent to."""
        if not self.moe or not self.params:
            return self.params
        idle = self.expert_params * (self.experts - self.experts_used) / self.experts
        return round(self.params - idle)

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def memory_line(self) -> str:
        if self.memory == "rollback":
            return (
                f"drafts dropped by rolling the recurrent state back natively (up to {self.rollback_depth} "
                "tokens), checkpoints past that"
            )
        if self.memory == "checkpoints":
            why = (
                "native rollback is asked for only with a draft model or MTP head: its snapshots take 17x the state's memory"
                if self.arch in ROLLBACK_ARCHS and not self.rollback_asked
                else f"no native rollback for {self.arch}"
            )
            return f"drafts dropped by restoring a state checkpoint and replaying the accepted tokens ({why})"
        return "drafts dropped from the KV cache"

    def describe(self) -> str:
        """One line, e.g. "qwen35: hybrid (recurrent + attention), dense, no MTP layers; drafts dropped by ..."."""
        kind = "attention" if self.memory == "attention" else "hybrid/recurrent"
        experts = (
            f"mixture of experts ({self.experts} experts, {self.experts_used} active per token"
            + (
                f"; {params_text(self.active_params)} of {params_text(self.params)} parameters active)"
                if self.params
                else ")"
            )
            if self.moe
            else "dense"
        )
        mtp = (
            f"{self.mtp_layers} MTP layer{'s' if self.mtp_layers != 1 else ''}"
            if self.mtp_layers
            else "no MTP layers"
        )
        return f"{self.arch}: {kind}, {experts}, {mtp}; {self.memory_line()}"


def params_text(count: int) -> str:
    """1234567 -> "1.2M", 35_000_000_000 -> "35.0B"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def weight_counts(path: Path | None) -> tuple[int, int]:
    """(every weight, the routed experts' weights) of a GGUF file, from its header; (0, 0) where unread."""
    from engine.backends.llamacpp.native import gguf_tensors

    if path is None:
        return 0, 0
    try:
        tensors = gguf_tensors(path)
    except (OSError, ValueError):
        return 0, 0
    total = sum(count for _name, count, _code in tensors)
    # llama.cpp's routed-expert tensors: blk.N.ffn_{gate,up,down,gate_up}_exps (shared experts are *_shexp)
    experts = sum(count for name, count, _code in tensors if name.split(".")[-2].endswith("_exps"))
    return total, experts


def model_shape(lib, model, memory, path: Path | None = None) -> ModelShape:
    """The shape of a loaded `model` (llama_cpp._internals.LlamaModel) with its context's `memory`
    (memory.RecurrentMemory, or None for an attention-only cache); `path`: its file, for the weight counts."""
    metadata = model.metadata()
    arch = metadata.get("general.architecture", "unknown")

    def number(key: str) -> int:
        try:
            return int(metadata.get(f"{arch}.{key}", 0) or 0)
        except (TypeError, ValueError):
            return 0

    nextn = getattr(lib, "llama_model_n_layer_nextn", None)
    mtp = int(nextn(model.model)) if nextn is not None else number("nextn_predict_layers")
    if memory is None:
        kind, depth, asked = "attention", 0, True
    else:
        kind, depth, asked = memory.kind, memory.depth, memory.asked > 0
    params, expert_params = weight_counts(path)
    return ModelShape(
        arch=arch,
        memory=kind,
        rollback_depth=depth,
        experts=number("expert_count"),
        experts_used=number("expert_used_count"),
        mtp_layers=mtp,
        rollback_asked=asked,
        params=params,
        expert_params=expert_params,
    )
