"""Tiny random Llamas built on the spot, and the small trained tokenizer (the fixtures in tests/conftest.py use
them; tests that build their own variants import them from here)."""

from __future__ import annotations

from pathlib import Path

# Files that make up a tokenizer; copied from SmolLM2 into the tiny same-vocabulary model.
TOKENIZER_FILE_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

TINY_SEED = 1234
TINY_OTHER_VOCAB_SIZE = 512

# A ChatML template, like SmolLM2's, so the other-vocabulary model is a chat model too.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_llama(folder: Path, vocab_size: int, *, seed: int = TINY_SEED) -> Path:
    """Save a tiny random LlamaForCausalLM (safetensors) into `folder`; tokenizer files are the caller's job."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        # Wider than the default 0.02 so logits are peaked: argmax ties would make greedy tests fragile.
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(folder)
    return folder


def _train_small_tokenizer(vocab_size: int):
    """A byte-level BPE trained in-process on a little text: a real tokenizer unlike SmolLM2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # ids 0, 1, 2 as in SmolLM2 (unk/endoftext, bos, eos) so only the vocabulary differs
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "The quick brown fox jumps over the lazy dog.",
        "What is the capital of France? Paris is the capital of France.",
        "def add(a, b):\n    return a + b\n",
        "Speculative decoding drafts tokens and verifies them with the target model.",
    ] * 20
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def save_small_chat_tokenizer(folder: Path, vocab_size: int = TINY_OTHER_VOCAB_SIZE) -> None:
    """The small trained tokenizer (ids 0-2 as in SmolLM2) with a ChatML template, saved into `folder`."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_small_tokenizer(vocab_size),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(folder)


# --- a tiny model that repeats itself: n-gram drafts get proposed and accepted ------------------------------

# The successor model's cycle: each token's greedy successor is the next one, and the end-of-sequence id (2)
# sits inside the cycle, so a drafted copy of the cycle carries a stop token in the middle of a draft.
COPY_CYCLE = (*range(100, 111), 2, *range(111, 121))


def build_successor_llama(folder: Path, vocab_size: int, cycle: tuple[int, ...] = COPY_CYCLE) -> Path:
    """A tiny Llama whose greedy continuation of token c_i is c_{i+1} (a cycle): a model built to repeat.

    The residual stream carries a one-hot code of the current token and the unembedding maps it to its
    successor. Attention and the MLP stay (random, scaled down): they move every logit a little, so the KV
    cache matters (a wrong rollback changes the logits) while the argmax stays the successor's.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    hidden = 64
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(TINY_SEED + 7)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        codes = torch.randn(vocab_size, hidden) * 0.05  # tokens outside the cycle: small random codes
        for i, token in enumerate(cycle):
            codes[token] = 0.0
            codes[token, i % hidden] = 4.0
        model.model.embed_tokens.weight.copy_(codes)
        head = torch.randn(vocab_size, hidden) * 0.05
        for i in range(len(cycle)):
            successor = cycle[(i + 1) % len(cycle)]
            head[successor, i % hidden] = 6.0
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(folder)
    return folder


# --- other architectures: sliding windows, soft-capping, untied embeddings --------------------------------

# The sliding window of the tiny models of other architectures (every prompt in their tests runs past it).
WINDOW = 16
VOCAB = 512
# A prompt that runs past the window in every chat template.
WINDOW_QUESTION = "The quick brown fox jumps over the lazy dog. What is the capital of France?"


def build_tiny_architecture(kind: str, folder: Path, seed: int) -> Path:
    """A tiny random model of `kind` (sliding window 16) with a small trained tokenizer and a ChatML template."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        sliding_window=WINDOW,
    )
    if kind == "gemma2":  # one sliding and one full layer, logit soft-capping in attention and at the head
        from transformers import Gemma2Config as Config
    elif kind == "gemma3":  # sliding layers with their own rope base, query pre-scaling
        from transformers import Gemma3TextConfig as Config
    else:  # Mistral: one window on every layer, untied embeddings
        from transformers import MistralConfig as Config

        common["tie_word_embeddings"] = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(Config(**common)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(folder)
    save_small_chat_tokenizer(folder, VOCAB)
    return folder
