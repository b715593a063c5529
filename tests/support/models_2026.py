"""Tiny random models of the architectures of 2026, built from transformers' own classes and converted to GGUF
with the converter of the llama.cpp tree specchat builds (the vendored one in llama-cpp-python's sdist: the PyPI
`gguf` lacks Qwen3.5's tensors), then quantized with `llama_model_quantize` where a test asks for Q4_K_M.

- "qwen35": Qwen3.5 (Gated DeltaNet layers beside attention; llama.cpp rolls its recurrent state back natively
  with `n_rs_seq`); "qwen35mtp" the same with one MTP layer (random `mtp.*` tensors added to the safetensors, which
  transformers drops, and `mtp_num_hidden_layers` in the config); "qwen35moemtp" Qwen3.5's mixture of experts
  (4 experts, top 2, a shared expert) with one MTP layer.
- "qwen3next": Qwen3-Next (the same kind of layers; llama.cpp has no native rollback for it: checkpoints).
- "qwen3moe": Qwen3-MoE (dense attention, 8 experts, top 2).
- "gptoss": gpt-oss (attention sinks, sliding-window layers beside full ones, 4 experts top 2, experts in
  float16 where the released files hold MXFP4: the converter takes either).
- "olmoe": OLMoE (dense attention with QK norms, 8 experts, top 2; at the "olmoe-1b-7b" shape OLMoE-1B-7B's 64
  experts, top 8: a mixture of experts at a real model's shape, for timing).

SmolLM2's tokenizer (the embedded model's) and vocabulary, so the converter knows the pre-tokenizer and the chat
template is ChatML. Hidden and expert sizes are multiples of 256, so a Q4_K_M file really holds K-quants. The GGUFs
are cached per (kind, seed, builder version) in specchat's cache folder, like the other models the tests fetch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from engine.paths import cache_dir
from tests.support.tiny_models import TOKENIZER_FILE_NAMES

LLAMA_CPP_PY_VERSION = os.environ.get("LLAMA_CPP_PY_VERSION", "0.3.36")
# Bumped when what the builders make changes (the cached GGUFs are then built again).
BUILDER_VERSION = 1
KINDS = ("qwen35", "qwen35mtp", "qwen35moemtp", "qwen3next", "qwen3moe", "gptoss", "olmoe")
# Wide enough logits that greedy decoding has no near-ties (a random model's argmax is then stable).
INIT_RANGE = 0.2
# Real models' shapes, for timing (a verify pass costs the same whatever the weights hold): the config fields that
# differ from the tiny defaults. Qwen3.5-0.8B's (SmolLM2's vocabulary in place of its 248k tokens).
SHAPES = {
    "tiny": {},
    "qwen3.5-0.8b": dict(
        hidden_size=1024,
        intermediate_size=3584,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        num_hidden_layers=24,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
        initializer_range=0.02,
    ),
    # OLMoE-1B-7B's (allenai/OLMoE-1B-7B-0924: 6.9B parameters, 1.3B active; SmolLM2's vocabulary in place of
    # its 50k tokens). Built in bfloat16: float32 would not fit beside the converter in 24 GB.
    "olmoe-1b-7b": dict(
        hidden_size=2048,
        intermediate_size=1024,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=128,
        num_hidden_layers=16,
        num_experts=64,
        num_experts_per_tok=8,
        initializer_range=0.02,
    ),
}
# The kinds each real shape is built for.
SHAPE_KINDS = {"qwen3.5-0.8b": ("qwen35", "qwen35mtp"), "olmoe-1b-7b": ("olmoe",)}


def converter_dir() -> Path:
    """The vendored llama.cpp tree's converter (convert_hf_to_gguf.py, conversion/, gguf-py/), extracted once from
    the llama-cpp-python sdist (pip's cache first) into specchat's cache folder."""
    dest = cache_dir() / f"llama.cpp-{LLAMA_CPP_PY_VERSION}-convert"
    if (dest / "convert_hf_to_gguf.py").is_file():
        return dest
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            + [f"llama-cpp-python=={LLAMA_CPP_PY_VERSION}", "-d", work],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"pip could not fetch the llama-cpp-python sdist: {done.stderr.strip()[-300:]}"
            )
        sdist = next(Path(work).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{LLAMA_CPP_PY_VERSION}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
        staging = Path(work) / "out"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                name = member.name[len(prefix) :] if member.name.startswith(prefix) else None
                if name and name.startswith(wanted) and member.isfile():
                    target = staging / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.extractfile(member) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(staging, partial)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(partial, dest)
    return dest


def _config(kind: str, vocab_size: int, shape: str = "tiny"):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=4096,
        initializer_range=INIT_RANGE,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if kind in ("qwen35", "qwen35mtp", "qwen35moemtp", "qwen3next"):
        linear = dict(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
        )
        if kind in ("qwen35", "qwen35mtp"):
            from transformers import Qwen3_5TextConfig as Config

            fields = {**common, **linear, **SHAPES[shape]}
            return Config(**fields, architectures=["Qwen3_5ForCausalLM"])
        if kind == "qwen35moemtp":
            from transformers import Qwen3_5MoeTextConfig as Config

            return Config(
                **common,
                **linear,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=256,
                shared_expert_intermediate_size=256,
                architectures=["Qwen3_5MoeForCausalLM"],
            )
        from transformers import Qwen3NextConfig as Config

        return Config(
            **common,
            **linear,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=256,
            decoder_sparse_step=1,
            architectures=["Qwen3NextForCausalLM"],
        )
    if kind == "gptoss":
        from transformers import GptOssConfig

        fields = {**common, "head_dim": 64, "num_attention_heads": 4, "intermediate_size": 256}
        return GptOssConfig(
            **fields,
            num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            architectures=["GptOssForCausalLM"],
        )
    if kind == "olmoe":
        from transformers import OlmoeConfig

        # llama.cpp's OLMoE norms the keys over the whole width (attn_k_norm of n_embd): no grouped KV heads.
        fields = {
            **common,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            **SHAPES[shape],
        }
        return OlmoeConfig(**fields, architectures=["OlmoeForCausalLM"])
    from transformers import Qwen3MoeConfig as Config

    return Config(
        **common,
        num_hidden_layers=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        decoder_sparse_step=1,
        architectures=["Qwen3MoeForCausalLM"],
    )


def build_hf(kind: str, folder: Path, tokenizer_dir: Path, seed: int = 2026, shape: str = "tiny") -> Path:
    """Save a random model of `kind` at `shape` (safetensors, SmolLM2's tokenizer files) into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    config = _config(kind, vocab, shape)
    torch.manual_seed(seed)
    # OLMoE-1B-7B's shape is built in bfloat16: float32 (28 GB) would not fit in 24 GB; the weights' values are random
    # either way, and a pass costs the same whatever they are.
    dtype = torch.bfloat16 if shape == "olmoe-1b-7b" else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    for name in TOKENIZER_FILE_NAMES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)
    if kind in ("qwen35mtp", "qwen35moemtp"):
        _add_mtp_layer(folder, config, seed)
    return folder


def _add_mtp_layer(folder: Path, config, seed: int) -> None:
    """One MTP layer as Qwen3.5 ships it (`mtp.fc`, the two pre-fc norms, a full-attention decoder layer, its
    norm), random, written into the safetensors beside the model's own tensors."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    full = config.layer_types.index("full_attention")
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = config.hidden_size
    prefix = f"model.layers.{full}."
    for name, tensor in list(tensors.items()):
        if name.startswith(prefix):
            noise = torch.randn(tensor.shape, generator=generator) * INIT_RANGE
            tensors["mtp.layers.0." + name[len(prefix) :]] = (
                noise if tensor.dim() > 1 else tensor.clone()
            ).to(tensor.dtype)
    dtype = tensors["model.norm.weight"].dtype
    tensors["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=generator) * INIT_RANGE).to(dtype)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    settings = json.loads((folder / "config.json").read_text())
    settings["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(settings, indent=2))


def convert(folder: Path, dest: Path, outtype: str = "f16", extra: tuple[str, ...] = ()) -> Path:
    """The vendored converter over `folder`: a GGUF at `dest`."""
    tools = converter_dir()
    # transformers 5 loads a Qwen3.5-MoE folder's tokenizer as Qwen3_5Tokenizer whatever tokenizer_config.json
    # names (tokenization_auto's MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), which is not SmolLM2's pre-tokenizer:
    # the converter would not recognize it. The test models carry SmolLM2's tokenizer, so they are read as saved.
    run = (
        "import runpy, sys\n"
        "from transformers.models.auto import tokenization_auto as auto\n"
        "auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.difference_update({'qwen3_5_moe', 'qwen3_5_moe_text'})\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", run, str(tools / "convert_hf_to_gguf.py"), str(folder)]
        + ["--outfile", str(dest), "--outtype", outtype, *extra],
        capture_output=True,
        text=True,
        cwd=tools,
    )
    if done.returncode != 0 or not dest.is_file():
        raise RuntimeError(f"convert_hf_to_gguf failed for {folder.name}: {done.stderr.strip()[-600:]}")
    return dest


def quantize(source: Path, dest: Path, ftype: str = "Q4_K_M") -> Path:
    """`llama_model_quantize` (the bindings' own) from `source` into `dest`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), params)
    if code != 0:
        raise RuntimeError(f"llama_model_quantize failed ({code}) for {source.name} -> {ftype}")
    return dest


def quantized(source: Path, ftype: str) -> Path:
    """`source` quantized to `ftype` once, cached beside the tiny models under the source's name and this
    llama.cpp's version (IQ4_NL of the embedded model takes ~45 s on a Zen 1 core: once per machine, not per run)."""
    root = cache_dir() / "models" / "quantized"
    dest = root / f"{source.stem}-{ftype.lower()}-llama.cpp-{LLAMA_CPP_PY_VERSION}.gguf"
    if dest.is_file() and dest.stat().st_mtime >= source.stat().st_mtime:
        return dest
    root.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}")
    try:
        quantize(source, partial, ftype.upper())
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def gguf_2026(
    kind: str, tokenizer_dir: Path, quant: str = "F16", seed: int = 2026, shape: str = "tiny"
) -> Path:
    """A random `kind` GGUF at `shape` (F16, or a quantized type such as Q4_K_M), built once and cached."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if shape != "tiny" and kind not in SHAPE_KINDS.get(shape, ()):
        kinds = SHAPE_KINDS.get(shape)
        raise ValueError(
            f"shape {shape!r} is built for {' and '.join(kinds)} only"
            if kinds
            else f"unknown shape {shape!r}"
        )
    root = cache_dir() / "models" / "tiny-2026"
    kind_name = f"{kind}-{shape}" if shape != "tiny" else kind
    dest = root / f"{kind_name}-s{seed}-v{BUILDER_VERSION}-{quant.lower()}.gguf"
    if dest.is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    f16 = root / f"{kind_name}-s{seed}-v{BUILDER_VERSION}-f16.gguf"
    if not f16.is_file():
        with tempfile.TemporaryDirectory() as work:
            folder = build_hf(kind, Path(work) / kind, tokenizer_dir, seed, shape)
            partial = f16.with_name(f".{f16.name}.{os.getpid()}")
            convert(folder, partial, "f16", ("--no-mtp",) if kind in ("qwen35", "qwen3next") else ())
            os.replace(partial, f16)
    if quant.upper() == "F16":
        return f16
    partial = dest.with_name(f".{dest.name}.{os.getpid()}")
    quantize(f16, partial, quant.upper())
    os.replace(partial, dest)
    return dest


if __name__ == "__main__":
    # python -m tests.support.models_2026 KIND [SHAPE] [QUANT]: build (or find) one and print its path.
    from engine.models import ensure_embedded_model

    kind, shape, quant = (sys.argv[1:] + ["tiny", "F16"][len(sys.argv) - 2 :])[:3]
    print(gguf_2026(kind, ensure_embedded_model(), quant=quant, shape=shape))
