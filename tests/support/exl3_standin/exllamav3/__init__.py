"""Stand-in for exllamav3 1.6.5 (tests only): the same top-level names as exllamav3/__init__.py, CPU-only, scripted."""

from exllamav3.cache import Cache, CacheLayer_fp16, CacheLayer_quant
from exllamav3.generator import Generator, Job
from exllamav3.generator.sampler import ArgmaxSampler, ComboSampler, DefaultSampler
from exllamav3.model.config import Config
from exllamav3.model.model import Model
from exllamav3.tokenizer import Tokenizer

__all__ = [
    "ArgmaxSampler",
    "Cache",
    "CacheLayer_fp16",
    "CacheLayer_quant",
    "ComboSampler",
    "Config",
    "DefaultSampler",
    "Generator",
    "Job",
    "Model",
    "Tokenizer",
]
