"""Draft pairs on the transformers backend whose cost is counted, not timed: a cost model frozen at a given curve,
a request, a reply and its tokens (test_adaptive_k and test_draft_cost use them; the fixture `long_copy_dir` is
in tests/conftest.py)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from engine.backends.transformers import TransformersBackend
from engine.decoding.cost_model import MAX_DRAFT_LENGTH, VerifyCostModel
from engine.events import Chunk, Done
from engine.request import GenerationRequest, SamplerSettings
from tests.support.tiny_models import TOKENIZER_FILE_NAMES

# A CPU-like verify curve: each extra token in a pass costs 15% of a plain step (SmolLM2 on 2 cores: 10-20%).
CPU_CURVE = {w: 1.0 + 0.15 * (w - 1) for w in range(1, MAX_DRAFT_LENGTH + 2)}


class FrozenCosts(VerifyCostModel):
    """A cost model that stays as given, whatever the passes really take (the test machine is shared)."""

    def __init__(self, curve: dict[int, float], draft_ratio: float) -> None:
        super().__init__(curve, draft_ratio=draft_ratio)

    def observe(self, width: int, seconds: float) -> None:
        pass

    def observe_draft(self, seconds: float) -> None:
        pass


def request(
    prompt: list[int], k: int, max_new: int, mode: str = "adaptive", key: str = "t"
) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(prompt),
        sampler=SamplerSettings(temperature=0.0),
        max_new_tokens=max_new,
        num_draft_tokens=k,
        seed=3,
        k_mode=mode,
        tuning_key=key,
    )


def reply(backend: TransformersBackend, req: GenerationRequest) -> tuple[list[Chunk], Done]:
    events = list(backend.generate(req, threading.Event()))
    return [e for e in events if isinstance(e, Chunk)], events[-1]


def tokens(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


# A cycle without a stop token: the copy model continues it for as long as asked.
LONG_CYCLE = tuple(range(100, 140))


def with_tokenizer(folder: Path, smol_dir: Path) -> Path:
    for name in TOKENIZER_FILE_NAMES:
        if (smol_dir / name).is_file():
            shutil.copy2(smol_dir / name, folder / name)
    return folder


def pair(target: Path, draft: Path, curve: dict[int, float], draft_ratio: float) -> TransformersBackend:
    backend = TransformersBackend(target, draft=str(draft), cache_mode="fp16", draft_cache_mode="fp16")
    backend.load()
    backend.target.costs = FrozenCosts(curve, draft_ratio)
    return backend
