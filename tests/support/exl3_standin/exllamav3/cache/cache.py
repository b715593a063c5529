"""Stand-in for exllamav3/cache/cache.py (1.6.5).

`Cache(model, max_num_tokens, layer_type=None, max_batch_size=16, max_history=0, recurrent_dtype=..., **kwargs)`
(lines 93-104) builds one `layer_type(config, attention, cache_id, max_num_tokens, **kwargs)` per attention layer
(line 76): the layer's own keywords (k_bits, v_bits) pass through `**kwargs`, so a wrong one fails there. The cache
attaches to its model at once (`attach_to_model`, line 191) and is `initialized` only when the model loads.
"""

from __future__ import annotations


class CacheLayer:
    def __init__(self, config, attention, cache_id: int, max_num_tokens: int):
        self.max_num_tokens = max_num_tokens


class Cache:
    def __init__(
        self,
        model,
        max_num_tokens: int,
        layer_type=None,
        max_batch_size: int = 16,
        max_history: int = 0,
        recurrent_dtype=None,
        **kwargs,
    ):
        from exllamav3.cache.fp16 import CacheLayer_fp16

        self.model = model
        self.config = model.config
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.max_history = max_history
        self.layer_type = layer_type or CacheLayer_fp16
        self.layers = [
            self.layer_type(self.config, None, id(self), max_num_tokens, **kwargs) for _ in range(2)
        ]
        self.initialized = False
        assert not model.loaded, "stand-in: the real cache gets no tensors when built after model.load()"
        model.cache_refs.append(self)
