"""Stand-in for exllamav3/cache/cache.py (1.6.5).

`Cache(model, max_num_tokens, layer_type=None, max_batch_size=16, max_history=0, recurrent_dtype=..., **kwargs)`
(lines 95-104) builds one `layer_type(config, attention, cache_id, max_num_tokens, **kwargs)` per attention layer
(lines 156-167): the layer's own keywords (k_bits, v_bits) pass through `**kwargs`, so a wrong one fails there. On
a model with recurrent layers it keeps `max_batch_size` state slots (`num_slots`, `free_list`) and `max_history`,
the longest speculative pass a slot can rewind (lines 121-128, 170-184); `reset_states()` returns every slot
(lines 401-405). The cache attaches to its model at once (`attach_to_model`, line 187) and is `initialized` only
when the model loads.
"""

from __future__ import annotations

from collections import deque


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
        self.num_slots = max_batch_size
        self.max_history = max_history
        self.free_list = deque(range(self.num_slots))
        self.recurrent_state_cls = model.recurrent_state_cls
        self.num_recurrent_layers = 3 if model.caps.get("recurrent_states") else 0
        self.layer_type = layer_type or CacheLayer_fp16
        self.layers = [
            self.layer_type(self.config, None, id(self), max_num_tokens, **kwargs) for _ in range(2)
        ]
        self.initialized = False
        assert not model.loaded, "stand-in: the real cache gets no tensors when built after model.load()"
        model.cache_refs.append(self)

    def reset_states(self):
        self.free_list = deque(range(self.num_slots))
