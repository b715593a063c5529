"""llama.cpp backend (llama-cpp-python's low-level API): GGUF models on CPUs, Apple silicon, AMD.

The speculative loop is ours, the same one as the transformers backend's (`engine.decoding.round_loop`): a drafter
(n-gram lookup, a GGUF draft model, or none) proposes k tokens; one `llama_decode` scores the last token plus the
k drafts with logits for every position (`LlamaCppModel.score`); the shared sampler picks the target's token at
each position; the longest agreeing prefix is accepted and the rejected positions are removed from llama.cpp's
KV cache (`LlamaCppModel.crop`, which re-prefills where the memory refuses). A round emits accepted + 1 tokens.

Exactness. Depending on the weight types and the CPU, llama.cpp may compute a batch of one token with other
kernels than a batch of several (other code paths round differently), so a verify pass could pick another
argmax than single-token decoding. Speculative output must equal this backend's plain output, so at load a
probe decodes the same positions one token at a time and as rows of a batch (near the start and past 512 cached
positions) and compares the logits bit for bit. Where they agree, plain steps take the single-token path, as
fast as llama.cpp's own. Where they differ, every plain step goes through the batched kernels: the real token
plus one throw-away position, logits for both rows, the throw-away position removed from the cache afterwards.
`fast_plain=True` skips the probe and always takes the single-token path (for comparison).

Stock llama.cpp differs on float16 weights on x86 (`ggml_vec_dot_f16` for one row, llamafile's tinyBLAS for
2+, both on activations rounded to float16). `make install` builds llama-cpp-python with specchat's patch
(scripts/patch_llama_cpp.py, `patched_build()`): float16 weights against float32 activations, one token summed
exactly as tinyBLAS sums a row of a batch, so the embedded model's F16 GGUF runs plain steps single-token and
its answers follow the float32 reference.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.llamacpp import probe as llamacpp_probe
from engine.backends.llamacpp.architecture import ModelShape, model_shape
from engine.backends.llamacpp.library import patched_build, physical_cores, probe_llamacpp
from engine.backends.llamacpp.model import LlamaCppModel
from engine.backends.llamacpp.mtp import MtpHead, mtp_layers
from engine.backends.llamacpp.native import RepackChoice, choose_repack, plan_load, trial_key
from engine.backends.llamacpp.pass_timings import PassTimings
from engine.backends.llamacpp.probe import ProbeVerdict, probe_widths
from engine.backends.llamacpp.text import ByteDetokenizer, GgufTokenizer, resolve_gguf
from engine.backends.llamacpp.threads import (
    StallWatch,
    ThreadChoice,
    ThreadControl,
    threads_label,
)
from engine.backends.registry import resolve_cache_mode
from engine.chat_template import (
    END_OF_TURN_CANDIDATES,
    FALLBACK_NOTE,
    FALLBACK_TEMPLATE,
    ChatTemplate,
)
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import VerifyCostModel
from engine.decoding.draft_compat import VocabView, check_draft_compatible
from engine.decoding.drafters import draft_mode_of, drafts
from engine.decoding.round_loop import LoopSetup, RoundLoopBackend
from engine.errors import BackendError
from engine.events import BackendInfo, Chunk, Done, DraftMode
from engine.request import GenerationRequest

BACKEND_NAME = "llama.cpp"
MTP_LABEL = "MTP head"  # what the stats call the draft where the model's own MTP head drafts
# cache_mode -> llama.cpp K/V cache type name; llama.cpp has no 6-bit cache type, q6 takes q8_0.
CACHE_TYPE_NAMES = {"fp16": "f16", "q8": "q8_0", "q6": "q8_0", "q4": "q4_0"}
# Verify-pass widths timed at load for the cost model (later passes refine it), those up to the widest pass the
# loop may send: wide ones too, so that a long-match draft is priced by a measured pass, not by extrapolation.
CALIBRATION_WIDTHS = (1, 2, 3, 5, 9, 17, 33, 49)
N_BATCH = 512  # the contexts' batch size (the target's and the draft model's)


@contextlib.contextmanager
def torch_sampling_thread():
    """torch runs on one thread in the block (the calling thread's setting, put back after).

    In a llama.cpp reply torch only reads the logits (argmax, top-p over the vocabulary), on the cores
    llama.cpp's threads own. With torch's default OpenMP team its workers spin for a while after an op that
    went parallel (an argmax over several rows does), and the next pass ran on contended cores: on 2 cores a
    one-token pass right after a wide verify pass took 22-24 ms against 15-16 ms."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# The kernel probe's verdict is remembered only for llama.cpp's own decodes (not a test's planted kernel).
_REAL_DECODES = (LlamaCppModel.decode, LlamaCppModel._decode)


class LlamaCppBackend(RoundLoopBackend):
    """The llama.cpp engine. Construct, `load()`, then `generate()` one reply at a time."""

    name = BACKEND_NAME

    def __init__(
        self,
        model_path: str | Path,
        draft: str = "ngram",
        cache_mode: str = "q8",
        draft_cache_mode: str = "q8",
        max_context: int | None = None,
        threads: int | None = None,
        fast_plain: bool = False,
        model_name: str | None = None,
        probe_kernels: bool = True,
        thread_choice: ThreadChoice | None = None,
        rollback: bool | None = None,
    ) -> None:
        self.model_path = Path(model_path).expanduser()
        self.model_name = model_name
        self.draft = str(draft)
        # "auto" is llama.cpp's own default, an f16 cache.
        self.requested_cache_mode = resolve_cache_mode(cache_mode, BACKEND_NAME)
        self.requested_draft_cache_mode = resolve_cache_mode(draft_cache_mode, BACKEND_NAME)
        self.requested_max_context = max_context
        # An explicit count (SPECCHAT_THREADS / config) is used as given: no measuring, no switching.
        self.requested_threads = threads
        # A count another backend measured on this machine (the bench's variants): taken as measured here, with
        # the busy-CPU guard armed as after a measurement, so that both run alike.
        self.adopted_threads = thread_choice
        if thread_choice is not None:
            threads = thread_choice.threads
        self.fast_plain = fast_plain
        self.probe_kernels = probe_kernels
        self.draft_mode: DraftMode = draft_mode_of(self.draft)  # type: ignore[assignment]
        # The model's own MTP head drafts (a second context on the target's model, mtp.py).
        self.use_mtp = self.draft.strip().lower() == "mtp"
        # A recurrent model's native rollback (memory.py): its per-token state snapshots hold 16 more copies of the
        # recurrent state (328 against 19 MiB on a Qwen3.5-0.8B-shaped model; the patch made them free in time), so
        # it is asked for where most rounds draft (a draft model, the MTP head), as llama-server does
        # (common/common.h need_n_rs_seq); n-gram rounds, which draft only where the context repeats, take checkpoints.
        self.rollback = self.draft_mode == "model" if rollback is None else rollback
        self.max_context = max_context or 0
        self.notes: list[str] = []
        # The thread count over the session (the physical cores until load measures, 1 after a stall).
        self.thread_control = ThreadControl(threads or physical_cores(), self.notes)
        self._lock = threading.Lock()
        # Per tuning key (preset): acceptance by draft position and, for n-gram drafts, by match length;
        # learnt across replies.
        self.tuners: dict[str, AdaptiveK] = {}
        self._init_load_state()

    def _init_load_state(self) -> None:
        """What `load()` fills in, as it stands before: nothing loaded, nothing probed or chosen."""
        # Whether plain steps (and one-token prefill slices) need the throw-away position; set at load.
        self.pad_plain_steps = not self.fast_plain
        # The widest verify pass proven to compute its rows as plain steps do (None: not probed); set at load.
        self.max_verify_width: int | None = None
        self.probe: ProbeVerdict | None = None  # the kernel probe's verdict (None: not probed)
        self.shape: ModelShape | None = None  # the loaded model's memory, experts and MTP layers
        self.device = "cpu"
        self.target: LlamaCppModel | None = None
        self.draft_state: LlamaCppModel | None = None
        self.template: ChatTemplate | None = None
        self.stop_token_ids: frozenset[int] = frozenset()
        self.end_of_turn_id: int | None = None
        self._adds_bos = False
        self._lib = None
        # Weight repacking, chosen for this CPU at load (off where llama.cpp's AMX path crashes), per model file.
        self.repack: RepackChoice | None = None
        self.repack_by_file: dict[Path, bool] = {}
        self.draft_file: Path | None = None  # the draft model's GGUF, once resolved
        # Seconds this load spent in trial decodes in a child process (0 when the verdicts were remembered).
        self.trial_seconds = 0.0

    @property
    def threads(self) -> int:
        """The thread count llama.cpp runs with now."""
        return self.thread_control.threads

    def set_threads(self, count: int) -> None:
        """Run the target (and the draft model) with `count` threads from the next decode on."""
        self.thread_control.set_threads(count)

    def context_threads(self) -> int:
        """The thread count the target's llama.cpp context runs with (what llama.cpp itself reports)."""
        return self.thread_control.context_threads()

    # --- loading -------------------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        return BackendInfo(
            backend=self.name,
            model=self.model_name or self.model_path.stem,
            device=self.device,
            cache_mode=self.requested_cache_mode,
            draft_cache_mode=self.requested_draft_cache_mode,
            draft_mode=self.draft_mode,
            draft_model=MTP_LABEL
            if self.use_mtp
            else Path(self.draft).name
            if self.draft_mode == "model"
            else None,
            max_context=self.max_context,
            notes=tuple(self.notes),
        )

    def _cache_type(self, mode: str, who: str) -> int:
        name = CACHE_TYPE_NAMES.get(mode)
        if name is None:
            raise BackendError(f"unknown cache mode {mode!r}: use fp16, q8, q6 or q4")
        if mode == "q6":
            self.notes.append(f"{who} cache: llama.cpp has no 6-bit cache; using q8_0")
        return {
            "f16": self._lib.GGML_TYPE_F16,
            "q8_0": self._lib.GGML_TYPE_Q8_0,
            "q4_0": self._lib.GGML_TYPE_Q4_0,
        }[name]

    def load(self, progress: ProgressCallback | None = None) -> None:
        """Load the model (and the draft model), then prove the kernels, settle the threads and price the passes."""
        report = progress or (lambda stage, fraction: None)
        usable, reason = probe_llamacpp()
        if not usable:
            raise BackendError(f"{reason}; install it (make install) or use --backend transformers")
        import llama_cpp

        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1)  # no C++ chatter on the TUI
        self._lib = llama_cpp
        path = resolve_gguf(self.model_path, "model")
        draft_path = (
            resolve_gguf(self.draft, "draft model")
            if self.draft_mode == "model" and not self.use_mtp
            else None
        )
        self.draft_file = draft_path
        self._plan_loads(path, draft_path, report)
        report("loading model", 0.1)
        llama_cpp.llama_backend_init()
        gpu_layers = 0
        if llama_cpp.llama_supports_gpu_offload():  # Metal, CUDA, ROCm, Vulkan builds
            gpu_layers, self.device = -1, "gpu"
        self._load_target(path, gpu_layers)
        if draft_path is not None:
            self._load_draft(path, draft_path, gpu_layers, report)
        if not self.fast_plain and self.probe_kernels:
            self._apply_probe(report)
        guarded = self._settle_threads(report)
        self._price_passes(report)
        if guarded and self.threads > 1:
            self.thread_control.stall_watch = StallWatch(self.thread_control.predicted_cost())
        report("ready", 1.0)

    def _load_target(self, path: Path, gpu_layers: int) -> None:
        """The target's context at the context the model allows, its MTP head where it drafts, and its text."""
        llama_cpp = self._lib
        repack = self.repack_by_file[path]
        probe = LlamaCppModel(
            llama_cpp, path, 256, self.threads, llama_cpp.GGML_TYPE_F16, 8, gpu_layers, repack
        )
        limit = probe.n_ctx_train or 4096
        probe.close()
        if self.requested_max_context and self.requested_max_context > limit:
            self.notes.append(
                f"max_context {self.requested_max_context} exceeds the model's {limit}; using {limit}"
            )
        self.max_context = min(self.requested_max_context or limit, limit)
        self.target = LlamaCppModel(
            llama_cpp,
            path,
            self.max_context,
            self.threads,
            self._cache_type(self.requested_cache_mode, "target"),
            N_BATCH,
            gpu_layers,
            repack,
            load_mtp=self.use_mtp,
            rollback=self.rollback,
        )
        self.model_path = path
        if self.use_mtp:
            self._attach_mtp(path)
        self.shape = model_shape(llama_cpp, self.target.model, self.target.memory, path)
        if self.shape.memory != "attention" or self.shape.moe:
            self.notes.append(self.shape.describe())
        if self.target.cache_fallback:
            self.notes.append(f"cache: f16 ({self.target.cache_fallback})")
        self._init_text()

    def _load_draft(self, path: Path, draft_path: Path, gpu_layers: int, report) -> None:
        """The draft model's context beside the target's, refused (and everything closed) where its vocabulary
        cannot draft for the target."""
        report("loading draft model", 0.6)
        self.draft_state = LlamaCppModel(
            self._lib,
            draft_path,
            self.max_context,
            self.threads,
            self._cache_type(self.requested_draft_cache_mode, "draft"),
            N_BATCH,
            gpu_layers,
            self.repack_by_file[draft_path],
            rollback=True,  # a hybrid draft model's steps are cropped every round
            pool=self.target.pool,  # one set of workers for both (pool.py)
        )
        if self.draft_state.cache_fallback:
            self.notes.append(f"draft cache: f16 ({self.draft_state.cache_fallback})")
        report("checking draft compatibility", 0.8)
        try:
            check_draft_compatible(
                self._vocab_view(self.target, path), self._vocab_view(self.draft_state, draft_path)
            )
        except BackendError:
            self.close()
            raise

    def _apply_probe(self, report) -> None:
        """The kernel probe's verdict: whether plain steps pad, and how wide a verify pass may be."""
        report("probing kernels", 0.9)
        verdict = self._probe_once()
        self.probe = verdict
        # Padding only keeps plain steps alike with verify passes: where no pass is proven (no drafts at
        # all) plain steps take the one-token path (on a recurrent memory without rollback each padded step
        # would also cost a checkpoint and a replay).
        self.pad_plain_steps = verdict.pad and verdict.widest >= 2
        self.target.pad_single = self.pad_plain_steps
        # Verify passes stay within the widest width proven exact (1: none proven, so no drafts at all).
        self.max_verify_width = max(1, verdict.widest)
        cap = verdict.cap_note()
        if cap is not None and drafts(self.draft_mode):
            self.notes.append(cap)
        if self.pad_plain_steps:
            hint = "" if patched_build() else " (make install builds a llama.cpp where they agree)"
            self.notes.append(
                "llama.cpp's single-token and batched kernels differ for this model: plain steps decode "
                f"two positions so that speculation stays exact{hint}"
            )

    def _settle_threads(self, report) -> bool:
        """The thread count: measured here, adopted from another backend, or as given; its note. True where the
        count was measured or adopted (the busy-CPU guard then watches it)."""
        control = self.thread_control
        control.attach(self._lib, self.target, self.draft_state, self.max_context)
        adopted = self.adopted_threads
        measure = self.requested_threads is None and adopted is None and self.threads > 1
        measure = measure and self.device == "cpu"
        if measure:
            report("measuring threads", 0.92)
            control.adopt_measured(control.measure())
            thread_note = control.thread_choice.note()
        elif adopted is not None:
            control.thread_choice = adopted
            control.set_threads(adopted.threads)
            thread_note = adopted.note()
        else:
            given = " (set in the config)" if self.requested_threads is not None else ""
            thread_note = threads_label(self.threads) + given
        control.thread_note = len(self.notes)
        self.notes.append(thread_note)
        return measure or adopted is not None

    def _price_passes(self, report) -> None:
        """The verify cost model's prior (and the draft's step) where the mode drafts; on the CPU, a pass's cost
        at this thread count and how it grows with the context."""
        control = self.thread_control
        timings = self._timings()
        if drafts(self.draft_mode):
            report("measuring verify cost", 0.95)
            self.target.costs = self._calibrate(timings)
            if self.draft_state is not None:
                self._calibrate_draft(self.target.costs, timings)
        if self.device == "cpu":
            cost = control.pass_cost = control.measure_pass_cost(self._loop_options()["max_draft"], timings)
            control.pass_cost_threads = self.threads
            if self.target.costs is not None and cost.growth:
                # the verify-cost ratios (calibrated over as many cached tokens) read at each pass's context
                self.target.costs.set_context_shape(cost.predict, cost.short_context)

    def _attach_mtp(self, path: Path) -> None:
        """The model's MTP head as the draft (--draft mtp): one line where the GGUF has no MTP layers."""
        try:
            if mtp_layers(self._lib, self.target.model) == 0:
                raise BackendError(
                    f"--draft mtp: {path.name} has no MTP layers (llama_model_n_layer_nextn is 0); "
                    "use --draft ngram or a draft model"
                )
            head = MtpHead(self._lib, self.target, self.threads)
        except BackendError:
            self.close()
            raise
        self.target.mtp = self.draft_state = head

    def _drafter_name(self) -> str:
        return "mtp" if self.use_mtp else self.draft_mode

    def _plan_loads(self, path: Path, draft_path: Path | None, report) -> None:
        """Choose weight repacking for this CPU, and trial-decode each GGUF in a child process where llama.cpp
        could crash on it (first sight of a file/build/CPU only): a crash becomes a note or one BackendError
        line instead of a dead process."""
        self.repack = choose_repack()
        if self.repack.for_amx:
            self.notes.append(self.repack.reason)
        for file, what in ((path, "model"), (draft_path, "draft model")):
            if file is None:
                continue
            report(f"checking that llama.cpp runs the {what} safely", 0.05)
            plan = plan_load(file, self.repack, threads=self.threads, what=what)
            self.repack_by_file[file] = plan.repack
            self.trial_seconds += plan.trial_seconds
            self.notes.extend(plan.notes)

    def _calibrate(self, timings: PassTimings) -> VerifyCostModel:
        """Best-of timings of CALIBRATION_WIDTHS passes (those the loop may send) over 64 cached tokens: the prior
        of the cost model."""
        widest = self._loop_options()["max_draft"] + 1
        widths = [w for w in CALIBRATION_WIDTHS if w <= widest]
        return VerifyCostModel.from_samples(timings.passes(self.target, widths, 64))

    def _calibrate_draft(self, costs: VerifyCostModel, timings: PassTimings) -> None:
        """Time the draft's one-token step on a short context (best of a few) into `costs`."""
        # An MTP head follows the target's decodes: its cache is filled by the target's prefill.
        feeder = self.target if self.use_mtp else self.draft_state
        draft = self.draft_state
        who = "mtp"  # else the draft's file and build as the crash trials name them (kept on disk)
        if not self.use_mtp and self.draft_file is not None:
            who = f"{trial_key(self.draft_file, draft.repack)}|{self.requested_draft_cache_mode}"
        costs.observe_draft(timings.draft_step(who, draft, feeder))

    def _timings(self) -> PassTimings:
        """This model's pass timings as loaded, kept in the process and on disk (pass_timings.py); unshared where
        the target's decode is not llama.cpp's own (a test's planted kernel)."""
        target = self.target
        if not self._decodes_are_llamas_own():
            return PassTimings.kept(None)
        memory = target.memory
        key = "|".join(
            map(
                str,
                (
                    trial_key(self.model_path, target.repack),
                    self.device,
                    self._cache_type_name(),
                    self.threads,
                    self.max_context,
                    target.pad_single,
                    memory.depth if memory is not None else "-",
                    target.mtp is not None,
                ),
            )
        )
        return PassTimings.kept(key)

    def _decodes_are_llamas_own(self) -> bool:
        """False where a test planted another kernel on the target (its class or the object itself): what it
        measures or proves is not the model's, so it is neither remembered nor read back."""
        target = self.target
        planted = (type(target).decode, type(target)._decode) != _REAL_DECODES
        return not planted and not {"decode", "_decode"} & vars(target).keys()

    def _cache_type_name(self) -> str:
        """The target's K/V cache type as llama.cpp made it (f16 where the asked type could not be made)."""
        return "f16" if self.target.cache_fallback else CACHE_TYPE_NAMES[self.requested_cache_mode]

    def _kernels_agree(self) -> bool:
        """Do one-token decodes equal the rows of every pass width the loop sends, bit for bit?"""
        verdict = self._probe()
        return not verdict.pad and verdict.widest >= verdict.checked

    def _probe(self) -> ProbeVerdict:
        """The kernel probe's verdict on the target (engine/backends/llamacpp/probe.py)."""
        return probe_widths(self.target, self.encode_text, self.max_context)

    def _probe_once(self) -> ProbeVerdict:
        """The probe's verdict, remembered per file, build, CPU and context settings: measured on the first load
        only. Not where the target's decode is not llama.cpp's own (a test that plants another kernel)."""
        if not self._decodes_are_llamas_own():
            return self._probe()
        key, verdict = llamacpp_probe.recall_for(
            self.model_path,
            self.target.repack,
            cache_type=self._cache_type_name(),
            threads=self.threads,
            max_context=self.max_context,
            thread_free=llamacpp_probe.thread_free_build(patched_build()),
        )
        if verdict is None:
            verdict = self._probe()
            llamacpp_probe.remember(key, verdict)
        return verdict

    def _vocab_view(self, state: LlamaCppModel, path: Path) -> VocabView:
        eot = self.template.end_of_turn if self.template else None
        eot_id = state.single_token_id(eot) if eot else None
        return VocabView(
            name=path.name,
            tokenizer_size=state.n_vocab,
            special_ids=state.special_ids(eot_id),
            tokenizer=GgufTokenizer(self._lib, state.model.vocab, state.n_vocab),
        )

    def _init_text(self) -> None:
        target = self.target
        metadata = target.model.metadata()
        source = metadata.get("tokenizer.chat_template") or ""
        if not source:
            self.notes.append(FALLBACK_NOTE)
        text = source or FALLBACK_TEMPLATE
        self.template = ChatTemplate(
            source=text,
            bos_token=target.token_text(target.model.token_bos()),
            eos_token=target.token_text(target.model.token_eos()),
            end_of_turn=next((c for c in END_OF_TURN_CANDIDATES if c in text), None),
            from_model=bool(source),
        )
        ids = {t for t in (target.model.token_eos(), target.model.token_eot()) if t is not None and t >= 0}
        for text_token in self.template.stop_strings():
            token = target.single_token_id(text_token)
            if token is not None:
                ids.add(token)
        self.stop_token_ids = frozenset(ids)
        eot = self.template.end_of_turn
        self.end_of_turn_id = target.single_token_id(eot) if eot else None
        self._adds_bos = bool(target.model.add_bos_token()) and target.model.token_bos() >= 0

    def _require_loaded(self) -> None:
        if self.target is None or self.template is None:
            raise BackendError("the model is not loaded yet")

    # --- text ----------------------------------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Tokenize `text` (special tokens spelled in it are parsed), with a BOS where the model wants one."""
        self._require_loaded()
        model = self.target.model
        ids = model.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        bos = model.token_bos()
        if self._adds_bos and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, token_ids: list[int]) -> str:
        self._require_loaded()
        return b"".join(self._piece_exact(t) for t in token_ids).decode("utf-8", "replace")

    def _piece_exact(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        n = self._lib.llama_token_to_piece(self.target.model.vocab, token, buffer, 64, 0, False)
        if n < 0:  # a longer piece than the buffer: ask again with the size it needs
            buffer = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self.target.model.vocab, token, buffer, -n, 0, False)
        return buffer.raw[: max(0, n)]

    # --- generation ----------------------------------------------------------------------------------------

    def _loop_options(self) -> dict:
        return {
            "vocab_size": self.target.n_vocab,
            "new_text": lambda: ByteDetokenizer(self._piece_exact),
            # The batch holds the last token, the drafts and (plain steps) one throw-away position.
            "max_draft": min(self.target.n_batch - 2, (self.max_verify_width or self.target.n_batch) - 1),
            "cap_note": self.probe.cap_note() if self.probe is not None else None,
        }

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Chunk | Done]:
        with torch_sampling_thread():
            yield from super().generate(request, cancel)

    def _prepare_setup(self, setup: LoopSetup) -> None:
        # Per reply, a watch that only speaks: where the thread count cannot drop (one thread already, or a count
        # set in the config), a busy CPU is said under the reply instead of leaving a slow reply unexplained.
        control = self.thread_control
        control.recheck_threads(setup.notes)
        busy = StallWatch(control.predicted_cost())
        setup.on_round = lambda seconds, width: control.on_round(seconds, width, setup.notes, busy)

    def close(self) -> None:
        for state in (self.draft_state, self.target):
            if state is not None:
                state.close()
        self.target = None
        self.draft_state = None


def build(args: EngineArgs) -> LlamaCppBackend:
    """The registry's constructor: the model's GGUF (the embedded model's own where `args.model` is None)."""
    if args.model is None:
        from engine.models import EMBEDDED_MODEL_NAME, ensure_embedded_gguf

        path, name = ensure_embedded_gguf(), EMBEDDED_MODEL_NAME
    else:
        path, name = Path(args.model), None
    return LlamaCppBackend(
        path,
        draft=args.draft,
        cache_mode=args.cache_mode,
        draft_cache_mode=args.draft_cache_mode,
        max_context=args.max_context,
        threads=args.threads,
        model_name=name,
    )
