"""ExLlamaV3 (1.6.5) backend: exllamav3's `Generator` with a draft model, the model's MTP head or n-gram drafting,
and a quantized KV cache.

What every engine on a library's own generator does (the load's errors, the chat template, one round a call, a
cancel between calls, the stats) is `LibraryGeneratorBackend`'s (engine/backends/library_generator/); this class
says what exllamav3 does differently. How the generator is driven (exllamav3/generator/generator.py and job.py of
the pinned release):

- Loading follows the library's own `model_init.py`: `Config.from_directory` -> `Model.from_config` (the MTP head
  is the same config's `component="mtp"`) -> the `Cache` objects (`CacheLayer_fp16`, or `CacheLayer_quant` with K
  and V bits), built **before** `model.load()`; the draft loads first and the target's load is told about it.
- Hybrid models (Gated DeltaNet beside attention: Qwen3.5/3.6, Qwen3-Next) draft as the others: their caches get
  one state slot and `max_history` = the widest pass, and exllamav3 rewinds rejected drafts itself. Qwen3.5's MTP
  head loads only from the class it is released as (folder.py says which, and why the rest are refused).
- One `iterate()` call is one verification round for our job. The job's `accepted_draft_tokens` /
  `rejected_draft_tokens` counters, read after every call, give the round's counts, turned into Chunks by the
  same `HeldRounds` as exllamav2's (engine/backends/held_rounds.py).
- K: the generator is built once with the largest K (`MAX_DRAFT_TOKENS`, which sizes its draft buffer and the
  speculative headroom the cache keeps), and `generator.num_draft_tokens` is set between replies.
  With a draft model or MTP head, K is floored at 1: at K = 0 exllamav3 skips the draft forward altogether
  (`draft_window > 0` in `iterate()`), so the draft cache gets no keys/values for those positions and drafting
  after a K = 0 stretch would read a stale cache (exllamav2's "the draft still sees every token" does not hold).
- Draft length per reply, one of: a fixed K, our adaptive K (`k_mode = "adaptive"`: the K that measured
  acceptance says pays most, chosen between replies), or the library's dynamic draft length (`k_mode =
  "dynamic"`: exllamav3's confidence calibrator cuts each round's draft, draft model and MTP only). The generator
  is built with `dynamic_draft_tokens=True` so the calibrator exists; a reply that does not use it runs with
  `generator.draft_calibrator` set to None, the one attribute the library reads for it. The reply's `Done.notes`
  says which drafter and which draft length ran.
- `Job(max_new_tokens=n)` stops exactly at n but is silently clamped to what fits the cache
  (`prepare_for_queue`: cache - prompt - 1 - max_draft_tokens); the reply's limit is clamped the same way here so
  the stop reason says "context" where the cache cut it.
- `Job(sampler=None)` is exllamav3's DefaultSampler (not neutral): every reply gets a ComboSampler.
- A failed job comes back as a `"stage": "error"` result (the generator stays usable): one line, never a traceback.
- A new Generator over the same cache disables the old one, so one backend holds one generator and `close()`s it.

What exllamav3 cannot tell us exactly, as for exllamav2 (engine/backends/exllamav2/backend.py): the last round's drafts at a stop
token count as rejected in 1.6.5 (the round's `drafted` includes them); the temperature ramp moves per reply, not
per token (the job's sampler is fixed when it is built: the reply samples at the ramp's first temperature); draft
and target passes are not timed apart, so the cost ratio is not measured (Done.draft_step_s is 0).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.cuda import is_oom
from engine.backends.exllamav3.folder import NEEDS, mtp_refusal, no_mtp_component
from engine.backends.exllamav3.library import PINNED_VERSION, import_exllamav3, short_cause
from engine.backends.exllamav3.models import PAGE_SIZE, ExLlamaV3Vocab, Models
from engine.backends.exllamav3.sampling import build_sampler, cache_kwargs
from engine.backends.library_generator import (
    OOM_HINT,
    JobAsk,
    JobTimes,
    LibraryGeneratorBackend,
    LoadStage,
    Reply,
)
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.drafters import DRAFTERS
from engine.errors import BackendError
from engine.events import Done, StopReason
from engine.request import GenerationRequest

MAX_DRAFT_TOKENS = 16  # the largest K a preset may ask for; the generator is built with it
NGRAM_MATCH_MIN = 2  # exllamav3's n-gram drafter proposes after a match of at least this many tokens
PROBE_INTERVAL_ROUNDS = 256
BATCH = 1  # one reply at a time: the generator's batch and the caches' recurrent state slots
K_FLOOR_NOTE = (
    "K floored at 1 with a draft model: at K 0 exllamav3 skips the draft forward and its cache falls behind"
)


class ExLlamaV3Backend(LibraryGeneratorBackend):
    """The Backend protocol on exllamav3's Generator: what exllamav3 does apart from the shared base."""

    name = "exllamav3"
    folder_needs = NEEDS
    vocab = ExLlamaV3Vocab
    page_size = PAGE_SIZE
    max_draft_tokens = MAX_DRAFT_TOKENS
    probe_interval = PROBE_INTERVAL_ROUNDS

    reply_notes: tuple[str, ...] = ()  # the last reply's Done.notes
    last_job_counters: tuple[int, int] = (0, 0)  # the last reply's job: accepted, rejected drafts

    def _info_notes(self) -> tuple[str, ...]:
        return (f"drafter: {DRAFTERS[self.drafter].label}", *self.notes)

    # --- loading: as the library's own model_init.py ------------------------------------------------

    def _check_folders(self) -> None:
        super()._check_folders()
        refusal = mtp_refusal(self.model_dir) if self.drafter == "mtp" else None
        if refusal:  # no MTP layer in config.json, or none in the weights: said before importing exllamav3
            raise BackendError(refusal)

    def _import_library(self, report: ProgressCallback) -> SimpleNamespace:
        ex = import_exllamav3(report)
        if ex.version != PINNED_VERSION:
            self.notes.append(
                f"exllamav3 {ex.version} installed; specchat is checked against {PINNED_VERSION}"
            )
        return ex

    def _build(self, ex: SimpleNamespace, report: ProgressCallback, stage: LoadStage) -> Models:
        """Config -> models -> caches (before any load) -> draft, then target weights -> generator."""
        config = self._read_config(ex, self.model_dir, "model")
        cache_len = self._fit_context(int(getattr(config, "max_position_embeddings", 0) or 0))
        k_max = MAX_DRAFT_TOKENS if self.drafter != "none" else 0
        stage.what = f"model {self.model_dir.name}"
        model = ex.Model.from_config(config)
        tokenizer = ex.Tokenizer.from_config(config)
        draft_model = self._draft_model(ex, stage, config, tokenizer)
        cache, draft_cache = self._caches(ex, stage, model, draft_model, cache_len, k_max)
        self._load_weights(report, stage, model, draft_model)
        generator = self._generator(ex, stage, model, cache, tokenizer, draft_model, draft_cache, k_max)
        calibrator = getattr(generator, "draft_calibrator", None)
        generator.draft_calibrator = None  # lent per reply (k_mode "dynamic")
        return Models(
            **self._shared_fields(model, cache, tokenizer, generator, (draft_model, draft_cache), cache_len),
            calibrator=calibrator,
        )

    def _draft_model(self, ex: SimpleNamespace, stage: LoadStage, config: Any, tokenizer: Any) -> Any | None:
        """The MTP head (the same config's "mtp" component) or the draft model, not loaded yet; None without."""
        if self.drafter == "mtp":
            stage.what = "MTP head"
            # An architecture with no "mtp" component (model/model.py:186-187; Qwen3.5's text-only
            # classes, architecture/qwen3_5.py:150-164) is refused here in one line, naming it.
            if "mtp" not in getattr(config, "model_classes", {}):
                arch = getattr(config, "architecture", type(config).__name__)
                raise BackendError(no_mtp_component(ex.version, arch, self.model_dir))
            return ex.Model.from_config(config, component="mtp")
        if self.draft_dir is None:
            return None
        stage.what = f"draft model {self.draft_dir.name}"
        draft_config = self._read_config(ex, self.draft_dir, "draft model")
        self._check_draft_vocab(tokenizer, ex.Tokenizer.from_config(draft_config))
        return ex.Model.from_config(draft_config)

    def _caches(
        self,
        ex: SimpleNamespace,
        stage: LoadStage,
        model: Any,
        draft_model: Any | None,
        cache_len: int,
        k_max: int,
    ) -> tuple[Any, Any | None]:
        """Caches before load(): exllamav3 allocates their tensors as the model loads. Same size for both.

        On a model with recurrent layers (Gated DeltaNet: Qwen3.5, Qwen3-Next) the generator refuses a cache whose
        max_history is below its widest pass (generator.py:378-384; max_history sizes the rewind of a rejected
        draft, cache/cache.py:124-128), and every state slot (max_batch_size, cache.py:121-122, 171-184) holds two
        full recurrent states in VRAM (modules/gated_delta_net.py:287-288): one reply at a time needs one (the
        generator's batch is clamped to the slots, generator.py:404-408)."""
        stage.what = "cache"
        layers = (ex.CacheLayer_fp16, ex.CacheLayer_quant)
        cache = ex.Cache(
            model,
            max_num_tokens=cache_len,
            max_batch_size=BATCH,
            max_history=k_max,
            **cache_kwargs(self.cache_mode, *layers),
        )
        if draft_model is None:
            return cache, None
        draft_cache = ex.Cache(
            draft_model,
            max_num_tokens=cache_len,
            max_batch_size=BATCH,
            max_history=k_max,
            **cache_kwargs(self.draft_cache_mode, *layers),
        )
        return cache, draft_cache

    def _load_weights(
        self, report: ProgressCallback, stage: LoadStage, model: Any, draft_model: Any | None
    ) -> None:
        """The draft first, then the target, told about it."""
        if draft_model is not None:
            label = DRAFTERS[self.drafter].label
            stage.what = "draft model" if self.drafter == "model" else "MTP head"
            report(f"loading {label}", 0.0)
            draft_model.load(
                use_per_device=self.gpu_split,
                progressbar=False,
                callback=lambda a, b: report(f"loading {label}", a / max(b, 1)),
            )
        stage.what = f"model {self.model_dir.name}"
        report(f"loading {self.model_dir.name}", 0.0)
        model.load(
            use_per_device=self.gpu_split,
            progressbar=False,
            callback=lambda a, b: report(f"loading {self.model_dir.name}", a / max(b, 1)),
            draft_model=draft_model,
        )

    def _generator(
        self,
        ex: SimpleNamespace,
        stage: LoadStage,
        model: Any,
        cache: Any,
        tokenizer: Any,
        draft_model: Any | None,
        draft_cache: Any | None,
        k_max: int,
    ) -> Any:
        """The one Generator over the caches, built with the largest K and the dynamic-draft calibrator; what it
        prints (an MTP head's depth) goes into notes, not the TUI."""
        stage.what = "generator"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            generator = ex.Generator(
                model=model,
                cache=cache,
                tokenizer=tokenizer,
                max_batch_size=BATCH,
                draft_model=draft_model,
                draft_cache=draft_cache,
                num_draft_tokens=k_max if self.drafter != "none" else None,
                ngram_match_min=NGRAM_MATCH_MIN if self.drafter == "ngram" else 0,
                dynamic_draft_tokens=self.uses_draft_model,
                record_draft_stats=True,
            )
        self.notes += [
            f"exllamav3: {line.strip(' !-')}" for line in printed.getvalue().splitlines() if line.strip()
        ]
        if generator.target_recurrent:  # the model's caps say "recurrent_states" (generator.py:376)
            self.notes.append(
                f"recurrent layers: exllamav3 rewinds rejected drafts (passes up to {cache.max_history} drafts) "
                f"and checkpoints the state every {generator.recurrent_checkpoint_interval} tokens"
            )  # generator.py:411-419: the interval the model's caps give
        return generator

    def _loaded_models(self, m: Models) -> None:
        self.set_num_draft_tokens(self.num_draft_tokens)

    # --- the reply ----------------------------------------------------------------------------------

    def _start_reply(self, request: GenerationRequest, m: Models) -> Reply:
        reply = super()._start_reply(request, m)
        self.reply_notes = tuple(reply.notes)
        return reply

    def _choose_k(
        self, request: GenerationRequest, m: Models, tuner: AdaptiveK, notes: list[str]
    ) -> tuple[int, bool]:
        """A fixed K, adaptive K, or the library's dynamic draft length (its calibrator lent for the reply)."""
        k = request.effective_k
        length_by = "fixed K"
        dynamic = request.k_mode == "dynamic" and self.uses_draft_model and m.calibrator is not None and k > 0
        if request.k_mode == "adaptive" and self.drafter != "none" and k > 0:
            k = self.adaptive_k(tuner, k)
            length_by = "adaptive K"
        elif dynamic:
            length_by = "the library's dynamic draft length"
        elif request.k_mode == "dynamic" and self.drafter == "ngram":
            notes.append(
                "dynamic draft length applies to draft models and MTP; n-gram drafts by match length"
            )
        asked = k
        k = self.set_num_draft_tokens(k)
        if self.uses_draft_model and asked < 1 <= k:
            notes.append(K_FLOOR_NOTE)
        m.generator.draft_calibrator = m.calibrator if dynamic else None
        if self.drafter != "none":
            notes.insert(0, f"drafter: {DRAFTERS[self.drafter].label}, K {k} by {length_by}")
        return k, request.k_mode == "adaptive"

    def _room(self, m: Models, prompt_len: int, k: int) -> int:
        # exllamav3 clamps max_new_tokens to this room silently (job.py:1287-1292, prepare_for_queue): the
        # reply's limit is clamped the same way here, so the stop reason can say "context".
        return m.cache_len - prompt_len - 1 - int(m.generator.max_draft_tokens)

    def _new_job(self, ex: SimpleNamespace, request: GenerationRequest, ask: JobAsk) -> Any:
        import torch

        sampler, temperature = request.sampler, ask.temperature
        if sampler.ramp_tokens > 0 and temperature != sampler.temperature:
            # The job's sampler is fixed when it is built (job.py:560).
            ask.notes.append(
                f"temperature ramp not applied: exllamav3's sampler is fixed per reply, sampled at {temperature:g}"
            )
        return ex.Job(
            input_ids=torch.tensor([request.prompt_ids], dtype=torch.long),
            max_new_tokens=ask.wanted,
            sampler=build_sampler(ex.ComboSampler, sampler, temperature),
            seed=request.seed,
            stop_conditions=ask.stop_ids,
            decode_special_tokens=False,
        )

    def _generation_error(self, exc: Exception) -> Exception:
        return BackendError(f"exllamav3 failed while generating: {short_cause(exc)}")

    def _raise_if_failed(self, reply: Reply, ours: list[dict[str, Any]]) -> None:
        """A failed job comes back as a "stage": "error" result (generator.py:2135-2161), the generator usable."""
        failed = next((r for r in ours if r.get("stage") == "error"), None)
        if failed is None:
            return
        reply.finished = True  # the generator already dropped the job (reap_failed_job)
        error = failed.get("error")
        if isinstance(error, BaseException) and is_oom(error):
            raise BackendError(f"out of memory while generating: {OOM_HINT}")
        cause = short_cause(error) if isinstance(error, BaseException) else str(error)
        raise BackendError(f"exllamav3 failed the reply: {cause}")

    def _stop_reason(self, end: dict[str, Any], reply: Reply) -> StopReason:
        if end.get("eos_reason") == "loop_detected":  # job.py:1188
            reply.notes.append("exllamav3's loop detector stopped the reply")
            return "repetition"
        return super()._stop_reason(end, reply)

    def _finish(self, reply: Reply, times: JobTimes, reason: StopReason) -> Done:
        job = reply.job
        self.reply_notes = tuple(reply.notes)
        self.last_job_counters = (int(job.accepted_draft_tokens), int(job.rejected_draft_tokens))
        return Done(
            stop_reason=reason,
            prompt_tokens=times.prompt_tokens,
            cached_tokens=times.cached_tokens,
            prefill_s=times.prefill_s,
            notes=tuple(reply.notes),
        )

    def _close_generator(self, generator: Any) -> None:
        close = getattr(generator, "close", None)
        if close is not None:
            # Releases the generator's pinned buffers and pools (generator.py:839); the cache then has no owner.
            close()

    # --- K between replies --------------------------------------------------------------------------

    def set_num_draft_tokens(self, k: int) -> int:
        """Make the next reply draft `k` tokens per round, keeping generator and caches. Returns the K used:
        0..MAX_DRAFT_TOKENS (the generator's max_draft_tokens), 0 without a drafter, at least 1 with a draft
        model or MTP head."""
        generator = self._idle_generator()
        if self.drafter == "none":
            k = 0
        else:
            k = min(self._clamp_k(k), int(generator.max_draft_tokens))
            if self.uses_draft_model:
                k = max(k, 1)
        generator.num_draft_tokens = k  # read every round (generator.py:794)
        self.num_draft_tokens = k
        return k

    # --- internals ----------------------------------------------------------------------------------

    @staticmethod
    def _read_config(ex: SimpleNamespace, folder: Path, what: str) -> Any:
        try:
            return ex.Config.from_directory(str(folder))
        except (AssertionError, ValueError, KeyError, TypeError, OSError) as exc:
            cause = str(exc).strip() or type(exc).__name__
            raise BackendError(f"exllamav3 cannot load the {what} in {folder}: {cause}") from exc


def build(args: EngineArgs) -> ExLlamaV3Backend:
    """The registry's constructor: an EXL3 or FP16 folder (the embedded model's where `args.model` is None)."""
    return ExLlamaV3Backend.from_args(args)
