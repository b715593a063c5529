"""ExLlamaV3 (the maintained successor of ExLlamaV2) on a CUDA GPU: `--backend exllamav3`. Re-exports only."""

from engine.backends.exllamav3.backend import MAX_DRAFT_TOKENS, ExLlamaV3Backend
from engine.backends.exllamav3.folder import has_mtp_head
from engine.backends.exllamav3.library import PINNED_VERSION, import_exllamav3, probe_exllamav3

__all__ = [
    "MAX_DRAFT_TOKENS",
    "PINNED_VERSION",
    "ExLlamaV3Backend",
    "has_mtp_head",
    "import_exllamav3",
    "probe_exllamav3",
]
