"""One GGUF model in llama.cpp: its context (the KV cache) and the token ids whose keys and values it holds.

The llama.cpp backend (backend.py) keeps one for the target and one for a draft model; the round loop scores,
crops and prefills through it (`score`, `next_logits`, `crop`, `prefill`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.backends.llamacpp.library import raw_bindings
from engine.backends.llamacpp.memory import ROLLBACK_DEPTH, RecurrentMemory
from engine.backends.llamacpp.pool import ThreadPool
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.round_loop import common_prefix
from engine.errors import BackendError, first_line

# Prompt tokens per decode call while prefilling; the cancel event is checked between slices.
PREFILL_SLICE = 256


class LlamaCppModel:
    """One GGUF model with its llama.cpp context (KV cache) and the token ids whose keys/values it holds."""

    def __init__(
        self,
        lib,
        path: Path,
        n_ctx: int,
        threads: int,
        cache_type: int,
        n_batch: int,
        gpu_layers: int,
        repack: bool = True,
        load_mtp: bool = False,
        rollback: bool = True,
        pool: ThreadPool | None = None,
    ) -> None:
        """`pool`: another context's worker pool to compute on (a draft model beside its target: pool.py says
        why one pool); None makes this context its own."""
        from llama_cpp import _internals

        self._lib = lib
        self.repack = repack
        self.model = self._load_model(path, gpu_layers, repack, load_mtp)
        self.n_ctx_train = int(self.model.n_ctx_train())
        self.n_vocab = int(self.model.n_vocab())
        # A recurrent or hybrid model's memory drops tails by rollback or checkpoints (memory.py).
        self.recurrent = bool(
            lib.llama_model_is_recurrent(self.model.model) or lib.llama_model_is_hybrid(self.model.model)
        )
        ctx_params = self._context_params(n_ctx, threads, cache_type, n_batch, gpu_layers, rollback)
        self._create_context(path, n_ctx, cache_type, ctx_params)
        self.memory = (
            RecurrentMemory(lib, self.ctx, int(lib.llama_n_rs_seq(self.ctx.ctx)), int(ctx_params.n_rs_seq))
            if self.recurrent
            else None
        )
        self.n_batch = n_batch
        self.batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        # ggml's workers kept between decodes (engine/backends/llamacpp/pool.py); None: llama.cpp's own default.
        if gpu_layers:
            self.pool = None
        elif pool is not None:
            pool.attach_to(raw_bindings(), self.ctx.ctx)
            self.pool = pool
        else:
            self.pool = ThreadPool.attach(raw_bindings(), self.ctx.ctx, threads)
        self.owns_pool = pool is None
        self.ids: list[int] = []
        self.step_times: list[float] = []
        # Cached tokens under the latest timed pass (what its attention read besides its own rows).
        self.pass_context = 0
        # Round cost by width (1 + drafts), in seconds, for the n-gram drafter; None: not measured.
        self.costs: VerifyCostModel | None = None
        # One-token decodes go through the batched kernels (a throw-away second position): set by the backend
        # where llama.cpp's single-token and batched kernels round differently.
        self.pad_single = False
        # False once the memory refused to drop a tail (crop then re-prefills).
        self.can_crop = True
        # The model's MTP head (mtp.MtpHead), which follows every decode and crop; None: no MTP drafting.
        self.mtp = None

    def _load_model(self, path: Path, gpu_layers: int, repack: bool, load_mtp: bool):
        """The GGUF's weights in llama.cpp (a one-line BackendError where it cannot read them)."""
        from llama_cpp import _internals

        params = self._lib.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        # Weight repacking into llama.cpp's extra buffer types (AMX, the CPU repack): see native.py.
        params.use_extra_bufts = repack
        params.load_mtp = load_mtp  # the MTP (nextn) layers, for --draft mtp (mtp.py)
        try:
            return _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
        except (ValueError, OSError) as exc:
            raise BackendError(f"llama.cpp could not load {path}: {first_line(exc)}") from exc

    def _context_params(
        self, n_ctx: int, threads: int, cache_type: int, n_batch: int, gpu_layers: int, rollback: bool
    ):
        """The context's parameters: its size, batch, threads, cache type, flash attention and state snapshots."""
        lib = self._lib
        ctx_params = lib.llama_context_default_params()
        if self.recurrent and rollback:
            # Per-token state snapshots (memory.py): silently 0 where the architecture has no native rollback.
            ctx_params.n_rs_seq = ROLLBACK_DEPTH
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = n_batch
        ctx_params.n_ubatch = n_batch
        ctx_params.n_seq_max = 1
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.type_k = cache_type
        ctx_params.type_v = cache_type
        # Flash attention: a quantized V cache needs it, and on the CPU its kernel computes each query row
        # alike in a batch of one and of many (the plain matrix-product attention does not).
        if cache_type != lib.GGML_TYPE_F16 or gpu_layers == 0:
            ctx_params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        return ctx_params

    def _create_context(self, path: Path, n_ctx: int, cache_type: int, ctx_params) -> None:
        """The context (KV cache) as asked, or an f16 one where llama.cpp cannot make the quantized cache (noted in
        cache_fallback); a one-line BackendError, the model closed, where neither can be made."""
        from llama_cpp import _internals

        lib = self._lib
        # Set where llama.cpp could not make the quantized cache asked for (a head size that is not a multiple
        # of its block, 32) and an f16 cache was taken instead; the backend says so in a note.
        self.cache_fallback: str | None = None
        try:
            self.ctx = _internals.LlamaContext(model=self.model, params=ctx_params, verbose=False)
        except (ValueError, OSError) as exc:
            self.ctx = None
            # Only a quantized cache is retried, as f16 (which needs more memory, so it cannot mend anything else).
            if cache_type != lib.GGML_TYPE_F16:
                ctx_params.type_k = ctx_params.type_v = lib.GGML_TYPE_F16
                with contextlib.suppress(ValueError, OSError):
                    self.ctx = _internals.LlamaContext(model=self.model, params=ctx_params, verbose=False)
            if self.ctx is None:
                self.model.close()
                raise BackendError(
                    f"llama.cpp could not create a context for {path.name} ({n_ctx} tokens): "
                    f"{first_line(exc)}; lower max_context"
                ) from exc
            metadata = self.model.metadata()
            head = metadata.get(f"{metadata.get('general.architecture')}.attention.key_length")
            self.cache_fallback = "llama.cpp could not make a quantized cache for this model" + (
                f" (head size {head}; its blocks are 32 wide)" if head else ""
            )

    def clear(self) -> None:
        self.ctx.kv_cache_clear()
        self.ids = []
        if self.memory is not None:
            self.memory.reset()
        if self.mtp is not None:
            self.mtp.clear()

    def crop(self, length: int) -> None:
        """Keep exactly the first `length` cached positions.

        A recurrent or hybrid memory (memory.py) drops the tail lazily, right before the next decode: several
        crops in a row become one rollback, or one checkpoint restored and the kept tokens after it replayed.
        Any other memory that refuses to drop a tail is cleared and the prefix decoded again (exact, at the cost
        of a prefill); `can_crop` turns False then, so the backend stops drafting for it."""
        if length >= len(self.ids):
            return
        if self.mtp is not None:
            self.mtp.crop(length)
        if self.memory is not None:
            del self.ids[length:]
            return
        if self.ctx.kv_cache_seq_rm(0, length, -1):
            del self.ids[length:]
            return
        self.can_crop = False
        kept = self.ids[:length]
        self.clear()
        self.prefill(kept)

    def checkpoint(self, slot: str) -> None:
        """A recurrent memory keeps a copy of its state as it is now in `slot` ("pass", "turn", "prompt"); a later
        crop back to here restores it instead of prefilling again. Nothing for an attention-only cache."""
        if self.memory is not None:
            self._sync()
            self.memory.checkpoint(slot)

    def _sync(self) -> None:
        """Bring a recurrent memory down to `ids` (a pending crop): rollback, else the newest checkpoint restored
        and the tokens after it replayed, else the prefix decoded again. Never pads, never crops."""
        memory = self.memory
        length = len(self.ids)
        if memory is None or memory.held <= length:
            return
        if memory.try_rollback(length):
            return
        position = memory.restore(length)
        if position is None:
            self.ctx.kv_cache_clear()
            memory.reset()
            position = 0
            memory.counters.reprefilled += length
        else:
            memory.counters.replayed += length - position
        start = time.perf_counter()
        replay = self.ids[position:length]
        del self.ids[position:]
        for offset in range(0, len(replay), PREFILL_SLICE):
            self._decode(replay[offset : offset + PREFILL_SLICE], outputs=0)
        memory.counters.replay_s += time.perf_counter() - start

    def decode(self, tokens: Sequence[int], outputs: int, timed: bool = False, pad: bool | None = None):
        """Run `tokens` on top of the cache; a (outputs, n_vocab) float32 array of the last `outputs` rows.

        A single token (with `pad`, by default `pad_single`) is decoded with a throw-away second position that
        is removed again, so it runs through the batched kernels. `timed` records the step time and feeds it to
        the cost model as a pass of len(tokens) rows.
        """
        pad = self.pad_single if pad is None else pad
        if timed:
            self.pass_context = len(self.ids)
            if self.costs is not None:
                self.costs.context = self.pass_context
        start = time.perf_counter()
        if self.memory is not None:
            self._sync()
            width = 2 if pad and len(tokens) == 1 else len(tokens)
            # A pass whose rejected tail rollback could not drop (all of it where there is no native rollback).
            if (outputs or width > len(tokens)) and self.memory.needs_checkpoint(width):
                self.memory.checkpoint("pass")
        if pad and len(tokens) == 1:
            logits = self._decode([tokens[0], tokens[0]], outputs=2 if outputs else 0)
            self.crop(len(self.ids) - 1)
            logits = None if logits is None else logits[:1]
        else:
            logits = self._decode(tokens, outputs)
        if timed:
            elapsed = time.perf_counter() - start
            self.step_times.append(elapsed)
            if self.costs is not None:
                self.costs.observe(len(tokens), elapsed)
        return logits

    def _decode(self, tokens: Sequence[int], outputs: int):
        import numpy as np

        n = len(tokens)
        if n > self.n_batch:
            raise BackendError(f"internal: a decode of {n} tokens exceeds the batch of {self.n_batch}")
        if self.memory is not None:
            self._sync()
        batch = self.batch.batch
        base = len(self.ids)
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = base + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= n - outputs
        batch.n_tokens = n
        code = self._lib.llama_decode(self.ctx.ctx, batch)
        if code != 0:
            self.clear()  # after a failed decode the cache may hold part of the batch
            if code == 1:
                raise BackendError(
                    "llama.cpp found no room in its KV cache: lower max_new_tokens or the context"
                )
            raise BackendError(f"llama.cpp decode failed (code {code})")
        self.ids.extend(tokens)
        if self.memory is not None:
            self.memory.decoded(len(self.ids), n)
        if self.mtp is not None:
            self.mtp.follow(tokens, base)
        logits = None
        if outputs:
            pointer = self._lib.llama_get_logits(self.ctx.ctx)
            logits = np.ctypeslib.as_array(pointer, shape=(outputs, self.n_vocab)).copy()
        return logits

    def prefill(self, ids: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Bring the cache to `ids` (a prefix of it when `cancel` is set between slices), reusing the longest
        common prefix; the reused length.

        With `pad_single`, a one-token slice gets a throw-away second position (removed again), so that every
        position's keys and values come from the batched kernels.
        """
        reused = common_prefix(self.ids, ids)
        self.crop(reused)
        if reused < len(ids):
            self.checkpoint("turn")  # a recurrent memory: an edit of what follows restores this
        for start in range(reused, len(ids), PREFILL_SLICE):
            if cancel is not None and cancel.is_set():
                break
            self.decode(list(ids[start : start + PREFILL_SLICE]), outputs=0)
        if reused < len(ids) and len(self.ids) == len(ids):
            self.checkpoint("prompt")  # and a regenerate of the reply that follows, this
        return reused

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """The round loop's verify pass: logits of every row of `tokens`, timed as a round of that width."""
        return torch.from_numpy(self.decode(tokens, outputs=len(tokens), timed=True))

    def next_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """A draft step: the logits after the last of `tokens`, timed. The draft's rounding does not matter
        (the target verifies), so its steps take llama.cpp's fast single-token path."""
        return torch.from_numpy(self.decode(tokens, outputs=1, timed=True, pad=False)[-1])

    def special_ids(self, end_of_turn_id: int | None) -> dict[str, int | None]:
        def known(token: int) -> int | None:
            return token if token is not None and token >= 0 else None

        ids = {"bos": known(self.model.token_bos()), "eos": known(self.model.token_eos())}
        if end_of_turn_id is not None:
            ids["end_of_turn"] = end_of_turn_id
        return ids

    def token_text(self, token: int) -> str | None:
        if token is None or token < 0 or token >= self.n_vocab:
            return None
        return self._lib.llama_vocab_get_text(self.model.vocab, token).decode("utf-8", "replace")

    def single_token_id(self, text: str) -> int | None:
        ids = self.model.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return ids[0] if len(ids) == 1 else None

    def close(self) -> None:
        if self.mtp is not None:
            self.mtp.close()  # before the context and the model it hangs on
            self.mtp = None
        self.batch.close()
        self.ctx.close()
        if self.pool is not None and self.owns_pool:
            self.pool.close()  # after the context that used it (a context sharing it is closed first)
        self.model.close()
