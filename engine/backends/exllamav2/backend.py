"""ExLlamaV2 (0.3.2) backend: the dynamic generator with a draft model or n-gram drafting and a quantized KV cache.

`import exllamav2` compiles a CUDA extension and fails without CUDA, so the package is imported lazily, only
inside this module's functions, and every failure becomes a one-line `BackendError`. The first import's build
is announced and followed file by file through the load's progress callback (library.py, extension_build.py).

How the generator is driven (see DESIGN.md "ExLlamaV2 facts"):

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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.cuda import device_label, is_oom
from engine.backends.exllamav2.library import import_exllamav2
from engine.backends.exllamav2.models import (
    FOLDER_NEEDS,
    PAGE_SIZE,
    Models,
    fix_rope_theta,
    ntk_alpha,
    round_up_to_page,
    vocab_view,
)
from engine.backends.exllamav2.sampling import build_sampler_settings
from engine.backends.held_rounds import HeldRounds, ids_of, stop_reason_of
from engine.backends.registry import resolve_cache_mode
from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters import draft_mode_of
from engine.errors import BackendError, first_line
from engine.events import BackendInfo, Chunk, Done, DraftMode, StopReason
from engine.models.folders import check_model_folder
from engine.request import CACHE_MODES, GenerationRequest

MAX_DRAFT_TOKENS = 16  # the largest K; the generator's max_q_size is K_max + 1 (K drafts + the last token)
# Adaptive K changes K between replies only, so a probe is a whole reply: rounds at K 0 before the next one.
PROBE_INTERVAL_ROUNDS = 256
OOM_HINT = "lower max_context, use cache_mode q4, or a smaller draft"


# ------------------------------------------------------------------------------------------------ backend


class ExLlamaV2Backend:
    """The Backend protocol on exllamav2's dynamic generator."""

    name = "exllamav2"

    def __init__(
        self,
        model_dir: str | Path,
        draft: str = "ngram",
        cache_mode: str = "q8",
        draft_cache_mode: str = "q8",
        max_context: int = 4096,
        gpu_split: list[float] | None = None,
        num_draft_tokens: int = 4,
        draft_load_in_q4: bool = False,
    ) -> None:
        for label, mode in (("cache_mode", cache_mode), ("draft_cache_mode", draft_cache_mode)):
            if mode not in CACHE_MODES:
                raise BackendError(f"{label} {mode!r} is not one of {', '.join(CACHE_MODES)}")
        self.model_dir = Path(model_dir).expanduser()
        self.draft_dir: Path | None = None
        self.draft_mode: DraftMode = draft_mode_of(draft)  # type: ignore[assignment]
        if self.draft_mode == "model":
            self.draft_dir = Path(draft).expanduser()
        self.cache_mode = cache_mode
        self.draft_cache_mode = draft_cache_mode
        self.max_context = max_context
        self.gpu_split = list(gpu_split) if gpu_split else None
        self.num_draft_tokens = self._clamp_k(num_draft_tokens)
        self.draft_load_in_q4 = draft_load_in_q4
        self.notes: list[str] = []
        self._ex: SimpleNamespace | None = None
        self._m: Models | None = None
        self._template: ChatTemplate | None = None
        self.tuners: dict[str, AdaptiveK] = {}

    # --- protocol -----------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        m = self._m
        return BackendInfo(
            backend=self.name,
            model=self.model_dir.name,
            device=m.device if m else "cuda",
            cache_mode=self.cache_mode,
            draft_cache_mode=self.draft_cache_mode if self.draft_mode == "model" else "",
            draft_mode=self.draft_mode,
            draft_model=self.draft_dir.name if self.draft_dir else None,
            max_context=m.cache_len if m else round_up_to_page(self.max_context),
            notes=tuple(self.notes),
        )

    def load(self, progress: ProgressCallback | None = None) -> None:
        if self._m is not None:  # loaded already: keep the generator and its prefix cache
            return
        report = progress or (lambda stage, fraction: None)
        check_model_folder(self.model_dir, "model", FOLDER_NEEDS, BackendError)
        if self.draft_dir is not None:
            check_model_folder(self.draft_dir, "draft model", FOLDER_NEEDS, BackendError)
        try:
            self._template = ChatTemplate.from_folder(self.model_dir)
        except ChatTemplateError as exc:
            raise BackendError(str(exc)) from exc
        report("importing exllamav2", None)
        ex = self._ex = import_exllamav2(report)
        loading = "model"
        try:
            loading = "model config"
            config = self._read_config(ex, self.model_dir, "model")
            cache_len = round_up_to_page(self.max_context)
            native = config.max_seq_len
            if cache_len > native:
                cache_len = max(PAGE_SIZE, native // PAGE_SIZE * PAGE_SIZE)
                self.notes.append(
                    f"max_context lowered to {cache_len}: the model was trained for {native} tokens"
                )
            config.max_seq_len = cache_len
            tokenizer = ex.Tokenizer(config)

            draft_model = draft_cache = None
            draft_config = None
            if self.draft_dir is not None:
                loading = f"draft model {self.draft_dir.name}"
                draft_config = self._read_config(ex, self.draft_dir, "draft model")
                from engine.decoding.draft_compat import check_draft_compatible

                eot = self._template.end_of_turn if self._template else None
                check_draft_compatible(  # raises DraftIncompatibleError (a BackendError) naming the rule
                    vocab_view(self.model_dir.name, tokenizer, eot),
                    vocab_view(self.draft_dir.name, ex.Tokenizer(draft_config), eot),
                )
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
                draft_model.load_autosplit(
                    draft_cache, callback=lambda a, b: report("loading draft", a / max(b, 1))
                )

            loading = f"model {self.model_dir.name}"
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

            # Paged attention needs flash-attn >= 2.5.7; without it the generator runs unpaged (batch size 1,
            # which is all a chat needs) and still reuses the prefix of the previous reply.
            paged = bool(getattr(ex.attn, "has_flash_attn_with_paged", False)) and not config.no_flash_attn
            if draft_config is not None and draft_config.no_flash_attn:
                paged = False
            if not paged:
                self.notes.append("flash-attn not available: unpaged generator (one reply at a time)")

            loading = "generator"
            use_ngram = self.draft_mode == "ngram"
            generator = ex.Generator(
                model=model,
                cache=cache,
                tokenizer=tokenizer,
                max_batch_size=1,
                max_q_size=MAX_DRAFT_TOKENS + 1,
                draft_model=draft_model,
                draft_cache=draft_cache,
                num_draft_tokens=self.num_draft_tokens if self.draft_mode != "none" else 0,
                use_ngram_draft=use_ngram,
                paged=paged,
            )
            loading = "warm-up"
            report("warming up", None)
            draft_s, target_s, target_one_s = self._time_forwards(model, draft_model)
        except BackendError:
            raise
        except Exception as exc:
            if is_oom(exc):
                raise BackendError(f"out of memory loading {loading}: {OOM_HINT}") from exc
            cause = first_line(exc)
            raise BackendError(f"exllamav2 could not load {loading}: {cause}") from exc

        eos_id = tokenizer.eos_token_id
        eot = self._template.end_of_turn if self._template else None
        end_of_turn_id = tokenizer.single_id(eot) if eot else None
        self._m = Models(
            model=model,
            cache=cache,
            tokenizer=tokenizer,
            generator=generator,
            draft_model=draft_model,
            draft_cache=draft_cache,
            paged=paged,
            cache_len=cache_len,
            eos_id=eos_id,
            end_of_turn_id=end_of_turn_id,
            draft_forward_s=draft_s,
            target_forward_s=target_s,
            device=device_label(),
            costs=self._cost_model(target_one_s, max(self.num_draft_tokens, 1) + 1, target_s, draft_s),
        )
        report("ready", 1.0)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        m = self._loaded()
        assert self._template is not None
        try:
            text = self._template.render(messages, add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise BackendError(str(exc)) from exc
        ids = m.tokenizer.encode(text, add_bos=False, encode_special_tokens=True)
        return [int(i) for i in ids.view(-1).tolist()]

    def decode(self, token_ids: list[int]) -> str:
        import torch

        m = self._loaded()
        if not token_ids:
            return ""
        return m.tokenizer.decode(torch.tensor(token_ids, dtype=torch.long), decode_special_tokens=False)

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        import torch

        m = self._loaded()
        ex = self._ex
        assert ex is not None
        generator = m.generator
        adaptive = request.k_mode == "adaptive" and self.draft_mode != "none"
        tuner = self.tuner(request.tuning_key, request.acceptance_prior)
        k = request.effective_k
        if adaptive and k > 0:
            k = self.adaptive_k(tuner, k, m.costs)
        k = self.set_num_draft_tokens(k)

        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            raise BackendError("empty prompt")
        room = m.cache_len - prompt_len - k
        if room <= 0:
            raise BackendError(
                f"the prompt ({prompt_len} tokens) does not fit the {m.cache_len}-token context; "
                "start a new chat or raise max_context"
            )
        wanted = min(request.max_new_tokens, room)
        limited_by_context = wanted < request.max_new_tokens
        sampler = request.sampler
        temperature = sampler.temperature_at(0)
        stop_ids: list[int | str] = [t for t in dict.fromkeys((m.eos_id, m.end_of_turn_id)) if t is not None]
        end_of_turn_text = self._template.end_of_turn if self._template else None
        if end_of_turn_text and m.end_of_turn_id is None:
            # The template's end-of-turn marker is no single token of this vocabulary: stop on it as text. The
            # generator then holds back text that could be its start; its tokens stay in the reply's token ids
            # (they were generated), its text does not.
            stop_ids.append(end_of_turn_text)
        job = ex.Job(
            input_ids=torch.tensor([request.prompt_ids], dtype=torch.long),
            max_new_tokens=wanted + k,
            gen_settings=build_sampler_settings(ex.Settings, sampler, temperature),
            seed=request.seed,
            stop_conditions=stop_ids,
            decode_special_tokens=False,
        )
        try:
            generator.enqueue(job)
        except AssertionError as exc:  # the job cannot fit the cache
            raise BackendError(f"exllamav2 refused the reply: {exc}") from exc

        emitted = 0  # reply tokens on Chunks
        sampled = 0  # reply tokens the job sampled (released or still held by the generator)
        rounds = 0
        seen_accepted = seen_rejected = seen_new = 0
        held = HeldRounds(k)
        finished = False
        try:
            while True:
                try:
                    results = generator.iterate()
                except Exception as exc:
                    if is_oom(exc):
                        raise BackendError(f"out of memory while generating: {OOM_HINT}") from exc
                    raise
                ours = [r for r in results if r.get("job") is job]
                streaming = [r for r in ours if r.get("stage") == "streaming"]
                end = next((r for r in ours if r.get("eos")), None)
                accepted = job.accepted_draft_tokens - seen_accepted
                rejected = job.rejected_draft_tokens - seen_rejected
                new = job.new_tokens - seen_new
                seen_accepted, seen_rejected = job.accepted_draft_tokens, job.rejected_draft_tokens
                seen_new = job.new_tokens
                on_stop_token = end is not None and end.get("eos_reason") == "stop_token"
                if new > 0:
                    rounds += 1
                if on_stop_token:
                    new -= 1  # the stop token is sampled but is no part of the reply
                overflow = (
                    sampled + new > wanted
                )  # a safety net: the job's own limit already stops at `wanted`
                if overflow:
                    new = wanted - sampled
                sampled += new
                held.add_round(new, accepted + rejected, accepted, temperature)

                ids: list[int] = []
                text = ""
                for r in streaming:
                    ids.extend(ids_of(r.get("token_ids")))
                    text += r.get("text", "")
                if on_stop_token:
                    # The generator ends on a stop token without releasing what it held: the tokens of an
                    # incomplete character before it, then the stop token itself, are in result["held"].
                    tail = ids_of(end.get("held", {}).get("token_ids"))
                    stop_id = end.get("eos_triggering_token_id")
                    if tail and (stop_id is None or tail[-1] == stop_id):
                        tail = tail[:-1]
                    if tail:
                        ids.extend(tail)
                        text += self.decode(tail)
                if overflow:
                    ids = ids[: held.held_tokens]
                    text = self.decode(ids)
                for chunk in held.release(ids, text, time.monotonic()):
                    emitted += len(chunk.token_ids)
                    tuner.record(chunk.drafted, chunk.accepted)
                    yield chunk
                if overflow and end is None:
                    generator.cancel(job)
                    finished = True
                    yield self._done(job, None, request, m, rounds, k, "max_new_tokens")
                    return

                if end is not None:
                    finished = True
                    reason = stop_reason_of(end, m.eos_id, m.end_of_turn_id, end_of_turn_text)
                    if reason == "max_new_tokens" and limited_by_context:
                        reason = "context"
                    yield self._done(job, end, request, m, rounds, k, reason)
                    return

                if cancel.is_set():
                    # From this thread: the one running iterate(), as exllamav2 requires.
                    generator.cancel(job)
                    finished = True
                    yield self._done(job, None, request, m, rounds, k, "cancelled")
                    return

                if sampler.ramp_tokens > 0 and streaming:
                    # The job reads its gen_settings for every token it samples; between iterate() calls is the
                    # only place to change them, so the ramp moves once per round.
                    temperature = sampler.temperature_at(job.new_tokens)
                    job.gen_settings.temperature = temperature
        finally:
            if adaptive and k == 0 and request.effective_k > 0:
                tuner.skipped += rounds  # rounds without drafting count towards the next probe
            if not finished and job in generator.active_jobs + generator.pending_jobs:
                generator.cancel(job)

    def close(self) -> None:
        m, self._m = self._m, None
        if m is None:
            return
        for pool_name in ("sampling_pool", "filter_pool"):
            pool = getattr(m.generator, pool_name, None)
            if pool is not None:
                pool.shutdown(wait=False)
        for model in (m.model, m.draft_model):
            if model is not None:
                model.unload()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover
            pass

    # --- K between replies --------------------------------------------------------------------------

    def tuner(self, key: str, prior: tuple[float, ...] = ()) -> AdaptiveK:
        """The adaptive-K state of one tuning key (a preset), started from `prior` the first time."""
        if key not in self.tuners:
            self.tuners[key] = AdaptiveK(prior, probe_interval=PROBE_INTERVAL_ROUNDS)
        return self.tuners[key]

    @staticmethod
    def adaptive_k(tuner: AdaptiveK, k_max: int, costs: VerifyCostModel | None) -> int:
        """The next reply's K: the one that pays most; 0 where none does, except for a short probe reply once
        `PROBE_INTERVAL_ROUNDS` rounds went by without drafting (the generator's K is fixed within a job)."""
        return tuner.choose(k_max, costs, rounds=0)  # the reply's rounds are counted when it ends

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

    def set_num_draft_tokens(self, k: int) -> int:
        """Make the next reply draft `k` tokens per round (0: no drafting), keeping generator and caches.

        Returns the K actually used: clamped to 0..MAX_DRAFT_TOKENS, and 0 where this backend has no drafter.
        """
        import torch

        m = self._loaded()
        generator = m.generator
        if generator.num_remaining_jobs():
            raise BackendError("cannot change the draft length while a reply is running")
        k = self._clamp_k(k) if self.draft_mode != "none" else 0
        if m.draft_model is not None:
            # The draft model still sees every token at K = 0 (one cheap forward per step) so its cache stays in
            # step with the page table it shares with the target; drafting can come back on without a rebuild.
            buffer = generator.draft_ids_pinned
            if buffer.shape[1] != k:
                generator.draft_ids_pinned = torch.empty(
                    (generator.max_batch_size, k), dtype=torch.long, pin_memory=buffer.is_pinned()
                )
        elif self.draft_mode == "ngram":
            generator.use_ngram_draft = k > 0
        generator.num_draft_tokens = k
        self.num_draft_tokens = k
        return k

    # --- internals ----------------------------------------------------------------------------------

    def _clamp_k(self, k: int) -> int:
        if k > MAX_DRAFT_TOKENS:
            note = f"K is at most {MAX_DRAFT_TOKENS} with exllamav2 (max_q_size {MAX_DRAFT_TOKENS + 1}); asked {k}"
            if note not in getattr(self, "notes", []):
                self.notes.append(note)
            return MAX_DRAFT_TOKENS
        return max(0, k)

    def _loaded(self) -> Models:
        if self._m is None:
            raise BackendError("the exllamav2 backend is not loaded")
        return self._m

    def _read_config(self, ex: SimpleNamespace, folder: Path, what: str) -> Any:
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

    def _done(
        self,
        job: Any,
        end: dict[str, Any] | None,
        request: GenerationRequest,
        m: Models,
        rounds: int,
        k: int,
        reason: StopReason,
    ) -> Done:
        if end is not None:
            prompt_tokens = int(end.get("prompt_tokens", len(request.prompt_ids)))
            cached = int(end.get("cached_tokens", 0))
            prefill_s = float(end.get("time_prefill", 0.0))
            generate_s = float(end.get("time_generate", 0.0))
        else:
            prompt_tokens = len(request.prompt_ids)
            cached = int(job.cached_pages * m.generator.page_size + job.cached_tokens)
            first, start = job.time_first_token, job.time_first_prefill
            prefill_s = first - start if first is not None and start is not None else 0.0
            generate_s = time.time() - first if first is not None else 0.0
        draft_step_s = target_step_s = 0.0
        if m.target_forward_s > 0:
            # Keep the warm-up's draft/target ratio c, scaled so K draft steps + 1 verification = one real round.
            c = m.draft_forward_s / m.target_forward_s if (m.draft_model is not None and k > 0) else 0.0
            target_step_s = m.target_forward_s
            if rounds > 0 and generate_s > 0:
                target_step_s = generate_s / rounds / (c * k + 1.0)
            draft_step_s = c * target_step_s
        return Done(
            stop_reason=reason,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            prefill_s=prefill_s,
            draft_step_s=draft_step_s,
            target_step_s=target_step_s,
        )


def build(args: EngineArgs) -> ExLlamaV2Backend:
    """The registry's constructor: an EXL2, GPTQ or FP16 folder (the embedded model's where `args.model` is None)."""
    from engine.models import ensure_embedded_model

    return ExLlamaV2Backend(
        args.model if args.model is not None else ensure_embedded_model(),
        draft=args.draft,
        cache_mode=resolve_cache_mode(args.cache_mode, "exllamav2"),
        draft_cache_mode=resolve_cache_mode(args.draft_cache_mode, "exllamav2"),
        max_context=args.max_context,
        gpu_split=list(args.gpu_split) if args.gpu_split else None,
    )
