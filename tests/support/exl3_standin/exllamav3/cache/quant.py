"""Stand-in for exllamav3/cache/quant.py (1.6.5): `CacheLayer_quant(config, attention, cache_id, max_num_tokens,
k_bits, v_bits, compand_a=0.0)` (lines 15-30): a multiple of PAGE_SIZE, K and V bits each 2..8."""

from exllamav3.cache.cache import CacheLayer
from exllamav3.constants import PAGE_SIZE


class CacheLayer_quant(CacheLayer):  # noqa: N801 - the library's name
    def __init__(
        self, config, attention, cache_id: int, max_num_tokens: int, k_bits: int, v_bits: int, compand_a=0.0
    ):
        super().__init__(config, attention, cache_id, max_num_tokens)
        assert max_num_tokens % PAGE_SIZE == 0, f"max_num_tokens must be a multiple of {PAGE_SIZE}."
        assert (2 <= k_bits <= 8) and (2 <= v_bits <= 8), "quantized cache must be from 2 to 8 bits"
        self.bits = (k_bits, v_bits)
