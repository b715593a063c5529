"""Stand-in for exllamav2.model.ExLlamaV2: loading (manual split or autosplit), forward for timing, unload."""

from __future__ import annotations

import torch

from exllamav2.standin import LOAD_LOG


class ExLlamaV2:
    def __init__(self, config, lazy_load=False, archparams=None):
        self.config = config
        self.loaded = False
        self.num_modules = config.num_hidden_layers + 3
        self.padded_vocab_size = ((config.vocab_size + 31) // 32) * 32

    def _load(self, callback):
        if self.config.standin.get("oom_on_load"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for i in range(self.num_modules):
            if callback is not None:
                callback(i + 1, self.num_modules)
        self.loaded = True
        LOAD_LOG.append(self.config.model_dir)

    def load(self, gpu_split=None, lazy=False, stats=False, callback=None, callback_gen=None, progress=False):
        self._load(callback)

    def load_autosplit(
        self, cache, reserve_vram=None, last_id_only=False, callback=None, callback_gen=None, progress=False
    ):
        assert cache.lazy, "load_autosplit needs a cache constructed with lazy = True"
        assert cache.model is self
        self._load(callback)
        cache.allocated = True

    def forward(
        self,
        input_ids,
        cache=None,
        input_mask=None,
        preprocess_only=False,
        last_id_only=False,
        loras=None,
        return_last_state=False,
        position_offsets=None,
        abort_event=None,
        cpu_logits=False,
        **kwargs,
    ):
        assert self.loaded
        assert input_ids.shape[-1] <= self.config.max_input_len or cache is not None
        q = 1 if last_id_only else input_ids.shape[-1]
        return torch.zeros((input_ids.shape[0], q, self.padded_vocab_size))

    def unload(self):
        self.loaded = False
