"""Stand-in for exllamav3/cache/fp16.py (1.6.5): `CacheLayer_fp16(config, attention, cache_id, max_num_tokens)`
(lines 15-24), max_num_tokens a multiple of PAGE_SIZE."""

from exllamav3.cache.cache import CacheLayer
from exllamav3.constants import PAGE_SIZE


class CacheLayer_fp16(CacheLayer):  # noqa: N801 - the library's name
    def __init__(self, config, attention, cache_id: int, max_num_tokens: int):
        super().__init__(config, attention, cache_id, max_num_tokens)
        assert max_num_tokens % PAGE_SIZE == 0, f"max_num_tokens must be a multiple of {PAGE_SIZE}."
        self.bits = (16, 16)
