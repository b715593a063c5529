"""`specchat tune`: sweep K, temperature, drafting and cache mode per task, and write the winning K into presets.

What is swept, per task (code, qa, creative), on the task's prompts:
  k            K 0 and 1..8 at the preset's own sampler (temperature, ramp ...): the table and the winner
  temperature  0.1, 0.5, 0.7, 1.0, 1.2 at the winning K
  ramp         the winning K with the preset's temperature ramp and without it, side by side ("does it pay")
  drafting     the other drafter (n-gram where a draft model is configured, the draft model where one is
               configured and n-gram drove the sweep) at the winning K, on a second load
  cache        the other cache mode (q8 <-> full precision) at the winning K, on a second load
Every row's measured speedup divides its tok/s by plain decoding's (K 0) on the same prompts and the same load
(the K rows: measured in one rotation, each repeat running the cells in a shifted order so that the machine's
noise falls on all of them alike; each cell keeps its best time). The sampled runs share one seed, so with and
without drafting they emit the same tokens. The temperature and ramp rows divide by the K sweep's plain row:
plain decoding's speed per token does not depend on the sampler.

The prompts: the public bench set (engine/benchmarks/prompts.jsonl; the held-out one stays for `specchat bench`), a
JSON Lines file of {"prompt", "category"?} objects, or the user's own past messages from the conversation store. A prompt
without a category is routed as the chat would route it.

`apply.apply_results()` writes the winning K (and the ramp, where on and off differ by more than the noise margin)
into `<config dir>/presets/<task>.toml`, keeping the previous file as `<task>.toml.bak`, and returns the diffs.
The package, by concept: `plan` (what is swept, on which prompts), `measure` (a configuration run over the
prompts, its row), `sweep` (`run_tune`: the order of the runs), `decide` (the K and ramp to write), `results` (the
rows, decisions, tables and files), `apply` (the preset files written). Re-exports only. Drives a backend; nothing
on the chat path imports it (the CLI calls it).
"""

from engine.benchmarks.tune.apply import AppliedPreset, apply_results, set_toml_keys
from engine.benchmarks.tune.decide import NOISE_MARGIN
from engine.benchmarks.tune.measure import DEFAULT_RAMP_TOKENS, ProgressBar
from engine.benchmarks.tune.plan import (
    K_VALUES,
    TASKS,
    TEMPERATURES,
    TuneError,
    TunePlan,
    TunePrompt,
    builtin_prompts,
    pick_prompts,
    prompts_from_history,
    prompts_from_jsonl,
)
from engine.benchmarks.tune.results import (
    ROW_FIELDS,
    TaskDecision,
    TuneResult,
    TuneRow,
    format_tables,
    plot,
    to_csv,
    write_outputs,
)
from engine.benchmarks.tune.sweep import load_backend, planned_runs, run_tune

__all__ = [
    "DEFAULT_RAMP_TOKENS",
    "K_VALUES",
    "NOISE_MARGIN",
    "ROW_FIELDS",
    "TASKS",
    "TEMPERATURES",
    "AppliedPreset",
    "ProgressBar",
    "TaskDecision",
    "TuneError",
    "TunePlan",
    "TunePrompt",
    "TuneResult",
    "TuneRow",
    "apply_results",
    "builtin_prompts",
    "format_tables",
    "load_backend",
    "pick_prompts",
    "planned_runs",
    "plot",
    "prompts_from_history",
    "prompts_from_jsonl",
    "run_tune",
    "set_toml_keys",
    "to_csv",
    "write_outputs",
]
