"""ExLlamaV3 (1.6.5) backend: exllamav3's `Generator` with a draft model, the model's MTP head or n-gram drafting,
and a quantized KV cache.

How the generator is driven (exllamav3/generator/generator.py and job.py of the pinned release):

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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.cuda import device_label, is_oom
from engine.backends.exllamav3.folder import NEEDS, mtp_refusal, no_mtp_component
from engine.backends.exllamav3.library import PINNED_VERSION, import_exllamav3, short_cause
from engine.backends.exllamav3.models import PAGE_SIZE, Models, round_up_to_page, vocab_view
from engine.backends.exllamav3.sampling import build_sampler, cache_kwargs
from engine.backends.held_rounds import HeldRounds, ids_of, stop_reason_of
from engine.backends.registry import resolve_cache_mode
from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.drafters import DRAFTERS, draft_mode_of, is_draft_keyword
from engine.errors import BackendError, first_line
from engine.events import BackendInfo, Chunk, Done, DraftMode, StopReason
from engine.models.folders import check_model_folder
from engine.request import CACHE_MODES, GenerationRequest

MAX_DRAFT_TOKENS = 16  # the largest K a preset may ask for; the generator is built with it
NGRAM_MATCH_MIN = 2  # exllamav3's n-gram drafter proposes after a match of at least this many tokens
PROBE_INTERVAL_ROUNDS = 256
BATCH = 1  # one reply at a time: the generator's batch and the caches' recurrent state slots
OOM_HINT = "lower max_context, use cache_mode q4, or a smaller draft"
K_FLOOR_NOTE = (
    "K floored at 1 with a draft model: at K 0 exllamav3 skips the draft forward and its cache falls behind"
)


class ExLlamaV3Backend:
    """The Backend protocol on exllamav3's Generator."""

    name = "exllamav3"

    def __init__(
        self,
        model_dir: str | Path,
        draft: str = "ngram",
        cache_mode: str = "q8",
        draft_cache_mode: str = "q8",
        max_context: int = 4096,
        gpu_split: list[float] | None = None,
        num_draft_tokens: int = 4,
    ) -> None:
        for label, mode in (("cache_mode", cache_mode), ("draft_cache_mode", draft_cache_mode)):
            if mode not in CACHE_MODES:
                raise BackendError(f"{label} {mode!r} is not one of {', '.join(CACHE_MODES)}")
        self.model_dir = Path(model_dir).expanduser()
        self.draft_dir: Path | None = None
        # drafter: what proposes the drafts (a name in the drafters' map: "model", "mtp", "ngram", "none");
        # draft_mode: the app's name for it
        self.drafter: str
        if is_draft_keyword(draft):
            self.drafter = str(draft).strip().lower()
        else:
            self.drafter = "model"
            self.draft_dir = Path(draft).expanduser()
        self.draft_mode: DraftMode = draft_mode_of(draft)  # type: ignore[assignment]
        self.cache_mode = cache_mode
        self.draft_cache_mode = draft_cache_mode
        self.max_context = max_context
        self.gpu_split = list(gpu_split) if gpu_split else None
        self.num_draft_tokens = self._clamp_k(num_draft_tokens)
        self.notes: list[str] = []
        self.reply_notes: tuple[str, ...] = ()  # the last reply's Done.notes
        self.last_job_counters: tuple[int, int] = (0, 0)  # the last reply's job: accepted, rejected drafts
        self._ex: SimpleNamespace | None = None
        self._m: Models | None = None
        self._template: ChatTemplate | None = None
        self.tuners: dict[str, AdaptiveK] = {}

    @property
    def uses_draft_model(self) -> bool:
        return DRAFTERS[self.drafter].steps

    # --- protocol -----------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        m = self._m
        draft_name = (
            self.draft_dir.name if self.draft_dir else ("MTP head" if self.drafter == "mtp" else None)
        )
        return BackendInfo(
            backend=self.name,
            model=self.model_dir.name,
            device=m.device if m else "cuda",
            cache_mode=self.cache_mode,
            draft_cache_mode=self.draft_cache_mode if self.uses_draft_model else "",
            draft_mode=self.draft_mode,
            draft_model=draft_name,
            max_context=m.cache_len if m else round_up_to_page(self.max_context),
            notes=(f"drafter: {DRAFTERS[self.drafter].label}", *self.notes),
        )

    def load(self, progress: ProgressCallback | None = None) -> None:
        if self._m is not None:  # loaded already: keep the generator and its prefix cache
            return
        report = progress or (lambda stage, fraction: None)
        check_model_folder(self.model_dir, "model", NEEDS, BackendError)
        if self.draft_dir is not None:
            check_model_folder(self.draft_dir, "draft model", NEEDS, BackendError)
        refusal = mtp_refusal(self.model_dir) if self.drafter == "mtp" else None
        if refusal:  # no MTP layer in config.json, or none in the weights: said before importing exllamav3
            raise BackendError(refusal)
        try:
            self._template = ChatTemplate.from_folder(self.model_dir)
        except ChatTemplateError as exc:
            raise BackendError(str(exc)) from exc
        report("importing exllamav3", None)
        ex = self._ex = import_exllamav3(report)
        if ex.version != PINNED_VERSION:
            self.notes.append(
                f"exllamav3 {ex.version} installed; specchat is checked against {PINNED_VERSION}"
            )
        loading = "model config"
        try:
            config = self._read_config(ex, self.model_dir, "model")
            cache_len = round_up_to_page(self.max_context)
            native = int(getattr(config, "max_position_embeddings", 0) or 0)
            if native and cache_len > native:
                cache_len = max(PAGE_SIZE, native // PAGE_SIZE * PAGE_SIZE)
                self.notes.append(
                    f"max_context lowered to {cache_len}: the model was trained for {native} tokens"
                )
            k_max = MAX_DRAFT_TOKENS if self.drafter != "none" else 0
            loading = f"model {self.model_dir.name}"
            model = ex.Model.from_config(config)
            tokenizer = ex.Tokenizer.from_config(config)

            draft_model = draft_cache = None
            if self.drafter == "mtp":
                loading = "MTP head"
                # An architecture with no "mtp" component (model/model.py:186-187; Qwen3.5's text-only
                # classes, architecture/qwen3_5.py:150-164) is refused here in one line, naming it.
                if "mtp" not in getattr(config, "model_classes", {}):
                    arch = getattr(config, "architecture", type(config).__name__)
                    raise BackendError(no_mtp_component(ex.version, arch, self.model_dir))
                draft_model = ex.Model.from_config(config, component="mtp")
            elif self.draft_dir is not None:
                loading = f"draft model {self.draft_dir.name}"
                draft_config = self._read_config(ex, self.draft_dir, "draft model")
                from engine.decoding.draft_compat import check_draft_compatible

                eot = self._template.end_of_turn if self._template else None
                check_draft_compatible(  # raises DraftIncompatibleError (a BackendError) naming the rule
                    vocab_view(self.model_dir.name, tokenizer, eot),
                    vocab_view(self.draft_dir.name, ex.Tokenizer.from_config(draft_config), eot),
                )
                draft_model = ex.Model.from_config(draft_config)

            # Caches before load(): exllamav3 allocates their tensors as the model loads. Same size for both.
            # On a model with recurrent layers (Gated DeltaNet: Qwen3.5, Qwen3-Next) the generator refuses a cache
            # whose max_history is below its widest pass (generator.py:378-384; max_history sizes the rewind of a
            # rejected draft, cache/cache.py:124-128), and every state slot (max_batch_size, cache.py:121-122,
            # 171-184) holds two full recurrent states in VRAM (modules/gated_delta_net.py:287-288): one reply at a
            # time needs one (the generator's batch is clamped to the slots, generator.py:404-408).
            loading = "cache"
            layers = (ex.CacheLayer_fp16, ex.CacheLayer_quant)
            cache = ex.Cache(
                model,
                max_num_tokens=cache_len,
                max_batch_size=BATCH,
                max_history=k_max,
                **cache_kwargs(self.cache_mode, *layers),
            )
            if draft_model is not None:
                draft_cache = ex.Cache(
                    draft_model,
                    max_num_tokens=cache_len,
                    max_batch_size=BATCH,
                    max_history=k_max,
                    **cache_kwargs(self.draft_cache_mode, *layers),
                )
                loading = "draft model" if self.drafter == "model" else "MTP head"
                report(f"loading {DRAFTERS[self.drafter].label}", 0.0)
                draft_model.load(
                    use_per_device=self.gpu_split,
                    progressbar=False,
                    callback=lambda a, b: report(f"loading {DRAFTERS[self.drafter].label}", a / max(b, 1)),
                )
            loading = f"model {self.model_dir.name}"
            report(f"loading {self.model_dir.name}", 0.0)
            model.load(
                use_per_device=self.gpu_split,
                progressbar=False,
                callback=lambda a, b: report(f"loading {self.model_dir.name}", a / max(b, 1)),
                draft_model=draft_model,
            )

            loading = "generator"
            printed = (
                io.StringIO()
            )  # exllamav3 prints its warnings (an MTP head's depth): into notes, not the TUI
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
        except BackendError:
            raise
        except Exception as exc:
            if is_oom(exc):
                raise BackendError(f"out of memory loading {loading}: {OOM_HINT}") from exc
            cause = first_line(exc)
            raise BackendError(f"exllamav3 could not load {loading}: {cause}") from exc

        self.notes += [
            f"exllamav3: {line.strip(' !-')}" for line in printed.getvalue().splitlines() if line.strip()
        ]
        if generator.target_recurrent:  # the model's caps say "recurrent_states" (generator.py:376)
            self.notes.append(
                f"recurrent layers: exllamav3 rewinds rejected drafts (passes up to {cache.max_history} drafts) "
                f"and checkpoints the state every {generator.recurrent_checkpoint_interval} tokens"
            )  # generator.py:411-419: the interval the model's caps give
        eot = self._template.end_of_turn if self._template else None
        calibrator = getattr(generator, "draft_calibrator", None)
        generator.draft_calibrator = None  # lent per reply (k_mode "dynamic")
        self._m = Models(
            model=model,
            cache=cache,
            tokenizer=tokenizer,
            generator=generator,
            draft_model=draft_model,
            draft_cache=draft_cache,
            calibrator=calibrator,
            cache_len=cache_len,
            eos_id=tokenizer.eos_token_id,
            end_of_turn_id=tokenizer.single_id(eot) if eot else None,
            device=device_label(),
        )
        self.set_num_draft_tokens(self.num_draft_tokens)
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
        notes: list[str] = []
        tuner = self.tuner(request.tuning_key, request.acceptance_prior)
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
        generator.draft_calibrator = m.calibrator if dynamic else None
        if self.drafter != "none":
            notes.insert(0, f"drafter: {DRAFTERS[self.drafter].label}, K {k} by {length_by}")

        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            raise BackendError("empty prompt")
        # exllamav3 clamps max_new_tokens to this room silently (Job.prepare_for_queue); say so instead.
        room = m.cache_len - prompt_len - 1 - int(generator.max_draft_tokens)
        if room < 1:
            raise BackendError(
                f"the prompt ({prompt_len} tokens) does not fit the {m.cache_len}-token context; "
                "start a new chat or raise max_context"
            )
        wanted = min(request.max_new_tokens, room)
        limited_by_context = wanted < request.max_new_tokens
        sampler = request.sampler
        temperature = sampler.temperature_at(0)
        if sampler.ramp_tokens > 0 and temperature != sampler.temperature:
            notes.append(
                f"temperature ramp not applied: exllamav3's sampler is fixed per reply, sampled at {temperature:g}"
            )
        stop_ids: list[int | str] = [t for t in dict.fromkeys((m.eos_id, m.end_of_turn_id)) if t is not None]
        end_of_turn_text = self._template.end_of_turn if self._template else None
        if end_of_turn_text and m.end_of_turn_id is None:
            stop_ids.append(end_of_turn_text)  # not one token of this vocabulary: stop on it as text
        job = ex.Job(
            input_ids=torch.tensor([request.prompt_ids], dtype=torch.long),
            max_new_tokens=wanted,
            sampler=build_sampler(ex.ComboSampler, sampler, temperature),
            seed=request.seed,
            stop_conditions=stop_ids,
            decode_special_tokens=False,
        )
        try:
            generator.enqueue(job)
        except AssertionError as exc:  # the job cannot fit the cache
            raise BackendError(f"exllamav3 refused the reply: {exc}") from exc

        self.reply_notes = tuple(notes)
        sampled = 0
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
                    raise BackendError(f"exllamav3 failed while generating: {short_cause(exc)}") from exc
                ours = [r for r in results if r.get("job") is job]
                failed = next((r for r in ours if r.get("stage") == "error"), None)
                if failed is not None:
                    finished = True  # the generator already dropped the job (reap_failed_job)
                    error = failed.get("error")
                    if isinstance(error, BaseException) and is_oom(error):
                        raise BackendError(f"out of memory while generating: {OOM_HINT}")
                    cause = short_cause(error) if isinstance(error, BaseException) else str(error)
                    raise BackendError(f"exllamav3 failed the reply: {cause}")
                streaming = [r for r in ours if r.get("stage") == "streaming"]
                end = next((r for r in streaming if r.get("eos")), None)
                accepted = job.accepted_draft_tokens - seen_accepted
                rejected = job.rejected_draft_tokens - seen_rejected
                new = job.new_tokens - seen_new
                seen_accepted, seen_rejected, seen_new = (
                    job.accepted_draft_tokens,
                    job.rejected_draft_tokens,
                    job.new_tokens,
                )
                on_stop_token = end is not None and end.get("eos_reason") == "stop_token"
                if new > 0:
                    rounds += 1
                if on_stop_token:
                    new -= 1  # the stop token is sampled but is no part of the reply
                overflow = sampled + new > wanted  # a safety net: the job's own limit stops at `wanted`
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
                    # As exllamav2: a stop token ends the job with what it held (and the stop token last) in
                    # result["held"] (job.py emit(): emit_held is False on "stop_token").
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
                    tuner.record(chunk.drafted, chunk.accepted)
                    yield chunk
                if overflow and end is None:
                    generator.cancel(job)
                    finished = True
                    yield self._done(job, None, request, m, "max_new_tokens", notes)
                    return

                if end is not None:
                    finished = True
                    reason = self._stop_reason(end, m, end_of_turn_text, notes)
                    if reason == "max_new_tokens" and limited_by_context:
                        reason = "context"
                    yield self._done(job, end, request, m, reason, notes)
                    return

                if cancel.is_set():
                    generator.cancel(job)  # from the thread that runs iterate()
                    finished = True
                    yield self._done(job, None, request, m, "cancelled", notes)
                    return
        finally:
            if request.k_mode == "adaptive" and k == 0 and request.effective_k > 0:
                tuner.skipped += rounds
            if not finished and job in generator.active_jobs + generator.pending_jobs:
                generator.cancel(job)

    def close(self) -> None:
        m, self._m = self._m, None
        if m is None:
            return
        close = getattr(m.generator, "close", None)
        if close is not None:
            close()  # releases the generator's pinned buffers and pools; the cache then has no owner
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
        if key not in self.tuners:
            self.tuners[key] = AdaptiveK(prior, probe_interval=PROBE_INTERVAL_ROUNDS)
        return self.tuners[key]

    @staticmethod
    def adaptive_k(tuner: AdaptiveK, k_max: int) -> int:
        """The next reply's K, as exllamav2's (the verify cost is not measured here: the default model)."""
        return tuner.choose(k_max, None, rounds=0)  # the reply's rounds are counted when it ends

    def set_num_draft_tokens(self, k: int) -> int:
        """Make the next reply draft `k` tokens per round, keeping generator and caches. Returns the K used:
        0..MAX_DRAFT_TOKENS (the generator's max_draft_tokens), 0 without a drafter, at least 1 with a draft
        model or MTP head."""
        m = self._loaded()
        generator = m.generator
        if generator.num_remaining_jobs():
            raise BackendError("cannot change the draft length while a reply is running")
        if self.drafter == "none":
            k = 0
        else:
            k = min(self._clamp_k(k), int(generator.max_draft_tokens))
            if self.uses_draft_model:
                k = max(k, 1)
        generator.num_draft_tokens = k
        self.num_draft_tokens = k
        return k

    # --- internals ----------------------------------------------------------------------------------

    def _clamp_k(self, k: int) -> int:
        if k > MAX_DRAFT_TOKENS:
            note = f"K is at most {MAX_DRAFT_TOKENS} with exllamav3 here; asked {k}"
            if note not in getattr(self, "notes", []):
                self.notes.append(note)
            return MAX_DRAFT_TOKENS
        return max(0, k)

    def _loaded(self) -> Models:
        if self._m is None:
            raise BackendError("the exllamav3 backend is not loaded")
        return self._m

    @staticmethod
    def _read_config(ex: SimpleNamespace, folder: Path, what: str) -> Any:
        try:
            return ex.Config.from_directory(str(folder))
        except (AssertionError, ValueError, KeyError, TypeError, OSError) as exc:
            cause = str(exc).strip() or type(exc).__name__
            raise BackendError(f"exllamav3 cannot load the {what} in {folder}: {cause}") from exc

    @staticmethod
    def _stop_reason(
        end: dict[str, Any], m: Models, end_of_turn_text: str | None, notes: list[str]
    ) -> StopReason:
        if end.get("eos_reason") == "loop_detected":
            notes.append("exllamav3's loop detector stopped the reply")
            return "repetition"
        return stop_reason_of(end, m.eos_id, m.end_of_turn_id, end_of_turn_text)

    def _done(
        self,
        job: Any,
        end: dict[str, Any] | None,
        request: GenerationRequest,
        m: Models,
        reason: StopReason,
        notes: list[str],
    ) -> Done:
        if end is not None:
            prompt_tokens = int(end.get("prompt_tokens", len(request.prompt_ids)))
            cached = int(end.get("cached_tokens", 0))
            prefill_s = float(end.get("time_prefill", 0.0))
        else:
            prompt_tokens = len(request.prompt_ids)
            cached = int(job.cached_pages * PAGE_SIZE + job.cached_tokens)
            first, start = job.time_first_token, job.time_first_prefill
            prefill_s = first - start if first is not None and start is not None else 0.0
        self.reply_notes = tuple(notes)
        self.last_job_counters = (int(job.accepted_draft_tokens), int(job.rejected_draft_tokens))
        return Done(
            stop_reason=reason,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            prefill_s=prefill_s,
            notes=tuple(notes),
        )


def build(args: EngineArgs) -> ExLlamaV3Backend:
    """The registry's constructor: an EXL3 or FP16 folder (the embedded model's where `args.model` is None)."""
    from engine.models import ensure_embedded_model

    return ExLlamaV3Backend(
        args.model if args.model is not None else ensure_embedded_model(),
        draft=args.draft,
        cache_mode=resolve_cache_mode(args.cache_mode, "exllamav3"),
        draft_cache_mode=resolve_cache_mode(args.draft_cache_mode, "exllamav3"),
        max_context=args.max_context,
        gpu_split=list(args.gpu_split) if args.gpu_split else None,
    )
