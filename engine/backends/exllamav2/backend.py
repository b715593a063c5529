"""ExLlamaV2 (0.3.2) backend: the dynamic generator with a draft model or n-gram drafting and a quantized KV cache.

`import exllamav2` compiles a CUDA extension and fails without CUDA, so the package is imported lazily, only
inside this module's functions, and every failure becomes a one-line `BackendError`. The first import's build
is announced and followed file by file through the load's progress callback (library.py, extension_build.py).

What every engine on a library's own generator does (the load's steps and errors, the chat template, one round a
call, a cancel between calls, the stats) is `LibraryGeneratorBackend`'s (engine/backends/library_generator/); this
class says what exllamav2 does differently. How the generator is driven (see DESIGN.md "ExLlamaV2 facts"):

- one `iterate()` call is one verification round for our job: the drafter proposes K tokens, the target scores
  them in one forward pass and the job accepts a prefix. The job's `accepted_draft_tokens` /
  `rejected_draft_tokens` counters are read after every call; their changes give the round's counts.
- K changes between replies by resizing `generator.draft_ids_pinned` and setting `generator.num_draft_tokens`
  while no job is queued, so the generator, its caches and the prefix cache survive.
- a job stops at `max_new_tokens - num_draft_tokens`, so the job asks for K more and the reply is cut to the
  requested count here.

What exllamav2 cannot tell us exactly, and what the MessageStats built from our Chunks then mean:

| MessageStats field | exactness with exllamav2 | why |
|---|---|---|
| drafted_tokens (Chunk.drafted) | exact except the last round | a round that ends on a stop token or the token limit stops verifying there; the drafts after that point are neither accepted nor rejected, so they are not counted |
| accepted_tokens, acceptance_histogram, per_position_acceptance | exact | Δaccepted per `iterate()`; the generator accepts a prefix, so "first a positions" is exact |
| origins (per token) | exact | of the n tokens a round samples the first Δaccepted are the draft's; tokens the generator holds back (an incomplete UTF-8 character, a possible stop string) stay with their round, whose Chunk waits until they are released (`HeldRounds`); a reply cancelled while tokens are held loses those tokens and their round |
| cost_ratio, predicted_speedup | estimated | exllamav2 does not time draft and target passes separately; the ratio c comes from a timed warm-up forward of each model at load (1 token through the draft, K+1 through the target), and `draft_step_s` / `target_step_s` are that ratio scaled to the reply's measured time per round |
| prefill_tokens_per_s, ttft | exact | `time_prefill` and `cached_tokens` from the end result |
| temperature ramp | per round, not per token | the job reads `gen_settings` once per sampled token but it can only be changed between `iterate()` calls, so all tokens of one round share the temperature of the round's first token |
| stop_reason "eos" vs "end_of_turn" | exact | by `eos_triggering_token_id`; where EOS and end-of-turn are the same token (SmolLM2's `<|im_end|>`) it reads "eos" |
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.cuda import is_oom
from engine.backends.exllamav2.library import import_exllamav2
from engine.backends.exllamav2.models import (
    FOLDER_NEEDS,
    PAGE_SIZE,
    ExLlamaV2Vocab,
    Models,
    fix_rope_theta,
    ntk_alpha,
)
from engine.backends.exllamav2.sampling import build_sampler_settings
from engine.backends.library_generator import JobAsk, JobTimes, LibraryGeneratorBackend, LoadStage, Reply
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.errors import BackendError
from engine.events import Done, StopReason
from engine.request import GenerationRequest, SamplerSettings

MAX_DRAFT_TOKENS = 16  # the largest K; the generator's max_q_size is K_max + 1 (K drafts + the last token)
# Adaptive K changes K between replies only, so a probe is a whole reply: rounds at K 0 before the next one.
PROBE_INTERVAL_ROUNDS = 256


class ExLlamaV2Backend(LibraryGeneratorBackend):
    """The Backend protocol on exllamav2's dynamic generator: what exllamav2 does apart from the shared base.

    Line numbers are exllamav2 0.3.2's exllamav2/generator/dynamic.py."""

    name = "exllamav2"
    folder_needs = FOLDER_NEEDS
    vocab = ExLlamaV2Vocab
    page_size = PAGE_SIZE
    max_draft_tokens = MAX_DRAFT_TOKENS
    probe_interval = PROBE_INTERVAL_ROUNDS

    def __init__(
        self, model_dir: str | Path, *args: Any, draft_load_in_q4: bool = False, **kwargs: Any
    ) -> None:
        """The base's arguments, and whether a draft model loads its weights in Q4 (the config's load_in_q4)."""
        super().__init__(model_dir, *args, **kwargs)
        self.draft_load_in_q4 = draft_load_in_q4

    # --- loading ------------------------------------------------------------------------------------

    def _import_library(self, report: ProgressCallback) -> SimpleNamespace:
        return import_exllamav2(report)

    def _build(self, ex: SimpleNamespace, report: ProgressCallback, stage: LoadStage) -> Models:
        """Config, draft, target, generator, then a timed warm-up: the verify cost adaptive K weighs."""
        config = self._read_config(ex, self.model_dir, "model")
        cache_len = self._fit_context(config.max_seq_len)
        config.max_seq_len = cache_len
        tokenizer = ex.Tokenizer(config)
        draft_model = draft_cache = draft_config = None
        if self.draft_dir is not None:
            draft_model, draft_cache, draft_config = self._load_draft(ex, report, stage, tokenizer, cache_len)
        model, cache = self._load_target(ex, report, stage, config, cache_len)
        paged = self._paged(ex, config, draft_config)
        stage.what = "generator"
        generator = ex.Generator(
            model=model,
            cache=cache,
            tokenizer=tokenizer,
            max_batch_size=1,
            max_q_size=MAX_DRAFT_TOKENS + 1,
            draft_model=draft_model,
            draft_cache=draft_cache,
            num_draft_tokens=self.num_draft_tokens if self.draft_mode != "none" else 0,
            use_ngram_draft=self.draft_mode == "ngram",
            paged=paged,
        )
        stage.what = "warm-up"
        report("warming up", None)
        draft_s, target_s, target_one_s = self._time_forwards(model, draft_model)
        width = max(self.num_draft_tokens, 1) + 1
        return Models(
            **self._shared_fields(model, cache, tokenizer, generator, (draft_model, draft_cache), cache_len),
            paged=paged,
            draft_forward_s=draft_s,
            target_forward_s=target_s,
            costs=self._cost_model(target_one_s, width, target_s, draft_s),
        )

    def _load_draft(
        self, ex: SimpleNamespace, report: ProgressCallback, stage: LoadStage, tokenizer: Any, cache_len: int
    ) -> tuple[Any, Any, Any]:
        """The draft model and its cache, stretched to the target's context where it was trained for less."""
        assert self.draft_dir is not None
        stage.what = f"draft model {self.draft_dir.name}"
        draft_config = self._read_config(ex, self.draft_dir, "draft model")
        self._check_draft_vocab(tokenizer, ex.Tokenizer(draft_config))
        if draft_config.max_seq_len < cache_len:
            alpha = ntk_alpha(draft_config.max_seq_len, cache_len)
            draft_config.scale_alpha_value = alpha
            self.notes.append(
                f"draft context stretched {draft_config.max_seq_len} -> {cache_len} (NTK alpha {alpha:.2f})"
            )
        draft_config.max_seq_len = cache_len
        if self.draft_load_in_q4 and hasattr(draft_config, "load_in_q4"):
            draft_config.load_in_q4 = True
        # The draft loads first: it is small, and autosplit then gives the target what is left.
        report(f"loading draft {self.draft_dir.name}", 0.0)
        draft_model = ex.Model(draft_config)
        draft_cache = ex.caches[self.draft_cache_mode](draft_model, max_seq_len=cache_len, lazy=True)
        draft_model.load_autosplit(draft_cache, callback=lambda a, b: report("loading draft", a / max(b, 1)))
        return draft_model, draft_cache, draft_config

    def _load_target(
        self, ex: SimpleNamespace, report: ProgressCallback, stage: LoadStage, config: Any, cache_len: int
    ) -> tuple[Any, Any]:
        """The model and its cache: on the asked GPU split, or autosplit over what the draft left."""
        stage.what = f"model {self.model_dir.name}"
        report(f"loading {self.model_dir.name}", 0.0)
        model = ex.Model(config)

        def model_progress(done: int, total: int) -> None:
            report(f"loading {self.model_dir.name}", done / max(total, 1))

        if self.gpu_split:
            model.load(gpu_split=self.gpu_split, callback=model_progress)
            cache = ex.caches[self.cache_mode](model, max_seq_len=cache_len, lazy=False)
        else:
            cache = ex.caches[self.cache_mode](model, max_seq_len=cache_len, lazy=True)
            model.load_autosplit(cache, callback=model_progress)
        return model, cache

    def _paged(self, ex: SimpleNamespace, config: Any, draft_config: Any | None) -> bool:
        """Paged attention needs flash-attn >= 2.5.7; without it the generator runs unpaged (batch size 1, which
        is all a chat needs) and still reuses the prefix of the previous reply."""
        paged = bool(getattr(ex.attn, "has_flash_attn_with_paged", False)) and not config.no_flash_attn
        if draft_config is not None and draft_config.no_flash_attn:
            paged = False
        if not paged:
            self.notes.append("flash-attn not available: unpaged generator (one reply at a time)")
        return paged

    # --- the reply ----------------------------------------------------------------------------------

    def _choose_k(
        self, request: GenerationRequest, m: Models, tuner: AdaptiveK, notes: list[str]
    ) -> tuple[int, bool]:
        adaptive = request.k_mode == "adaptive" and self.draft_mode != "none"
        k = request.effective_k
        if adaptive and k > 0:
            k = self.adaptive_k(tuner, k, m.costs)
        return self.set_num_draft_tokens(k), adaptive

    def _room(self, m: Models, prompt_len: int, k: int) -> int:
        # A job stops at max_new_tokens - num_draft_tokens (2127): it asks for K more, which the cache must hold.
        return m.cache_len - prompt_len - k

    def _new_job(self, ex: SimpleNamespace, request: GenerationRequest, ask: JobAsk) -> Any:
        import torch

        return ex.Job(
            input_ids=torch.tensor([request.prompt_ids], dtype=torch.long),
            max_new_tokens=ask.wanted + ask.k,  # the reply is cut to `wanted` as its rounds are counted
            gen_settings=build_sampler_settings(ex.Settings, request.sampler, ask.temperature),
            seed=request.seed,
            stop_conditions=ask.stop_ids,
            decode_special_tokens=False,
        )

    def _next_temperature(
        self, job: Any, sampler: SamplerSettings, streaming: list[dict[str, Any]], temperature: float
    ) -> float:
        """The job reads its gen_settings for every token it samples (1890); between iterate() calls is the only
        place to change them, so the ramp moves once per round."""
        if sampler.ramp_tokens > 0 and streaming:
            temperature = sampler.temperature_at(job.new_tokens)
            job.gen_settings.temperature = temperature
        return temperature

    def _page_of(self, m: Models) -> int:
        return m.generator.page_size  # 384: the whole cache is one page where the generator is unpaged

    def _finish(self, reply: Reply, times: JobTimes, reason: StopReason) -> Done:
        """Keep the warm-up's draft/target ratio c, scaled so K draft steps + 1 verification = one real round."""
        m, k, rounds = reply.m, reply.k, reply.rounds.rounds
        draft_step_s = target_step_s = 0.0
        if m.target_forward_s > 0:
            c = m.draft_forward_s / m.target_forward_s if (m.draft_model is not None and k > 0) else 0.0
            target_step_s = m.target_forward_s
            if rounds > 0 and times.generate_s > 0:
                target_step_s = times.generate_s / rounds / (c * k + 1.0)
            draft_step_s = c * target_step_s
        return Done(
            stop_reason=reason,
            prompt_tokens=times.prompt_tokens,
            cached_tokens=times.cached_tokens,
            prefill_s=times.prefill_s,
            draft_step_s=draft_step_s,
            target_step_s=target_step_s,
        )

    def _close_generator(self, generator: Any) -> None:
        for pool_name in ("sampling_pool", "filter_pool"):  # 453-461
            pool = getattr(generator, pool_name, None)
            if pool is not None:
                pool.shutdown(wait=False)

    # --- K between replies --------------------------------------------------------------------------

    def set_num_draft_tokens(self, k: int) -> int:
        """Make the next reply draft `k` tokens per round (0: no drafting), keeping generator and caches.

        Returns the K actually used: clamped to 0..MAX_DRAFT_TOKENS, and 0 where this backend has no drafter.
        """
        import torch

        m = self._loaded()
        generator = self._idle_generator()
        k = self._clamp_k(k) if self.draft_mode != "none" else 0
        if m.draft_model is not None:
            # The draft model still sees every token at K = 0 (one cheap forward per step) so its cache stays in
            # step with the page table it shares with the target; drafting can come back on without a rebuild.
            # Its buffer is sized by num_draft_tokens at construction (430) and filled per round (1119).
            buffer = generator.draft_ids_pinned
            if buffer.shape[1] != k:
                generator.draft_ids_pinned = torch.empty(
                    (generator.max_batch_size, k), dtype=torch.long, pin_memory=buffer.is_pinned()
                )
        elif self.draft_mode == "ngram":
            generator.use_ngram_draft = k > 0  # read each round (995)
        generator.num_draft_tokens = k
        self.num_draft_tokens = k
        return k

    @staticmethod
    def _cost_model(one_s: float, width: int, verify_s: float, draft_s: float) -> VerifyCostModel | None:
        """Verify cost by width from the warm-up (one token, `width` tokens) and the draft step; None where
        the warm-up timed nothing."""
        if one_s <= 0:
            return None
        samples = {1: one_s}
        if verify_s > 0:
            samples[width] = verify_s
        costs = VerifyCostModel.from_samples(samples)
        if draft_s > 0:
            costs.observe_draft(draft_s)
        return costs

    # --- internals ----------------------------------------------------------------------------------

    def _k_cap_note(self, k: int) -> str:
        return (
            f"K is at most {MAX_DRAFT_TOKENS} with exllamav2 (max_q_size {MAX_DRAFT_TOKENS + 1}); asked {k}"
        )

    @staticmethod
    def _read_config(ex: SimpleNamespace, folder: Path, what: str) -> Any:
        try:
            config = ex.Config(str(folder))
            config.arch_compat_overrides(quiet=True)
        except (AssertionError, ValueError, KeyError, TypeError, OSError) as exc:
            cause = str(exc).strip().lstrip("# ").strip() or type(exc).__name__
            raise BackendError(f"exllamav2 cannot load the {what} in {folder}: {cause}") from exc
        fix_rope_theta(config, folder)
        return config

    def _time_forwards(self, model: Any, draft_model: Any | None) -> tuple[float, float, float]:
        """Median wall time of one draft step (1 token), one target verification (K_max + 1 tokens) and one
        plain target step (1 token).

        Ratios are used (the cost ratio c, the verify cost curve); failures leave 0.0, "not measured".
        """
        import torch

        def timed(m: Any, length: int) -> float:
            ids = torch.zeros((1, length), dtype=torch.long)
            m.forward(ids, last_id_only=False)  # first call: kernel autotune, allocations
            times = []
            for _ in range(5):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                start = time.perf_counter()
                m.forward(ids, last_id_only=False)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        try:
            target_s = timed(model, max(self.num_draft_tokens, 1) + 1)
            target_one_s = timed(model, 1)
            draft_s = timed(draft_model, 1) if draft_model is not None else 0.0
        except Exception as exc:  # timing is advisory; never fail a load over it
            if is_oom(exc):
                raise
            self.notes.append(f"draft/target timing unavailable ({type(exc).__name__})")
            return 0.0, 0.0, 0.0
        return draft_s, target_s, target_one_s


def build(args: EngineArgs) -> ExLlamaV2Backend:
    """The registry's constructor: an EXL2, GPTQ or FP16 folder (the embedded model's where `args.model` is None)."""
    return ExLlamaV2Backend.from_args(args)
