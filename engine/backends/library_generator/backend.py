"""The engines that drive a library's own generator (ExLlamaV2, ExLlamaV3): one base, the library's part in a subclass.

Both libraries have a paged generator that takes a job, runs one verification round per `iterate()` call and drafts
by itself (a draft model, n-gram, an MTP head), so what specchat does around it is the same: the model folders
checked, the library imported lazily (its first import compiles CUDA code), the load's failures in one line, the
chat template and the tokenizer, K chosen between replies, the job's live counters read after every call as rounds
(engine/backends/held_rounds.py), a cancel read between calls, and the reply's stats from the end result.
`LibraryGeneratorBackend` holds all of it; an engine subclasses it and says what its library does differently:

- `_import_library`: the names it uses (its `library.py`);
- `_build`: the load's steps (configs, draft, caches, weights, generator), each naming its stage for the errors;
- `_choose_k` / `set_num_draft_tokens`: how K reaches its generator between replies;
- `_room` and `_new_job`: what a job keeps free in the cache and how it takes a sampler;
- `_finish`: the Done from the shared stats (timings, notes).

The other hooks have the common behaviour by default. `build(args)` in the engine's `backend.py` is
`Engine.from_args(args)`; with a registry row that is the whole engine (docs/development.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, Self

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.cuda import device_label, is_oom
from engine.backends.held_rounds import HeldRounds, JobRounds, released, stop_reason_of
from engine.backends.library_generator.models import LibraryVocab, LoadedModels, round_up_to_page, vocab_view
from engine.backends.registry import resolve_cache_mode
from engine.chat_template import ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.drafters import DRAFTERS, draft_mode_of, is_draft_keyword
from engine.errors import BackendError, first_line
from engine.events import BackendInfo, Chunk, Done, DraftMode, StopReason
from engine.models.folders import FolderNeeds, check_model_folder
from engine.request import CACHE_MODES, GenerationRequest, SamplerSettings

OOM_HINT = "lower max_context, use cache_mode q4, or a smaller draft"


def _silent(stage: str, fraction: float | None) -> None:
    pass


@dataclass(slots=True)
class LoadStage:
    """What `load()` is loading now, for its one-line error."""

    what: str = "model config"


@dataclass(slots=True)
class JobAsk:
    """What one reply's job is asked, beside the request: the engine's `_new_job` builds the job from it."""

    temperature: float  # the reply's first
    wanted: int  # the reply's token limit, cut to the room the cache leaves
    k: int  # drafts a round
    stop_ids: list[int | str]  # stop tokens, and the end of turn as text where it is no single token
    notes: list[str]  # the reply's notes, for what the job cannot do as asked


@dataclass(slots=True)
class JobTimes:
    """A finished or cancelled job's prompt and timings: from the end result, or from the job without one."""

    prompt_tokens: int
    cached_tokens: int
    prefill_s: float
    generate_s: float


@dataclass(slots=True)
class Reply:
    """One reply's job and what the loop keeps while it runs."""

    request: GenerationRequest
    m: Any  # the engine's Models
    job: Any
    k: int  # drafts a round (0: plain)
    adaptive: bool  # K chosen by adaptive K: rounds at K 0 count towards its next probe
    tuner: AdaptiveK
    limited_by_context: bool  # the token limit was cut to what fits the cache
    temperature: float
    end_of_turn_text: str | None
    rounds: JobRounds
    notes: list[str] = field(default_factory=list)
    finished: bool = False  # the job ended or was cancelled by the loop


