"""The model's own MTP head on llama.cpp: a second context (`LLAMA_CONTEXT_TYPE_MTP`) on the target's model, as
llama.cpp's own `draft-mtp` drives it (vendored common/speculative.cpp, `common_speculative_impl_draft_mtp`, from
line 1331; the context is made as `common_speculative_init_result` does, line 2525).

An MTP layer (Qwen3.5's one `mtp.*` block, DeepSeek's nextn) predicts the token after next from two things: the
next token's embedding and the target's hidden state at the current position. So:

- after every target decode (prefill slices, plain steps, verify passes) the head takes the same tokens into its
  own small cache, each paired with the target's hidden row of the position before it (`follow`, called by the
  target's `LlamaCppModel._decode`; `process()` in speculative.cpp, line 1470). Unlike llama-server, lazily: the
  rows are kept and the tokens decoded in one batch before the next draft step, so rounds that do not draft (adaptive
  K found it does not pay) cost nothing (eager, it cost 6 ms of a 46 ms step on a Qwen3.5-0.8B-shaped model);
- a draft then steps the head one row at a time: the round's last token with the target's hidden row of the last
  cached position, then each drafted token with the head's own hidden row of the step before (`next_logits`;
  `draft()`, line 1593);
- a crop drops the head's rows past the kept length, as the target's (its cache is attention only).

In 0.3.36 `llama_batch_ext_set_embd_state` is a stub that returns false: the row rides on the token with
`llama_batch_ext_set_embd_token` and goes in with `llama_process`. The hidden rows come from the staging API in
src/llama-ext.h (`llama_set_embeddings_nextn`, `llama_get_embeddings_nextn[_ith]`), which libllama exports with C++
names only: they are looked up by their mangled names.

The head is a `CachedModel` for the round loop (ids, crop, prefill, next_logits), so the draft-model drafter's
greedy steps drive it unchanged (engine/decoding/drafters/mtp.py).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from engine.decoding.drafters import common_prefix
from engine.errors import BackendError

# libllama's C++ staging API (src/llama-ext.h lines 93-108), by mangled name.
_SET_EMBEDDINGS_NEXTN = "_Z26llama_set_embeddings_nextnP13llama_contextbb"
_GET_EMBEDDINGS_NEXTN = "_Z26llama_get_embeddings_nextnP13llama_context"
_GET_EMBEDDINGS_NEXTN_ITH = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"
# Hidden rows kept per position (the target's, then the head's own for drafted positions): enough for the widest
# pass and its drafts, and every row the head's cache has yet to take.
KEPT_ROWS = 256
# Tokens the head holds before its cache takes them in one batch, even with no draft asked for.
CATCH_UP_AT = 512


class NextnApi:
    """The three staging calls, bound from the loaded libllama."""

    def __init__(self, raw) -> None:
        lib = raw._lib
        try:
            self.set_embeddings = getattr(lib, _SET_EMBEDDINGS_NEXTN)
            self.get_embeddings = getattr(lib, _GET_EMBEDDINGS_NEXTN)
            self.get_embeddings_ith = getattr(lib, _GET_EMBEDDINGS_NEXTN_ITH)
        except AttributeError as exc:
            raise BackendError(
                "--draft mtp: this llama.cpp build does not export the MTP hidden-state calls "
                "(llama_get_embeddings_nextn)"
            ) from exc
        self.set_embeddings.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
        self.set_embeddings.restype = None
        self.get_embeddings.argtypes = [ctypes.c_void_p]
        self.get_embeddings.restype = ctypes.POINTER(ctypes.c_float)
        self.get_embeddings_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        self.get_embeddings_ith.restype = ctypes.POINTER(ctypes.c_float)


def mtp_layers(lib, model) -> int:
    """The MTP (nextn) layers a loaded model carries (0: none)."""
    return int(lib.llama_model_n_layer_nextn(model.model))


class MtpHead:
    """The MTP context beside a target LlamaCppModel (loaded with `load_mtp`), following its decodes."""

    costs = None
    can_crop = True

    def __init__(self, lib, target, threads: int) -> None:
        from llama_cpp import _internals
        from llama_cpp import llama_cpp as raw

        self._lib = lib
        self.api = NextnApi(raw)
        params = lib.llama_context_default_params()
        params.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        params.n_ctx = target.ctx.n_ctx()
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.n_rs_seq = 0
        params.ctx_other = target.ctx.ctx
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        try:
            self.ctx = _internals.LlamaContext(model=target.model, params=params, verbose=False)
        except (ValueError, OSError) as exc:
            raise BackendError(f"--draft mtp: llama.cpp could not create the MTP context ({exc})") from exc
        if target.pool is not None:
            target.pool.attach_to(raw, self.ctx.ctx)  # the target's workers, not a second set (pool.py)
        self.n_embd = int(lib.llama_model_n_embd(target.model.model))
        self.n_vocab = target.n_vocab
        self.batch = lib.llama_batch_ext_init(self.ctx.ctx)
        # The target hands over every row of its passes; the head marks only its own output row.
        self.api.set_embeddings(target.ctx.ctx, True, False)
        self.api.set_embeddings(self.ctx.ctx, True, True)
        self.ids: list[int] = []  # the tokens the head holds, from position 0 (its cache: the first `done`)
        self.done = 0
        self.hidden: dict[
            int, np.ndarray
        ] = {}  # position -> the hidden row paired with the next position's token
        self.step_times: list[float] = []
        self.target = target

    # --- following the target ------------------------------------------------------------------------------

    def follow(self, tokens: Sequence[int], base: int) -> None:
        """The target just decoded `tokens` at positions base..: keep its hidden rows (they outrank the head's own)
        and hold the tokens for the head's cache. They are decoded there lazily, in one batch, before the next
        draft step (or once CATCH_UP_AT are waiting): while adaptive K keeps drafting off, the head costs nothing."""
        n = len(tokens)
        pointer = self.api.get_embeddings(self.target.ctx.ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(n, self.n_embd)).copy() if pointer else None
        self.crop(base)
        if rows is not None:
            for i in range(n):
                self.hidden[base + i] = rows[i]
        self.ids.extend(tokens)
        if len(self.ids) - self.done >= CATCH_UP_AT:
            self.catch_up()
        self._forget_old()

    def catch_up(self, cancel: threading.Event | None = None) -> None:
        """Decode the tokens the head holds but its cache does not, each with the target's row before it (in the
        target's batch slices; a set `cancel` stops between slices, the rest taken at the next catch-up)."""
        while self.done < len(self.ids) and not (cancel is not None and cancel.is_set()):
            chunk = self.ids[self.done : self.done + self.target.n_batch]
            self._process(chunk, self.done, output=False)
            self.done += len(chunk)

    def skip_behind(self, keep: int) -> None:
        """Before a probe (no K pays: engine/decoding/drafters/mtp.py): where the head's cache lags more than
        `keep` tokens behind, it takes only the last `keep` at the next catch-up. Its cache is emptied and starts
        again at that position (a memory that holds nothing takes any start: src/llama-batch.cpp, the positions
        check from line 321), so a probe after a long prompt feeds the head `keep` tokens, not the whole prompt
        (600 tokens of its layer were ~4% of a 64-token reply). The head then attends to the positions it took from
        there on; the hidden rows it is fed still carry the whole context."""
        if len(self.ids) - self.done <= keep:
            return
        self.ctx.kv_cache_clear()
        self.done = len(self.ids) - keep

    def _forget_old(self) -> None:
        """Drop the rows no catch-up or step will pair again: in sweeps, once the rows kept are twice what may be
        needed (not a sweep a token)."""
        if len(self.hidden) <= 2 * (KEPT_ROWS + CATCH_UP_AT):
            return
        keep_from = min(self.done - 1, len(self.ids) - KEPT_ROWS)
        for position in [p for p in self.hidden if p < keep_from]:
            del self.hidden[position]

    def _process(self, tokens: Sequence[int], base: int, output: bool):
        lib = self._lib
        batch = self.batch
        lib.llama_batch_ext_clear(batch)
        zeros = np.zeros(self.n_embd, dtype=np.float32)
        # each row's data must live until llama_process has read it
        paired = np.stack([self.hidden.get(base + i - 1, zeros) for i in range(len(tokens))]).astype(
            np.float32
        )
        paired = np.ascontiguousarray(paired)
        data = paired.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        for i, token in enumerate(tokens):
            idx = lib.llama_batch_ext_add_token(batch, 0, int(token))
            position = lib.llama_pos(base + i)
            lib.llama_batch_ext_set_pos(batch, idx, ctypes.byref(position))
            row = ctypes.cast(
                ctypes.addressof(data.contents) + i * self.n_embd * 4, ctypes.POINTER(ctypes.c_float)
            )
            lib.llama_batch_ext_set_embd_token(batch, idx, lib.llama_embd(row, 1, self.n_embd))
            if output and i == len(tokens) - 1:
                lib.llama_batch_ext_set_output_logits(batch, idx, True)
        code = lib.llama_process(self.ctx.ctx, lib.LLAMA_PROCESS_TYPE_DECODE, batch)
        if code != 0:
            self.clear()
            raise BackendError(f"llama.cpp's MTP head failed to decode (code {code})")
        if not output:
            return None
        logits = np.ctypeslib.as_array(lib.llama_get_logits(self.ctx.ctx), shape=(1, self.n_vocab)).copy()
        own = self.api.get_embeddings_ith(self.ctx.ctx, len(tokens) - 1)
        if own:
            self.hidden[base + len(tokens) - 1] = np.ctypeslib.as_array(own, shape=(self.n_embd,)).copy()
        return logits

    # --- a CachedModel for the draft steps ------------------------------------------------------------------

    def clear(self) -> None:
        self.ctx.kv_cache_clear()
        self.ids = []
        self.done = 0
        self.hidden.clear()

    def crop(self, length: int) -> None:
        if length < self.done:
            if self.ctx.kv_cache_seq_rm(0, length, -1):
                self.done = length
            else:
                self.ctx.kv_cache_clear()  # decoded again from the kept rows at the next catch-up
                self.done = 0
        if length >= len(self.ids):
            return  # nothing past it (every row kept is of a position the head holds)
        del self.ids[length:]
        for position in [p for p in self.hidden if p >= length]:
            del self.hidden[position]

    def prefill(self, ids: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Nothing to decode: the head follows the target's own prefill. The prefix it shares with `ids`."""
        shared = common_prefix(self.ids, ids)
        self.crop(shared)
        return shared

    def next_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """A draft step: `tokens` (the round's last token, then each draft) on the head's cache; the logits of
        the last, timed."""
        self.catch_up()
        start = time.perf_counter()
        logits = self._process(list(tokens), len(self.ids), output=True)
        self.ids.extend(tokens)
        self.done = len(self.ids)
        self.step_times.append(time.perf_counter() - start)
        return torch.from_numpy(logits[-1])

    def close(self) -> None:
        """Free the context (once: the backend and the target both hold the head)."""
        if self.batch is not None:
            self._lib.llama_batch_ext_free(self.batch)
            self.batch = None
            self.ctx.close()
