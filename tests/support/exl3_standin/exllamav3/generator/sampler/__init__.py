from exllamav3.generator.sampler.presets import ArgmaxSampler, ComboSampler, DefaultSampler, GreedySampler

__all__ = ["ArgmaxSampler", "ComboSampler", "DefaultSampler", "GreedySampler"]
