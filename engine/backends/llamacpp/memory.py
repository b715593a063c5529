"""How a recurrent or hybrid model's llama.cpp memory drops a tail: rollback, checkpoints, replay.

An attention KV cache drops any tail (`llama_memory_seq_rm`). A recurrent state (Mamba, Gated DeltaNet, LFM2's
convolutions) holds one state per sequence, not one row per token, so a rejected draft cannot simply be removed.
llama.cpp offers two ways, and specchat uses both, the way llama-server does (vendored llama.cpp,
tools/server/server-context.cpp, the speculative checkpoint near line 3050 and its restore near line 3905):

- **Native rollback.** A context created with `n_rs_seq = N` keeps N per-token state snapshots of the last batch,
  and `llama_memory_seq_rm(seq, p, -1)` then rolls back up to N tokens with no decode
  (src/llama-memory-recurrent.cpp, `seq_rm`, line 193). Only for the architectures llama.cpp lists
  (`llm_arch_supports_rs_rollback`, src/llama-arch.cpp line 1123: qwen35, qwen35moe, nemotron_h, lfm2, ...); for any
  other it is silently 0 (`llama_n_rs_seq(ctx)` says what is in force). Two upstream traps, avoided here: a rollback
  is single-use until the next decode (a second `seq_rm` fails), and rolling back a whole last batch would restore
  the wrong state. So crops are applied lazily, once, right before the next decode (several crops in a row merge
  into one rollback, and no step ever comes between a pass and its rollback), and only where the last batch keeps
  at least one of its tokens.
- **Checkpoints.** `llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)` copies the recurrent part
  of the state (common/common.cpp, common_prompt_checkpoint); a crop that rollback cannot do restores the latest
  checkpoint at or before the new length, drops the attention rows after it, and decodes the tokens in between again
  (a replay). A checkpoint is taken before every pass whose rejected tail could exceed the rollback depth (all
  passes where there is no native rollback), at the start of each new user turn and at the end of each prompt, so
  a regenerate or an edited question replays at most the new turn instead of prefilling the whole conversation.

A crop that neither covers is rebuilt by decoding the kept prefix again (counted as re-prefilled tokens). Decodes
made here never pad and never crop, so nothing recurses.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

# Per-token state snapshots asked for (the context's n_rs_seq): rejected tails up to this many tokens roll back
# natively; a longer one (a long-match round's drafts past it) restores a checkpoint. The state buffer grows
# (1 + N)-fold: 16 keeps it modest on a large model (llama-server asks for its draft length) and covers the
# presets' K.
ROLLBACK_DEPTH = 16
# The architectures whose recurrent state llama.cpp 0.3.36 rolls back natively (`llm_arch_supports_rs_rollback`,
# vendored src/llama-arch.cpp line 1123), as `general.architecture` names them; for any other n_rs_seq is 0.
ROLLBACK_ARCHS = frozenset(
    {"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe"}
    | {"lfm2", "lfm2moe", "bailingmoe3"}
)


@dataclass
class MemoryCounters:
    """What dropping tails cost so far (the bench and doctor print them beside the verify pass)."""

    rollbacks: int = 0  # native rollbacks (no decode)
    checkpoints: int = 0  # state copies taken
    checkpoint_s: float = 0.0
    checkpoint_bytes: int = 0  # the size of the latest copy
    restores: int = 0
    restore_s: float = 0.0
    replayed: int = 0  # tokens decoded again after a restore
    replay_s: float = 0.0
    reprefilled: int = (
        0  # tokens decoded again from an empty memory (no rollback or checkpoint covered the crop)
    )

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def clear(self) -> None:
        """Count from zero again (the bench, once the load's kernel probe has run)."""
        self.__dict__.update(MemoryCounters().__dict__)

    def describe(self) -> str:
        """One line of what dropping drafts cost (the bench prints it beside the verify passes)."""

        def each(seconds: float, count: int, unit: str = "each") -> str:
            return f"{seconds / count * 1000:.2f} ms {unit}" if count else "-"

        return (
            f"{self.rollbacks} rollbacks; {self.checkpoints} checkpoints ({self.checkpoint_bytes / 1e6:.1f} MB, "
            f"{each(self.checkpoint_s, self.checkpoints)}); {self.restores} restores "
            f"({each(self.restore_s, self.restores)}); {self.replayed} tokens replayed "
            f"({each(self.replay_s, self.replayed, 'a token')}); {self.reprefilled} re-prefilled"
        )


@dataclass
class Checkpoint:
    position: int  # tokens the memory held when the state was copied
    data: ctypes.Array


@dataclass
class RecurrentMemory:
    """The recurrent side of one llama.cpp context: what it holds beyond the model's `ids` (a crop not yet
    applied), its rollback depth and its checkpoints."""

    lib: object
    ctx: object  # llama_cpp._internals.LlamaContext
    depth: int  # llama_n_rs_seq in force: 0 where the architecture has no native rollback (or none was asked)
    asked: int = ROLLBACK_DEPTH  # the n_rs_seq the context was created with
    held: int = 0  # tokens the memory holds now (more than the model's ids while a crop is pending)
    batch_start: int = 0  # where the last decoded batch began
    # The newest checkpoint per slot: "pass" (before a verify pass), "turn" (a user turn's start), "prompt" (its end).
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    counters: MemoryCounters = field(default_factory=MemoryCounters)

    @property
    def kind(self) -> str:
        return "rollback" if self.depth > 0 else "checkpoints"

    def reset(self) -> None:
        self.held = self.batch_start = 0
        self.checkpoints.clear()

    def decoded(self, held: int, width: int) -> None:
        self.held, self.batch_start = held, held - width

    def needs_checkpoint(self, width: int) -> bool:
        """Whether a pass of `width` tokens could leave a tail rollback cannot drop (all but its first token)."""
        return width - 1 > self.depth

    def checkpoint(self, slot: str) -> None:
        """Copy the recurrent state as it is now (call with no crop pending) into `slot`."""
        start = time.perf_counter()
        flags = self.lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = self.lib.llama_state_seq_get_size_ext(self.ctx.ctx, 0, flags)
        buffer = (ctypes.c_uint8 * size)()
        written = self.lib.llama_state_seq_get_data_ext(self.ctx.ctx, buffer, size, 0, flags)
        if written != size:
            self.checkpoints.pop(slot, None)
            return
        self.checkpoints[slot] = Checkpoint(self.held, buffer)
        self.counters.checkpoints += 1
        self.counters.checkpoint_bytes = size
        self.counters.checkpoint_s += time.perf_counter() - start

    def try_rollback(self, length: int) -> bool:
        """Drop the tail past `length` natively, where the snapshots reach and the last batch keeps a token."""
        tail = self.held - length
        if not (0 < tail <= self.depth and length > self.batch_start):
            return False
        if not self.ctx.kv_cache_seq_rm(0, length, -1):
            return False
        self.held = length
        self.batch_start = min(self.batch_start, length)
        self.counters.rollbacks += 1
        return True

    def restore(self, length: int) -> int | None:
        """Restore the newest checkpoint at or before `length` and drop the attention rows after it; the position
        it holds then (the caller replays the tokens up to `length`), or None where no checkpoint fits."""
        usable = [c for c in self.checkpoints.values() if c.position <= length]
        if not usable:
            return None
        chosen = max(usable, key=lambda c: c.position)
        start = time.perf_counter()
        flags = self.lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        data = chosen.data
        read = self.lib.llama_state_seq_set_data_ext(self.ctx.ctx, data, len(data), 0, flags)
        if read != len(data) or not self.ctx.kv_cache_seq_rm(0, chosen.position, -1):
            self.checkpoints.clear()
            return None
        self.held = self.batch_start = chosen.position
        # Checkpoints past the restored position describe a future that is gone.
        for slot in [s for s, c in self.checkpoints.items() if c.position > chosen.position]:
            del self.checkpoints[slot]
        self.counters.restores += 1
        self.counters.restore_s += time.perf_counter() - start
        return chosen.position
