"""Stand-in for exllamav3/model/model.py (1.6.5).

`Model.from_config(config, component="text", **kwargs)` (lines 171-195) asserts the component is one of the
config's `model_classes`; an MTP head is `component="mtp"` of the target's own config (model_init.py lines 212-287).
`caps` as the real classes set them: a hybrid's text model says `recurrent_states` with a checkpoint interval of
2048 (architecture/qwen3_5.py:484-490, qwen3_next.py:233-239); Qwen3.5's MTP head says `mtp_draft` and
`attach_target` with no `mtp_depths` (qwen3_5_mtp.py:167-173), MiMo-V2's says `mtp_depths`, one per layer
(mimo_v2_mtp.py:130-137); `attach_to(target)` is how the generator binds such a head (qwen3_5_mtp.py:193-220). `load(*args, **kwargs)` (line 758) runs `load_gen` whose keyword list (lines
475-494) has no `**kwargs`: an unknown keyword is a TypeError, as here. Loading marks every cache attached to the
model initialized (lines 748-751): a cache built after `load()` never is, and the generator refuses it.
"""

from __future__ import annotations

from exllamav3.standin import LOAD_LOG


class Model:
    def __init__(self, config, component: str = "text", **kwargs):
        self.config = config
        self.component = component
        self.caps: dict = {}
        self.recurrent_state_cls = None
        if component == "mtp":
            self.caps = {"attach_target": True, "mtp_draft": True, "default_draft_size": 4}
            if config.architecture == "MiMoV2ForCausalLM":
                self.caps |= {"mtp_depths": config.mtp_depth, "default_draft_size": config.mtp_depth}
        elif config.recurrent:
            self.caps = {"recurrent_states": True, "default_recurrent_checkpoint_interval": 2048}
            self.recurrent_state_cls = "GDNState"
        self.attached_model = None
        self.cache_refs = []
        self.loaded = False
        self.loaded_tp = False

    @staticmethod
    def from_config(config, component: str = "text", **kwargs):
        assert component in config.model_classes, (
            f"{config.architecture} does not define a '{component}' component model"
        )
        return config.model_classes[component](config, component=component, **kwargs)

    def attach_to(self, target):
        self.attached_model = target

    def load_gen(
        self,
        device=None,
        tp_output_device=None,
        reserve_per_device=None,
        use_per_device=None,
        tensor_p: bool = False,
        progressbar: bool = False,
        max_chunk_size: int = 2048,
        max_output_size: int = 32,
        max_output_factor: int = 1,
        callback=None,
        generator: bool = True,
        tp_dev_limits=None,
        tp_backend: str = "native",
        verbose: bool = False,
        max_batch_size: int = 1,
        tp_options=None,
        autosplit_no_forward: bool = False,
        draft_model=None,
    ):
        if self.config.standin.get("oom_on_load"):
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for i in range(3):
            if callback:
                callback(i + 1, 3)
            yield i
        LOAD_LOG.append(f"{self.component} {self.config.directory}")
        self.loaded = True
        for cache in self.cache_refs:
            cache.initialized = True

    def load(self, *args, **kwargs):
        kwargs["generator"] = False
        for _ in self.load_gen(*args, **kwargs):
            pass

    def unload(self):
        self.loaded = False
        for cache in self.cache_refs:
            cache.initialized = False
