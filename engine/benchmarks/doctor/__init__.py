"""`specchat doctor`: the validation routine to run after every change, each check pass / warn / fail in one line.

The checks, in order (a check that cannot run because an earlier one failed is "skip"):
  environment    torch, CUDA, the exllamav2 and exllamav3 builds, flash-attn, the llama.cpp bindings
  memory         free GPU memory and the memory plan, with advice for 24 / 16 / 12 / 8 GB cards
  compatibility  draft vs target: vocabulary sizes, differing token strings, special tokens, tokenizer file
                 hashes, chat templates (the rule that fails is named)
  load           the backend loads; warnings printed while loading are captured and shown
  draft_pays     whether drafting can pay on this machine, and why: the verify cost r(2) and the draft step c
                 measured at load, priced at 90% acceptance (a warning where no K could pay)
  baseline       a fixed prompt, greedy: acceptance, tau, tok/s, TTFT
  context        the ladder 512, 2k, 4k ... up to max_context, the same message to repeat after filler of each
                 length: acceptance must stay within 5 points of the first rung, and a larger drop fails only
                 beyond the noise of the rungs' drafts (too few drafts to judge are a warning, not a verdict)
  tasks          one code, one Q&A and one creative prompt with their presets
  restart        a second load gives the same greedy text
  regression     against the last saved baseline of this fingerprint (model + draft + tokenizer files) on the
                 same backend, cache and drafting: a drop of 8+ acceptance points or 15%+ tok/s fails (the rule
                 of `specchat metrics --check`)
A run without failures is saved as the new baseline (`<data dir>/doctor/<fingerprint>.json`). Drives a backend
through the bench's runner; nothing on the chat path imports it.

The package, by area: `run` (`run_doctor`: the checks in order, and what is skipped after a failure), `report` (a
check's line, the report, the check names), `environment`, `memory`, `compatibility`, `model_runs` (the load and
everything that runs the model), `baseline` (the regression rule and the saved baselines). Re-exports only.
"""

from engine.benchmarks.doctor.baseline import check_regression, compare_baseline, read_baselines
from engine.benchmarks.doctor.compatibility import TOKENIZER_FILES, check_compatibility, file_hashes
from engine.benchmarks.doctor.environment import check_engine, check_environment
from engine.benchmarks.doctor.memory import GPU_TIERS_GB, check_memory, tier_advice
from engine.benchmarks.doctor.model_runs import FIXED_PROMPT, load_capturing_warnings, summarise_warning
from engine.benchmarks.doctor.report import (
    CHECK_NAMES,
    STATUSES,
    Check,
    DoctorError,
    DoctorOptions,
    DoctorReport,
    format_report,
)
from engine.benchmarks.doctor.run import run_doctor

__all__ = [
    "CHECK_NAMES",
    "FIXED_PROMPT",
    "GPU_TIERS_GB",
    "STATUSES",
    "TOKENIZER_FILES",
    "Check",
    "DoctorError",
    "DoctorOptions",
    "DoctorReport",
    "check_compatibility",
    "check_engine",
    "check_environment",
    "check_memory",
    "check_regression",
    "compare_baseline",
    "file_hashes",
    "format_report",
    "load_capturing_warnings",
    "read_baselines",
    "run_doctor",
    "summarise_warning",
    "tier_advice",
]
