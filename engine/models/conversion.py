"""The embedded model's GGUF as an ordinary Hugging Face folder (config, float16 safetensors, tokenizer, chat
template), written once so that every backend can load it. torch and transformers are imported only here, and
only when converting."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.models.cache import ModelError, ProgressCallback

# The dequantized Q4_1 weights are fp16 scales times 4-bit integers: float16 holds them far more faithfully
# than bfloat16 and halves the disk size of float32.
EMBEDDED_STORAGE_DTYPE = "float16"


def convert_gguf(gguf: Path, out_dir: Path, progress: ProgressCallback) -> None:
    """Turn a GGUF file into a Hugging Face folder (config, float16 safetensors, tokenizer, chat template)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    progress("converting", 0.0)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress("converting", 0.3)
        with _gguf_tensor_progress(lambda done: progress("converting", 0.3 + 0.7 * done)):
            # transformers dequantizes GGUF on load; model.save_pretrained refuses such models, so the state
            # dict is written with safetensors directly below.
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    progress("converting", 1.0)

    progress("writing", 0.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    storage_dtype = getattr(torch, EMBEDDED_STORAGE_DTYPE)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        # lm_head shares the embedding's storage; safetensors refuses shared tensors, and it would double
        # the file. Loading re-ties it from the config.
        state.pop("lm_head.weight", None)
    tensors = {name: tensor.detach().to(storage_dtype).contiguous() for name, tensor in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    progress("writing", 0.6)

    model.config.dtype = EMBEDDED_STORAGE_DTYPE
    # A GGUF-loaded config has no "architectures"; ExLlamaV2 (and model_info) pick the architecture from it.
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out_dir)
    _finish_config(out_dir / "config.json")
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.save_pretrained(out_dir)
    progress("writing", 0.8)

    tokenizer.save_pretrained(out_dir)
    _finish_tokenizer_config(out_dir, tokenizer.chat_template, model.config.max_position_embeddings)
    progress("writing", 1.0)


@contextlib.contextmanager
def _gguf_tensor_progress(report: Callable[[float], None]) -> Iterator[None]:
    """Route transformers' per-tensor GGUF progress bar into our callback instead of a tqdm bar on stderr.

    transformers iterates the GGUF tensors through a module-level `tqdm` that ignores its own progress-bar
    switch; swapping that name for the load's duration silences the bar and gives us real fractions. If a
    future transformers renames it, the load still works, only with its own bar.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def reporting_iterator(iterable: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(iterable)
        for index, item in enumerate(items):
            yield item
            if index % 16 == 15 or index == len(items) - 1:
                report((index + 1) / len(items))

    gguf_utils.tqdm = reporting_iterator
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _finish_config(config_path: Path) -> None:
    """Make config.json describe plain float weights, in a form transformers 4/5 and ExLlamaV2 all read."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # transformers records how it read the GGUF; the saved weights are plain floats, and the leftover key
    # would make loaders look for a GGUF file.
    config.pop("quantization_config", None)
    # transformers 5 nests rope_theta in rope_parameters; ExLlamaV2 and transformers 4 read the top-level key
    # and would silently fall back to 10000 (SmolLM2 uses 100000), garbling every reply.
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _finish_tokenizer_config(out_dir: Path, template: str | None, max_positions: int) -> None:
    """Make tokenizer_config.json self-contained and readable by transformers 4 and 5 alike."""
    # transformers 5 writes the template to chat_template.jinja only; older readers (and our own
    # ChatTemplate) look in tokenizer_config.json, so it goes in both.
    jinja_file = out_dir / "chat_template.jinja"
    if not template and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    if not template:
        raise ModelError("The embedded model's GGUF carries no chat template")
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    config["chat_template"] = template
    # "TokenizersBackend" exists only in transformers 5, where "PreTrainedTokenizerFast" names the same class.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = max_positions  # the GGUF leaves transformers' "unlimited" sentinel
    for load_time_key in ("is_local", "local_files_only"):
        config.pop(load_time_key, None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
