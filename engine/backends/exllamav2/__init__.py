"""ExLlamaV2's dynamic generator on a CUDA GPU (EXL2, GPTQ and FP16 folders): `--backend exllamav2`. Re-exports only."""

from engine.backends.exllamav2.backend import MAX_DRAFT_TOKENS, PROBE_INTERVAL_ROUNDS, ExLlamaV2Backend
from engine.backends.exllamav2.library import import_exllamav2, probe_exllamav2
from engine.backends.exllamav2.models import ntk_alpha, round_up_to_page

__all__ = [
    "MAX_DRAFT_TOKENS",
    "PROBE_INTERVAL_ROUNDS",
    "ExLlamaV2Backend",
    "import_exllamav2",
    "ntk_alpha",
    "probe_exllamav2",
    "round_up_to_page",
]
