"""Stand-in for exllamav3/generator/sampler/presets.py (1.6.5).

`DefaultSampler` (lines 3-12) is min-p 0.08 then temperature 0.8, what `Job(sampler=None)` gets (job.py). `ComboSampler`
(lines 82-139) takes the same keywords with the same defaults; its stack is greedy (`SS_Argmax`) when temperature is
exactly 0.0 or top_k is 1 (line 117). The stand-in keeps the settings and says whether it is greedy; the scripted
target decides the tokens.
"""

from __future__ import annotations


class CustomSampler:
    def __init__(self, steps: list[str]):
        self.steps = steps

    @property
    def greedy(self) -> bool:
        return "argmax" in self.steps


class DefaultSampler(CustomSampler):
    def __init__(self):
        super().__init__(["min_p 0.08", "temperature 0.8", "sample"])


class ArgmaxSampler(CustomSampler):
    def __init__(self):
        super().__init__(["argmax"])


GreedySampler = ArgmaxSampler


class ComboSampler(CustomSampler):
    def __init__(
        self,
        rep_p: float = 1.0,
        freq_p: float = 0.0,
        pres_p: float = 0.0,
        rep_sustain_range: int = int(10e7),
        rep_decay_range: int = 0,
        dry_multiplier: float = 0.0,
        dry_base: float = 1.75,
        dry_allowed_length: int = 2,
        dry_range: int = 0,
        dry_sequence_breakers: frozenset[int] | set[int] | list[int] | None = None,
        temperature: float = 1.0,
        min_p: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        temp_last: bool = False,
        adaptive_target: float = 1.0,
        adaptive_decay: float = 0.9,
        logit_bias: dict[int, float] | None = None,
    ):
        self.settings = {
            "rep_p": rep_p, "freq_p": freq_p, "pres_p": pres_p, "dry_multiplier": dry_multiplier,
            "temperature": temperature, "min_p": min_p, "top_k": top_k, "top_p": top_p, "temp_last": temp_last,
            "adaptive_target": adaptive_target,
        }  # fmt: skip
        if temperature == 0.0 or top_k == 1:
            steps = ["argmax"]
        else:
            steps = ["temperature", "min_p", "top_k", "top_p", "sample"]
        super().__init__(steps)
