from exllamav3.cache.cache import Cache, CacheLayer
from exllamav3.cache.fp16 import CacheLayer_fp16
from exllamav3.cache.quant import CacheLayer_quant

__all__ = ["Cache", "CacheLayer", "CacheLayer_fp16", "CacheLayer_quant"]
