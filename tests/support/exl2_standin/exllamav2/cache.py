"""Stand-in for exllamav2.cache: the cache classes, their shared constructor and max_seq_len rule."""

from __future__ import annotations


class ExLlamaV2CacheBase:
    def __init__(
        self, model, batch_size, max_seq_len, lazy=False, num_key_value_heads=None, fixed_device=None
    ):
        self.model = model
        self.max_seq_len = max_seq_len if max_seq_len != -1 else self.model.config.max_seq_len
        self.batch_size = batch_size
        self.current_seq_len = 0
        self.lazy = lazy
        self.allocated = not lazy
        if not lazy:
            assert model.loaded, "model must be loaded before a non-lazy cache is created"

    def all_tensors(self):
        return []


class ExLlamaV2Cache(ExLlamaV2CacheBase):
    def __init__(
        self,
        model,
        batch_size=1,
        max_seq_len=-1,
        copy_from=None,
        lazy=False,
        num_key_value_heads=None,
        fixed_device=None,
    ):
        super().__init__(model, batch_size, max_seq_len, lazy, num_key_value_heads, fixed_device)


class ExLlamaV2Cache_8bit(ExLlamaV2CacheBase):
    def __init__(
        self,
        model,
        batch_size=1,
        max_seq_len=-1,
        copy_from=None,
        lazy=False,
        num_key_value_heads=None,
        fixed_device=None,
    ):
        super().__init__(model, batch_size, max_seq_len, lazy, num_key_value_heads, fixed_device)


class ExLlamaV2Cache_Q(ExLlamaV2CacheBase):
    wbits = 0

    def __init__(
        self,
        model,
        batch_size=1,
        max_seq_len=-1,
        copy_from=None,
        lazy=False,
        num_key_value_heads=None,
        fixed_device=None,
    ):
        super().__init__(model, batch_size, max_seq_len, lazy, num_key_value_heads, fixed_device)


class ExLlamaV2Cache_Q4(ExLlamaV2Cache_Q):
    wbits = 4


class ExLlamaV2Cache_Q6(ExLlamaV2Cache_Q):
    wbits = 6


class ExLlamaV2Cache_Q8(ExLlamaV2Cache_Q):
    wbits = 8


class ExLlamaV2Cache_TP(ExLlamaV2CacheBase):
    pass
