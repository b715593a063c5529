"""transformers + torch backend: runs anywhere (CPU by default), with exact speculative decoding.

The round loop is `engine.decoding.round_loop` (shared with llama.cpp): a drafter (n-gram lookup, a draft model, or none)
proposes k tokens; the target scores the last token plus the k drafts in one forward pass over its KV cache
(`ModelState.score`) and samples every position with the message's own sampler; drafts are accepted while they
equal the target's sample, the first mismatch ends the round with the target's token. This module supplies the
models, their caches (`cache.py`) and the row-invariant kernels (`kernels.py`, `rowlin.py`) that make a verify
pass give each row the bits a one-row step gives.

Sampling uses one uniform number per reply position, drawn up front from a generator seeded by the request,
and inverse-CDF sampling. A token's value therefore depends only on its position and the tokens before it, not
on how rounds were cut: with a seed, speculative and plain decoding give the same tokens at any temperature.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.backends.base import EngineArgs, ProgressCallback
from engine.backends.registry import resolve_cache_mode
from engine.backends.transformers import kernels as hf_kernels
from engine.backends.transformers.cache import SpecCache
from engine.chat_template import FALLBACK_NOTE, ChatTemplate, ChatTemplateError
from engine.decoding.adaptive_k import AdaptiveK
from engine.decoding.cost_model import MAX_DRAFT_LENGTH, VerifyCostModel
from engine.decoding.draft_compat import VocabView, check_draft_compatible, special_token_ids
from engine.decoding.drafters import draft_mode_of, drafts
from engine.decoding.round_loop import RoundLoopBackend, common_prefix
from engine.errors import BackendError, first_line
from engine.events import BackendInfo, DraftMode
from engine.models.folders import FolderNeeds, check_model_folder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
FOLDER_NEEDS = FolderNeeds(
    tokenizers=TOKENIZER_FILES, weights=WEIGHT_PATTERNS
)  # what the one folder check asks
# Long prompts are prefilled in slices so attention scratch memory stays bounded.
PREFILL_SLICE = 512
# Caches this backend implements; q6/q4 have no kernel here and fall back to q8.
NATIVE_CACHE_MODES = ("fp16", "q8")
# The widest verify pass timed at load (K 8); wider ones are extrapolated, and every real pass refines the curve.
CALIBRATION_WIDTH = 9


class IncrementalDetokenizer:
    """Text deltas of a growing token list, decoding only a short window per round (not the whole reply).

    The window starts a few tokens back, so a tokenizer that spells a token differently at the start of a text
    (a leading space) is decoded in context; text that ends in half a multi-byte character (U+FFFD) is held
    until its other bytes arrive.
    """

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode
        self.tokens: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens before this are already in the text sent

    def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        self.tokens.extend(token_ids)
        window = self.tokens[self.prefix_offset :]
        sent = self.decode(self.tokens[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        text = self.decode(window, skip_special_tokens=True)
        if not final and text.endswith("\ufffd"):
            return ""
        if len(text) <= len(sent) or not text.startswith(sent):
            # nothing new, or the window re-spelled what was sent: send only what is past the shared part
            shared = common_prefix(sent, text)
            delta = text[shared:] if len(text) > shared else ""
        else:
            delta = text[len(sent) :]
        # Keep the window short: the next one starts at the tokens just sent (a few back for context).
        self.prefix_offset = max(self.read_offset - 4, 0) if delta else self.prefix_offset
        self.read_offset = len(self.tokens) if delta or final else self.read_offset
        return delta


# --- model state -------------------------------------------------------------------------------------------


@dataclass
class ModelState:
    """A loaded model with its KV cache and the token ids whose keys/values the cache holds."""

    model: torch.nn.Module
    cache_mode: str
    cache_kwarg: str
    keeps_logits: bool
    device: str
    cache: object = None
    ids: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    # Row-invariant kernels (hf_kernels): None where unavailable. `invariant` runs every pass packed; otherwise
    # one-row passes take the stock kernels (faster) and only multi-row passes the packed ones.
    switch: hf_kernels.KernelSwitch | None = None
    invariant: bool = False
    # Measured forward cost by pass width (target only), for the drafter's cost model.
    costs: VerifyCostModel | None = None
    # Attention reads the cache buffers itself (rowlin.c): row-invariant in one call per layer, and under q8
    # straight from the int8 bytes, not a dequantized copy of the whole history.
    fused_attention: bool = False
    # False where the cache cannot drop a tail (transformers' own cache for some architectures): crop re-prefills
    # and the round loop does not draft (every rejected draft would cost a prefill).
    can_crop: bool = True

    def new_cache(self) -> None:
        if self.cache_mode in NATIVE_CACHE_MODES:
            self.cache = SpecCache(self.cache_mode, fused=self.fused_attention)
        else:  # an architecture our layers do not fit: transformers' own croppable cache
            from transformers import DynamicCache

            self.cache = DynamicCache(config=self.model.config)
        self.ids = []

    def crop(self, length: int) -> None:
        """Keep exactly the first `length` cached positions. transformers' own cache (an architecture ours do
        not fit) may refuse to drop a tail (a sliding or recurrent layer past its window): then the prefix is
        decoded again into a new cache (exact, at the cost of a prefill), and `can_crop` turns False."""
        if length >= len(self.ids):
            return
        if isinstance(self.cache, SpecCache):
            self.cache.crop_to(length)
            del self.ids[length:]
            return
        try:
            self.cache.crop(length - self.cache.get_seq_length())
        except (RuntimeError, ValueError, NotImplementedError, AttributeError):
            kept = self.ids[:length]
            self.can_crop = False
            self.new_cache()
            self.prefill(kept)
            return
        del self.ids[length:]

    # Inference mode per call, not around the whole generator: it is thread-local, and a generator may be
    # resumed from another thread than the one that started it.
    @torch.inference_mode()
    def forward(self, ids: Sequence[int], keep: int, timed: bool = False) -> torch.Tensor:
        """Run `ids` through the model on top of the cache; the logits of the last `keep` positions."""
        start = time.perf_counter()
        if self.switch is not None:
            self.switch.packed = self.invariant or len(ids) > 1
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        kwargs = {self.cache_kwarg: self.cache, "use_cache": True}
        if self.keeps_logits:
            kwargs["logits_to_keep"] = keep
        try:
            out = self.model(input_ids=x, **kwargs)
        except BaseException:
            self.new_cache()  # a half-updated cache is worse than none
            raise
        self.ids.extend(ids)
        logits = out.logits[0, -keep:]
        if timed:
            elapsed = time.perf_counter() - start
            self.step_times.append(elapsed)
            if self.costs is not None:
                self.costs.observe(len(ids), elapsed)
        return logits

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """The round loop's verify pass: logits of every row of `tokens`, timed."""
        return self.forward(tokens, keep=len(tokens), timed=True)

    def next_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """A draft step: the logits after the last of `tokens`, timed."""
        return self.forward(tokens, keep=1, timed=True)[-1]

    def prefill(self, ids: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Bring the cache to `ids`, reusing the longest common prefix; returns the reused length.

        A set `cancel` stops between slices (the cache then holds a prefix of `ids`, which the next call reuses).
        """
        reused = common_prefix(self.ids, ids)
        self.crop(reused)
        for start in range(reused, len(ids), PREFILL_SLICE):
            if cancel is not None and cancel.is_set():
                break
            self.forward(ids[start : start + PREFILL_SLICE], keep=1)
        return reused

    @torch.inference_mode()
    def calibrate_step(self, costs: VerifyCostModel, vocab_size: int) -> None:
        """Time this (draft) model's one-token step on a short context, best of a few, into `costs`."""
        filler = [(7 + 13 * i) % max(vocab_size - 1, 1) + 1 for i in range(65)]
        self.new_cache()
        self.forward(filler[:64], keep=1)
        best = float("inf")
        for _ in range(4):
            start = time.perf_counter()
            self.forward(filler[64:65], keep=1)
            best = min(best, time.perf_counter() - start)
            self.crop(64)
        self.new_cache()
        costs.observe_draft(best)

    @torch.inference_mode()
    def calibrate(self, max_width: int, vocab_size: int) -> VerifyCostModel:
        """Time forward passes of 1..max_width tokens on a short context: the prior of the cost model."""
        widths = sorted({1, 2, 3, 4, max(2, max_width // 2), max_width})
        filler = [(7 + 13 * i) % max(vocab_size - 1, 1) + 1 for i in range(64 + max_width)]
        self.new_cache()
        self.forward(filler[:64], keep=1)
        best: dict[int, float] = {}
        for _ in range(4):
            for width in widths:
                start = time.perf_counter()
                self.forward(filler[64 : 64 + width], keep=width)
                best[width] = min(best.get(width, float("inf")), time.perf_counter() - start)
                self.crop(64)
        self.new_cache()
        return VerifyCostModel.from_samples(best)


def _model_call_options(model: torch.nn.Module) -> tuple[str, bool]:
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "cache" if "cache" in params else "past_key_values"
    return cache_kwarg, "logits_to_keep" in params


def _cache_mode_for(config, requested: str, who: str, notes: list[str]) -> str:
    layer_types = getattr(config.get_text_config(decoder=True), "layer_types", None) or []
    # Sliding-window layers fit our caches: they keep the whole history (so a rejected draft can be cropped at
    # any length) and the attention applies the window.
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        notes.append(
            f"{who} cache: {requested} not available for this architecture; transformers' cache used"
        )
        return "dynamic"
    if requested in NATIVE_CACHE_MODES:
        return requested
    notes.append(f"{who} cache: {requested} is not implemented by the transformers backend; using q8")
    return "q8"


DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _shown_mode(mode: str, dtype: torch.dtype) -> str:
    """What the cache really stores: the full-precision caches hold the model's dtype (fp32 on the CPU)."""
    return mode if mode == "q8" else DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _eos_ids(*values) -> set[int]:
    ids: set[int] = set()
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return ids


class TransformersBackend(RoundLoopBackend):
    """The transformers/torch engine. Construct, `load()`, then `generate()` one reply at a time."""

    name = "transformers"

    def __init__(
        self,
        model_dir: str | Path,
        draft: str = "ngram",
        cache_mode: str = "auto",
        draft_cache_mode: str = "auto",
        max_context: int | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        threads: int | None = None,
        kernels: str = "auto",
    ) -> None:
        """`kernels`: "auto" (row-invariant for multi-row passes; for every pass under q8, where an int8
        rounding would amplify a last-bit difference), "invariant", "hybrid", or "stock" (transformers' own)."""
        if kernels not in ("auto", "invariant", "hybrid", "stock"):
            raise ValueError(f"kernels: unknown choice {kernels!r}")
        cache_mode = resolve_cache_mode(cache_mode, self.name)
        draft_cache_mode = resolve_cache_mode(draft_cache_mode, self.name)
        self.kernels = kernels
        self.model_dir = Path(model_dir).expanduser()
        self.draft = str(draft)
        self.requested_cache_mode = cache_mode
        self.requested_draft_cache_mode = draft_cache_mode
        self.requested_max_context = max_context
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.draft_mode: DraftMode = draft_mode_of(self.draft)  # type: ignore[assignment]
        self.model = None
        self.tokenizer = None
        self.template: ChatTemplate | None = None
        self.target: ModelState | None = None
        self.draft_state: ModelState | None = None
        self.stop_token_ids: frozenset[int] = frozenset()
        self.end_of_turn_id: int | None = None
        self.max_context = max_context or 0
        self.vocab_size = 0
        self.notes: list[str] = []
        # Per tuning key (preset): acceptance by draft position and, for n-gram drafts, by match length;
        # learnt across replies, so the second reply of a kind starts informed.
        self.tuners: dict[str, AdaptiveK] = {}
        self._adds_bos = False
        self._lock = threading.Lock()

    # --- loading -------------------------------------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        return BackendInfo(
            backend=self.name,
            model=self.model_dir.name,
            device=self.device,
            cache_mode=_shown_mode(self.target.cache_mode, self.dtype)
            if self.target
            else self.requested_cache_mode,
            draft_cache_mode=_shown_mode(self.draft_state.cache_mode, self.dtype)
            if self.draft_state
            else self.requested_draft_cache_mode,
            draft_mode=self.draft_mode,
            draft_model=Path(self.draft).name if self.draft_mode == "model" else None,
            max_context=self.max_context,
            notes=tuple(self.notes),
        )

    def load(self, progress: ProgressCallback | None = None) -> None:
        report = progress or (lambda stage, fraction: None)
        check_model_folder(self.model_dir, "model", FOLDER_NEEDS, BackendError)
        draft_dir = Path(self.draft).expanduser() if self.draft_mode == "model" else None
        if draft_dir is not None:
            check_model_folder(draft_dir, "draft model", FOLDER_NEEDS, BackendError)
        if self.threads:
            torch.set_num_threads(self.threads)
        from transformers.utils import logging as hf_logging

        bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            report("loading tokenizer", 0.0)
            self.tokenizer = self._load_tokenizer(self.model_dir, "model")
            try:
                self.template = ChatTemplate.from_folder(self.model_dir)
            except ChatTemplateError as exc:
                raise BackendError(str(exc)) from exc
            if not self.template.from_model:
                self.notes.append(FALLBACK_NOTE)
            report("loading model", 0.1)
            self.model = self._load_model(self.model_dir, "model")
            self.target = self._state(self.model, self.requested_cache_mode, "target")
            self._install_kernels(self.target)
            if draft_dir is not None:
                report("loading draft model", 0.6)
                draft_tokenizer = self._load_tokenizer(draft_dir, "draft model")
                draft_template = ChatTemplate.from_folder(draft_dir)
                report("checking draft compatibility", 0.7)
                check_draft_compatible(
                    self._vocab_view(self.model_dir, self.tokenizer, self.template),
                    self._vocab_view(draft_dir, draft_tokenizer, draft_template),
                )
                draft_model = self._load_model(draft_dir, "draft model")
                self.draft_state = self._state(draft_model, self.requested_draft_cache_mode, "draft")
        finally:
            if bars_were_on:
                hf_logging.enable_progress_bar()
        config = self.model.config.get_text_config(decoder=True)
        self.vocab_size = int(config.vocab_size)
        limit = int(getattr(config, "max_position_embeddings", 0) or 0) or 4096
        if self.requested_max_context and self.requested_max_context > limit:
            self.notes.append(
                f"max_context {self.requested_max_context} exceeds the model's {limit}; using {limit}"
            )
        self.max_context = min(self.requested_max_context or limit, limit)
        self._init_stop_tokens()
        if drafts(self.draft_mode):
            report("measuring verify cost", 0.9)
            self.target.costs = self.target.calibrate(CALIBRATION_WIDTH, self.vocab_size)
            if self.draft_state is not None:
                self.draft_state.calibrate_step(self.target.costs, self.vocab_size)
        probe = self.tokenizer.encode("a")
        bos = self.tokenizer.bos_token_id
        self._adds_bos = bos is not None and bool(probe) and probe[0] == bos
        report("ready", 1.0)

    def _load_tokenizer(self, folder: Path, what: str):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(folder)
        except Exception as exc:  # transformers raises many types; the user needs one line
            raise BackendError(
                f"could not load the {what}'s tokenizer from {folder}: {first_line(exc)}"
            ) from exc

    def _load_model(self, folder: Path, what: str) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        except Exception as exc:
            raise BackendError(f"could not load the {what} from {folder}: {first_line(exc)}") from exc
        return model.to(self.device).eval()

    def _install_kernels(self, state: ModelState) -> None:
        """Row-invariant kernels for the target (the draft's output needs no exactness: it only proposes)."""
        if self.kernels == "stock" or state.cache_mode == "dynamic":
            return
        switch, note = hf_kernels.install(state.model, self.device, keep_stock=self.kernels == "hybrid")
        if note:
            self.notes.append(note)
        state.switch = switch
        if switch is not None and switch.kind == "rowlin":
            state.fused_attention = hf_kernels.fused_attention_fits(state.model.config)
            state.new_cache()
        # rowlin is as fast as the stock kernels for one row, so "auto" runs every pass on it (bit-exact); the
        # oneDNN fallback is slower for one row, so "auto" runs it for every pass only under q8.
        state.invariant = self.kernels == "invariant" or (
            self.kernels == "auto"
            and switch is not None
            and (state.cache_mode == "q8" or switch.kind == "rowlin")
        )

    def _state(self, model: torch.nn.Module, requested: str, who: str) -> ModelState:
        mode = _cache_mode_for(model.config, requested, who, self.notes)
        cache_kwarg, keeps_logits = _model_call_options(model)
        state = ModelState(model, mode, cache_kwarg, keeps_logits, self.device)
        # transformers' own cache for an architecture ours do not fit: assume it cannot drop a tail
        state.can_crop = mode != "dynamic"
        state.new_cache()
        return state

    @staticmethod
    def _vocab_view(folder: Path, tokenizer, template: ChatTemplate) -> VocabView:
        return VocabView(
            name=folder.name,
            tokenizer_size=len(tokenizer),
            special_ids=special_token_ids(tokenizer, template.end_of_turn),
            tokenizer=tokenizer,
        )

    def _init_stop_tokens(self) -> None:
        generation_config = getattr(self.model, "generation_config", None)
        ids = _eos_ids(
            getattr(self.model.config, "eos_token_id", None),
            getattr(generation_config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        )
        unk = self.tokenizer.unk_token_id
        for text in self.template.stop_strings():
            token_id = self.tokenizer.convert_tokens_to_ids(text)
            if isinstance(token_id, int) and token_id != unk:
                ids.add(token_id)
        self.stop_token_ids = frozenset(ids)
        if self.template.end_of_turn:
            token_id = self.tokenizer.convert_tokens_to_ids(self.template.end_of_turn)
            self.end_of_turn_id = token_id if isinstance(token_id, int) and token_id != unk else None

    def _require_loaded(self) -> None:
        if self.target is None or self.tokenizer is None:
            raise BackendError("the model is not loaded yet")

    # --- text ----------------------------------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Tokenize rendered chat text, with a BOS where the model wants one."""
        self._require_loaded()
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        # The template usually writes the BOS itself; add it only where the tokenizer would and it did not.
        bos = self.tokenizer.bos_token_id
        if self._adds_bos and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, token_ids: list[int]) -> str:
        self._require_loaded()
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # --- generation ----------------------------------------------------------------------------------------

    def _loop_options(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "new_text": lambda: IncrementalDetokenizer(self.tokenizer),
            "max_draft": MAX_DRAFT_LENGTH,
        }

    def close(self) -> None:
        self.model = None
        self.target = None
        self.draft_state = None


def build(args: EngineArgs) -> TransformersBackend:
    """The registry's constructor: a Hugging Face folder (the embedded model's converted one where `args.model` is
    None), on `args.device` where one is set (else the CPU)."""
    from engine.models import ensure_embedded_model

    extra = {"device": args.device} if args.device and args.device != "auto" else {}
    return TransformersBackend(
        args.model if args.model is not None else ensure_embedded_model(),
        draft=args.draft,
        cache_mode=resolve_cache_mode(args.cache_mode, "transformers"),
        draft_cache_mode=resolve_cache_mode(args.draft_cache_mode, "transformers"),
        max_context=args.max_context,
        **extra,
    )