class LibraryGeneratorBackend:
    """The Backend protocol on a library's own generator; subclasses say what their library does differently."""

    name: ClassVar[str]
    folder_needs: ClassVar[FolderNeeds]
    vocab: ClassVar[type[LibraryVocab]]  # its tokenizer as the draft-compatibility check sees one
    page_size: ClassVar[int] = 256  # cache lengths are whole pages
    max_draft_tokens: ClassVar[int] = 16  # the largest K
    # Adaptive K changes K between replies only, so a probe is a whole reply: rounds at K 0 before the next one.
    probe_interval: ClassVar[int] = 256

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
        self.notes: list[str] = []
        self.model_dir = Path(model_dir).expanduser()
        self.draft_dir: Path | None = None
        # drafter: what proposes the drafts (a name in the drafters' map: "model", "mtp", "ngram", "none");
        # draft_mode: the app's name for it
        self.drafter = str(draft).strip().lower() if is_draft_keyword(draft) else "model"
        if not is_draft_keyword(draft):
            self.draft_dir = Path(draft).expanduser()
        self.draft_mode: DraftMode = draft_mode_of(draft)  # type: ignore[assignment]
        self.cache_mode = cache_mode
        self.draft_cache_mode = draft_cache_mode
        self.max_context = max_context
        self.gpu_split = list(gpu_split) if gpu_split else None
        self.num_draft_tokens = self._clamp_k(num_draft_tokens)
        self._ex: SimpleNamespace | None = None
        self._m: Any = None  # the engine's Models, once loaded
        self._template: ChatTemplate | None = None
        self.tuners: dict[str, AdaptiveK] = {}

    @classmethod
    def from_args(cls, args: EngineArgs) -> Self:
        """The registry's constructor: the model folder (the embedded model's where `args.model` is None)."""
        from engine.models import ensure_embedded_model

        return cls(
            args.model if args.model is not None else ensure_embedded_model(),
            draft=args.draft,
            cache_mode=resolve_cache_mode(args.cache_mode, cls.name),
            draft_cache_mode=resolve_cache_mode(args.draft_cache_mode, cls.name),
            max_context=args.max_context,
            gpu_split=list(args.gpu_split) if args.gpu_split else None,
        )

    @property
    def uses_draft_model(self) -> bool:
        """Whether the drafts take model steps (a draft model, an MTP head): a draft cache, K floors."""
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
            max_context=m.cache_len if m else round_up_to_page(self.max_context, self.page_size),
            notes=self._info_notes(),
        )

    def load(self, progress: ProgressCallback | None = None) -> None:
        if self._m is not None:  # loaded already: keep the generator and its prefix cache
            return
        report = progress or _silent
        self._check_folders()
        try:
            self._template = ChatTemplate.from_folder(self.model_dir)
        except ChatTemplateError as exc:
            raise BackendError(str(exc)) from exc
        report(f"importing {self.name}", None)
        ex = self._ex = self._import_library(report)
        stage = LoadStage()
        try:
            m = self._build(ex, report, stage)
        except BackendError:
            raise
        except Exception as exc:
            if is_oom(exc):
                raise BackendError(f"out of memory loading {stage.what}: {OOM_HINT}") from exc
            raise BackendError(f"{self.name} could not load {stage.what}: {first_line(exc)}") from exc
        self._m = m
        self._loaded_models(m)
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
        """One job, one `iterate()` call a round: K chosen, the job queued, then its rounds as Chunks and a Done."""
        reply = self._start_reply(request, self._loaded())
        yield from self._stream(reply, cancel)

    def close(self) -> None:
        m, self._m = self._m, None
        if m is None:
            return
        self._close_generator(m.generator)
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
            self.tuners[key] = AdaptiveK(prior, probe_interval=self.probe_interval)
        return self.tuners[key]

    @staticmethod
    def adaptive_k(tuner: AdaptiveK, k_max: int, costs: VerifyCostModel | None = None) -> int:
        """The next reply's K: the one that pays most; 0 where none does, except for a short probe reply once
        `probe_interval` rounds went by without drafting (the generator's K is fixed within a job). Without a
        measured verify cost, adaptive K's default model."""
        return tuner.choose(k_max, costs, rounds=0)  # the reply's rounds are counted when it ends

    def set_num_draft_tokens(self, k: int) -> int:
        """Make the next reply draft `k` tokens per round, keeping generator and caches; returns the K used."""
        raise NotImplementedError

    # --- the reply ----------------------------------------------------------------------------------

    def _start_reply(self, request: GenerationRequest, m: Any) -> Reply:
        """K for this reply, the token limit the cache leaves, the job queued."""
        ex = self._ex
        assert ex is not None
        notes: list[str] = []
        tuner = self.tuner(request.tuning_key, request.acceptance_prior)
        k, adaptive = self._choose_k(request, m, tuner, notes)
        wanted = self._wanted(request, m, k)
        temperature = request.sampler.temperature_at(0)
        stop_ids: list[int | str] = [t for t in dict.fromkeys((m.eos_id, m.end_of_turn_id)) if t is not None]
        end_of_turn_text = self._template.end_of_turn if self._template else None
        if end_of_turn_text and m.end_of_turn_id is None:
            # The template's end-of-turn marker is no single token of this vocabulary: stop on it as text. The
            # generator then holds back text that could be its start; its tokens stay in the reply's token ids
            # (they were generated), its text does not.
            stop_ids.append(end_of_turn_text)
        job = self._new_job(ex, request, JobAsk(temperature, wanted, k, stop_ids, notes))
        try:
            m.generator.enqueue(job)
        except AssertionError as exc:  # the job cannot fit the cache
            raise BackendError(f"{self.name} refused the reply: {exc}") from exc
        rounds = JobRounds(HeldRounds(k), wanted)
        limited = wanted < request.max_new_tokens
        return Reply(
            request, m, job, k, adaptive, tuner, limited, temperature, end_of_turn_text, rounds, notes
        )

    def _wanted(self, request: GenerationRequest, m: Any, k: int) -> int:
        """The reply's token limit: the request's, cut to the room the cache leaves; refused where none is left."""
        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            raise BackendError("empty prompt")
        room = self._room(m, prompt_len, k)
        if room < 1:
            raise BackendError(
                f"the prompt ({prompt_len} tokens) does not fit the {m.cache_len}-token context; "
                "start a new chat or raise max_context"
            )
        return min(request.max_new_tokens, room)

    def _stream(self, reply: Reply, cancel: threading.Event) -> Iterator[Chunk | Done]:
        """The job's rounds as Chunks, then its Done; the job cancelled wherever the reply stops early."""
        generator, job = reply.m.generator, reply.job
        try:
            while True:
                results = self._iterate(generator)
                ours = [r for r in results if r.get("job") is job]
                self._raise_if_failed(reply, ours)
                streaming = [r for r in ours if r.get("stage") == "streaming"]
                end = next((r for r in streaming if r.get("eos")), None)
                overflow = reply.rounds.count(job, self._on_stop_token(end), reply.temperature)
                for chunk in reply.rounds.held.release(
                    *self._released(streaming, end, overflow, reply), time.monotonic()
                ):
                    reply.tuner.record(chunk.drafted, chunk.accepted)
                    yield chunk
                done = self._reply_end(reply, end, overflow, cancel)
                if done is not None:
                    yield done
                    return
                reply.temperature = self._next_temperature(
                    job, reply.request.sampler, streaming, reply.temperature
                )
        finally:
            if reply.adaptive and reply.k == 0 and reply.request.effective_k > 0:
                # rounds without drafting count towards the next probe
                reply.tuner.skipped += reply.rounds.rounds
            if not reply.finished and job in generator.active_jobs + generator.pending_jobs:
                generator.cancel(job)

    @staticmethod
    def _on_stop_token(end: dict[str, Any] | None) -> bool:
        return end is not None and end.get("eos_reason") == "stop_token"

    def _released(
        self, streaming: list[dict[str, Any]], end: dict[str, Any] | None, overflow: bool, reply: Reply
    ) -> tuple[list[int], str]:
        """What this round's results let out; past the reply's limit, only the tokens its rounds still take."""
        ids, text = released(streaming, end, self.decode)
        if overflow:
            ids = ids[: reply.rounds.held.held_tokens]
            text = self.decode(ids)
        return ids, text

    def _reply_end(
        self, reply: Reply, end: dict[str, Any] | None, overflow: bool, cancel: threading.Event
    ) -> Done | None:
        """The Done where this round ends the reply (its limit, the job's end, a cancel); None to go on."""
        generator, job = reply.m.generator, reply.job
        if overflow and end is None:
            generator.cancel(job)
            reply.finished = True
            return self._done(reply, None, "max_new_tokens")
        if end is not None:
            reply.finished = True
            reason = self._stop_reason(end, reply)
            if reason == "max_new_tokens" and reply.limited_by_context:
                reason = "context"
            return self._done(reply, end, reason)
        if cancel.is_set():
            # From this thread: the one running iterate(), as both libraries require.
            generator.cancel(job)
            reply.finished = True
            return self._done(reply, None, "cancelled")
        return None

    def _iterate(self, generator: Any) -> list[dict[str, Any]]:
        try:
            return generator.iterate()
        except Exception as exc:
            if is_oom(exc):
                raise BackendError(f"out of memory while generating: {OOM_HINT}") from exc
            error = self._generation_error(exc)
            if error is exc:
                raise
            raise error from exc

    def _done(self, reply: Reply, end: dict[str, Any] | None, reason: StopReason) -> Done:
        request, job = reply.request, reply.job
        if end is not None:
            times = JobTimes(
                prompt_tokens=int(end.get("prompt_tokens", len(request.prompt_ids))),
                cached_tokens=int(end.get("cached_tokens", 0)),
                prefill_s=float(end.get("time_prefill", 0.0)),
                generate_s=float(end.get("time_generate", 0.0)),
            )
        else:
            first, start = job.time_first_token, job.time_first_prefill
            times = JobTimes(
                prompt_tokens=len(request.prompt_ids),
                cached_tokens=int(job.cached_pages * self._page_of(reply.m) + job.cached_tokens),
                prefill_s=first - start if first is not None and start is not None else 0.0,
                generate_s=time.time() - first if first is not None else 0.0,
            )
        return self._finish(reply, times, reason)

    # --- what an engine says of its library (defaults: the common behaviour) ----------------------------

    def _import_library(self, report: ProgressCallback) -> SimpleNamespace:
        raise NotImplementedError

    def _build(self, ex: SimpleNamespace, report: ProgressCallback, stage: LoadStage) -> LoadedModels:
        """Everything `load()` builds, setting `stage.what` as it goes (the load's error names it)."""
        raise NotImplementedError

    def _loaded_models(self, m: Any) -> None:
        """After a load: what the loaded generator still needs."""

    def _check_folders(self) -> None:
        check_model_folder(self.model_dir, "model", self.folder_needs, BackendError)
        if self.draft_dir is not None:
            check_model_folder(self.draft_dir, "draft model", self.folder_needs, BackendError)

    def _info_notes(self) -> tuple[str, ...]:
        return tuple(self.notes)

    def _choose_k(
        self, request: GenerationRequest, m: Any, tuner: AdaptiveK, notes: list[str]
    ) -> tuple[int, bool]:
        """This reply's K, set on the generator, and whether adaptive K chose it."""
        raise NotImplementedError

    def _room(self, m: Any, prompt_len: int, k: int) -> int:
        """The most tokens a job may ask for after a prompt of `prompt_len` at K `k`."""
        raise NotImplementedError

    def _new_job(self, ex: SimpleNamespace, request: GenerationRequest, ask: JobAsk) -> Any:
        """The library's job for this reply (not queued yet)."""
        raise NotImplementedError

    def _generation_error(self, exc: Exception) -> Exception:
        """What an `iterate()` failure (not out of memory) becomes; itself: raised as it is."""
        return exc

    def _raise_if_failed(self, reply: Reply, ours: list[dict[str, Any]]) -> None:
        """Raise where a result says the job failed (the library reports it as a result, not an exception)."""

    def _stop_reason(self, end: dict[str, Any], reply: Reply) -> StopReason:
        m = reply.m
        return stop_reason_of(end, m.eos_id, m.end_of_turn_id, reply.end_of_turn_text)

    def _next_temperature(
        self, job: Any, sampler: SamplerSettings, streaming: list[dict[str, Any]], temperature: float
    ) -> float:
        """The temperature of the next round (a ramp where the library can change it between rounds)."""
        return temperature

    def _page_of(self, m: Any) -> int:
        return self.page_size

    def _finish(self, reply: Reply, times: JobTimes, reason: StopReason) -> Done:
        return Done(
            stop_reason=reason,
            prompt_tokens=times.prompt_tokens,
            cached_tokens=times.cached_tokens,
            prefill_s=times.prefill_s,
        )

    def _close_generator(self, generator: Any) -> None:
        """Release what the generator holds besides the models."""

    # --- internals ----------------------------------------------------------------------------------

    def _fit_context(self, native: int) -> int:
        """The cache length: max_context in whole pages, lowered to what the model was trained for."""
        cache_len = round_up_to_page(self.max_context, self.page_size)
        if native and cache_len > native:
            cache_len = max(self.page_size, native // self.page_size * self.page_size)
            self.notes.append(
                f"max_context lowered to {cache_len}: the model was trained for {native} tokens"
            )
        return cache_len

    def _check_draft_vocab(self, tokenizer: Any, draft_tokenizer: Any) -> None:
        """DraftIncompatibleError (a BackendError) naming the rule where the draft cannot serve the model."""
        from engine.decoding.draft_compat import check_draft_compatible

        assert self.draft_dir is not None
        eot = self._template.end_of_turn if self._template else None
        check_draft_compatible(
            vocab_view(self.model_dir.name, tokenizer, eot, self.vocab),
            vocab_view(self.draft_dir.name, draft_tokenizer, eot, self.vocab),
        )

    def _shared_fields(
        self, model: Any, cache: Any, tokenizer: Any, generator: Any, draft: tuple[Any, Any], cache_len: int
    ) -> dict[str, Any]:
        """The fields of `LoadedModels` (every engine's `Models` has them), stop tokens and device read here;
        `draft`: the draft model and its cache (None, None without)."""
        eot = self._template.end_of_turn if self._template else None
        return {
            "model": model,
            "cache": cache,
            "tokenizer": tokenizer,
            "generator": generator,
            "draft_model": draft[0],
            "draft_cache": draft[1],
            "cache_len": cache_len,
            "eos_id": tokenizer.eos_token_id,
            # None where the end of turn is no single token: the reply then stops on its text
            "end_of_turn_id": tokenizer.single_id(eot) if eot else None,
            "device": device_label(),
        }

    def _idle_generator(self) -> Any:
        """The generator, between replies (K changes only there)."""
        generator = self._loaded().generator
        if generator.num_remaining_jobs():
            raise BackendError("cannot change the draft length while a reply is running")
        return generator

    def _clamp_k(self, k: int) -> int:
        if k > self.max_draft_tokens:
            note = self._k_cap_note(k)
            if note not in self.notes:
                self.notes.append(note)
            return self.max_draft_tokens
        return max(0, k)

    def _k_cap_note(self, k: int) -> str:
        return f"K is at most {self.max_draft_tokens} with {self.name} here; asked {k}"

    def _loaded(self) -> Any:
        if self._m is None:
            raise BackendError(f"the {self.name} backend is not loaded")
        return self._m
