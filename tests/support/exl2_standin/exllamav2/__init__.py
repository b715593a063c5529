"""Stand-in for exllamav2 0.3.2 (tests only): the same names, CPU-only, scripted. See ../README.md."""

from exllamav2.cache import (
    ExLlamaV2Cache,
    ExLlamaV2Cache_8bit,
    ExLlamaV2Cache_Q4,
    ExLlamaV2Cache_Q6,
    ExLlamaV2Cache_Q8,
    ExLlamaV2Cache_TP,
    ExLlamaV2CacheBase,
)
from exllamav2.config import ExLlamaV2Config
from exllamav2.model import ExLlamaV2
from exllamav2.tokenizer.tokenizer import ExLlamaV2Tokenizer
from exllamav2.version import __version__

__all__ = [
    "ExLlamaV2",
    "ExLlamaV2Cache",
    "ExLlamaV2CacheBase",
    "ExLlamaV2Cache_8bit",
    "ExLlamaV2Cache_Q4",
    "ExLlamaV2Cache_Q6",
    "ExLlamaV2Cache_Q8",
    "ExLlamaV2Cache_TP",
    "ExLlamaV2Config",
    "ExLlamaV2Tokenizer",
    "__version__",
]
