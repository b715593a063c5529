"""The ExLlamaV3 backend against the pinned exllamav3's REAL Python modules (its compiled extension stubbed).

`Generator(..., **kwargs)` and `Job(..., **kwargs)` swallow unknown keywords silently, and 1.4 -> 1.6 renamed
several, so a misspelt keyword would run and simply do nothing on a GPU. These tests read the backend's own source
and the shared base it runs on (engine/backends/library_generator/, held_rounds.py) (every `ex.X(...)` call, every attribute it reads or sets on the generator, job, tokenizer and config, every result
key and value it looks for) and check each against the real package: keywords against `inspect.signature` (a named
parameter, never one that only `**kwargs` would take), attributes and result keys against the real source. The
stand-in (tests/exl3_standin) is held to the same signatures. tests/exl3_real.py says how the wheel is fetched.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import engine.backends.exllamav3.backend as backend_module
import engine.backends.exllamav3.models as models_module
import engine.backends.held_rounds as held_rounds
import engine.backends.library_generator.backend as base_module
import engine.backends.library_generator.models as base_models_module
from engine.backends.exllamav3.sampling import cache_kwargs, combo_sampler_kwargs
from engine.request import SamplerSettings
from tests.support import paths
from tests.support.exl3_real import real_exllamav3, unpacked_source

# The backend's module and what it runs on: the shared base's loop and load, its rounds and its models.
BACKEND_MODULES = (backend_module, models_module, base_module, base_models_module, held_rounds)
BACKEND_TREES = [ast.parse(Path(m.__file__).read_text(encoding="utf-8")) for m in BACKEND_MODULES]
STANDIN = paths.EXL3_STANDIN

# The backend's calls, as written in its source, and the real callable each one reaches.
CALLS = {
    "ex.Generator": "Generator.__init__",
    "ex.Job": "Job.__init__",
    "ex.Cache": "Cache.__init__",
    "ex.Model.from_config": "Model.from_config",
    "ex.Config.from_directory": "Config.from_directory",
    "ex.Tokenizer.from_config": "Tokenizer.from_config",
    "model.load": "Model.load_gen",  # Model.load(*args, **kwargs) hands everything to load_gen
    "draft_model.load": "Model.load_gen",
    "m.tokenizer.encode": "Tokenizer.encode",
    "m.tokenizer.decode": "Tokenizer.decode",
}
# Names the backend binds to real objects, and their classes.
OBJECTS = {
    "generator": "Generator",
    "m.generator": "Generator",
    "job": "Job",
    "tokenizer": "Tokenizer",
    "m.tokenizer": "Tokenizer",
    "config": "Config",
    "model": "Model",
    "draft_model": "Model",
    "m.model": "Model",
    "self.tokenizer": "Tokenizer",  # ExLlamaV3Vocab (LibraryVocab)
    "cache": "Cache",
}
SOURCES = {
    "Generator": "generator/generator.py",
    "Job": "generator/job.py",
    "Tokenizer": "tokenizer/tokenizer.py",
    "Config": "model/config.py",
    "Model": "model/model.py",
    "Cache": "cache/cache.py",
}


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def backend_calls() -> dict[str, list[tuple[int, list[str]]]]:
    """For each CALLS key: (positional count, keyword names) of every such call in the backend's source."""
    found: dict[str, list[tuple[int, list[str]]]] = {key: [] for key in CALLS}
    for node in (n for tree in BACKEND_TREES for n in ast.walk(tree)):
        if isinstance(node, ast.Call) and dotted(node.func) in CALLS:
            keywords = [k.arg for k in node.keywords if k.arg is not None]
            found[dotted(node.func)].append((len(node.args), keywords))
    return found


def backend_attributes() -> dict[str, set[str]]:
    """Class name -> attributes the backend reads or sets on its objects (getattr(obj, "name") included)."""
    used: dict[str, set[str]] = {}
    for node in (n for tree in BACKEND_TREES for n in ast.walk(tree)):
        if isinstance(node, ast.Attribute) and dotted(node.value) in OBJECTS:
            used.setdefault(OBJECTS[dotted(node.value)], set()).add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and dotted(node.args[0]) in OBJECTS
            and isinstance(node.args[1], ast.Constant)
        ):
            used.setdefault(OBJECTS[dotted(node.args[0])], set()).add(node.args[1].value)
    return used


def result_strings() -> tuple[set[str], set[str]]:
    """(result keys, result values) the backend and the shared base look for in iterate() results."""
    keys: set[str] = set()
    values: set[str] = set()
    for tree in BACKEND_TREES:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and dotted(node.func.value) in ("r", "end", "failed", "result")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                keys.add(node.args[0].value)
            if isinstance(node, ast.Compare):
                left = node.left
                if (
                    isinstance(left, ast.Name)
                    and left.id == "reason"
                    or (
                        isinstance(left, ast.Call)
                        and isinstance(left.func, ast.Attribute)
                        and left.func.attr == "get"
                    )
                ):
                    for comparator in node.comparators:
                        if isinstance(comparator, ast.Constant) and isinstance(comparator.value, str):
                            values.add(comparator.value)
    return keys, values


def named_parameters(function: Any) -> tuple[set[str], int, bool]:
    """(names a keyword can reach, positional capacity, takes *args)."""
    params = list(inspect.signature(function).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return names, positional, any(p.kind == p.VAR_POSITIONAL for p in params)


def resolve(module: Any, path: str) -> Any:
    owner, _, attr = path.partition(".")
    return getattr(getattr(module, owner), attr)


@pytest.fixture(scope="module")
def real():
    try:
        with real_exllamav3() as module:
            import exllamav3.generator.sampler as sampler_module

            yield module, sampler_module
    except (
        RuntimeError
    ) as exc:  # no wheel to be had: one line saying why, as a failure (this is the only guard)
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def real_source() -> Path:
    return unpacked_source() / "exllamav3"


# ------------------------------------------------------------------------------------------------ the tests


def test_the_real_package_is_the_pinned_release(real, real_source):
    module, _ = real
    assert (real_source / "version.py").read_text().strip() == '__version__ = "1.6.5"'
    assert module.Generator.__module__ == "exllamav3.generator.generator"
    assert "exl3_standin" not in inspect.getfile(module.Generator)


def test_every_keyword_the_backend_passes_is_a_named_parameter(real):
    module, _ = real
    calls = backend_calls()
    problems = []
    for call, uses in calls.items():
        assert uses, f"the backend no longer calls {call}: update CALLS"
        names, positional, star_args = named_parameters(resolve(module, CALLS[call]))
        for n_positional, keywords in uses:
            if n_positional > positional and not star_args:
                problems.append(
                    f"{call}: {n_positional} positional arguments, {CALLS[call]} takes {positional}"
                )
            problems += [
                f"{call}({kw}=...): no such parameter of {CALLS[call]}" for kw in keywords if kw not in names
            ]
    assert problems == []


def test_sampler_and_cache_keywords_are_named_parameters(real):
    module, sampler_module = real
    names, _, _ = named_parameters(sampler_module.ComboSampler.__init__)
    assert set(combo_sampler_kwargs(SamplerSettings(), 0.0)) <= names
    cache_names, _, _ = named_parameters(module.Cache.__init__)
    quant_names, _, _ = named_parameters(module.CacheLayer_quant.__init__)
    for mode in ("fp16", "q8", "q6", "q4"):
        kwargs = cache_kwargs(mode, module.CacheLayer_fp16, module.CacheLayer_quant)
        layer = kwargs.pop("layer_type")
        assert "layer_type" in cache_names
        layer_names, _, _ = named_parameters(layer.__init__)
        assert set(kwargs) <= layer_names, (mode, kwargs)  # Cache passes the rest to the layer via **kwargs
    assert {"k_bits", "v_bits"} <= quant_names
    # The real ComboSampler is greedy exactly at temperature 0.0 (and top_k 1), as the backend relies on.
    source = inspect.getsource(sampler_module.ComboSampler.__init__)
    assert "if temperature == 0.0 or top_k == 1:" in source and "SS_Argmax()" in source
    assert "SS_MinP(0.08)" in inspect.getsource(sampler_module.DefaultSampler)  # sampler=None is not neutral


def test_every_attribute_the_backend_uses_exists(real, real_source):
    module, _ = real
    problems = []
    for cls_name, attrs in backend_attributes().items():
        cls = getattr(module, cls_name)
        text = (real_source / SOURCES[cls_name]).read_text(encoding="utf-8")
        for attr in sorted(attrs):
            if hasattr(cls, attr) or re.search(rf"self\.{re.escape(attr)}\b", text):
                continue
            problems.append(f"{cls_name}.{attr}")
    assert problems == []


def test_the_generator_reads_what_the_backend_sets_between_replies(real_source):
    text = (real_source / "generator/generator.py").read_text(encoding="utf-8")
    # K per reply: iterate() reads num_draft_tokens every round (the draft window, the n-gram window).
    assert "draft_window = self.row_limited(self.num_draft_tokens) if self.draft_model else 0" in text
    assert "window = self.num_draft_tokens" in text
    # The dynamic draft length is the calibrator and nothing else: None turns it off for a reply.
    assert text.count("self.draft_calibrator") >= 4 and "cal = self.draft_calibrator" in text
    assert "self.dynamic_draft" not in text.split("def iterate(")[1]  # not read again after construction
    # The K = 0 hazard: no draft forward at all at draft_window 0.
    assert "if self.draft_model and draft_window > 0:" in text


def test_every_result_key_and_value_the_backend_reads_is_in_the_real_source(real_source):
    text = "\n".join(
        (real_source / p).read_text(encoding="utf-8") for p in ("generator/generator.py", "generator/job.py")
    )
    keys, values = result_strings()
    assert {
        "stage",
        "eos",
        "eos_reason",
        "token_ids",
        "held",
        "error",
        "time_prefill",
        "cached_tokens",
    } <= keys
    assert {"streaming", "error", "stop_token", "loop_detected", "max_new_tokens"} <= values
    missing = sorted(s for s in keys | values if f'"{s}"' not in text)
    assert missing == []
    # The live counters the Chunks come from.
    assert "job.accepted_draft_tokens += 1" in text and "job_.rejected_draft_tokens += num_rejected" in text
    assert (
        "job.rejected_draft_tokens += num_unresolved" in text
    )  # 1.6.5: drafts unresolved at EOS are rejected


def test_the_stand_in_has_the_real_signatures(real, monkeypatch):
    module, sampler_module = real
    pairs = {
        "Generator.__init__": module.Generator.__init__,
        "Job.__init__": module.Job.__init__,
        "Cache.__init__": module.Cache.__init__,
        "CacheLayer_quant.__init__": module.CacheLayer_quant.__init__,
        "CacheLayer_fp16.__init__": module.CacheLayer_fp16.__init__,
        "Model.from_config": module.Model.from_config,
        "Model.load_gen": module.Model.load_gen,
        "Config.from_directory": module.Config.from_directory,
        "Tokenizer.from_config": module.Tokenizer.from_config,
        "Tokenizer.encode": module.Tokenizer.encode,
        "Tokenizer.decode": module.Tokenizer.decode,
        "ComboSampler.__init__": sampler_module.ComboSampler.__init__,
    }
    real_params = {name: list(inspect.signature(f).parameters.values()) for name, f in pairs.items()}
    saved = {n: m for n, m in sys.modules.items() if n == "exllamav3" or n.startswith("exllamav3.")}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(STANDIN))
    try:
        import exllamav3 as standin

        assert "exl3_standin" in standin.__file__
        problems = []
        for name, params in real_params.items():
            ours = list(inspect.signature(resolve(standin, name)).parameters.values())
            if [(p.name, p.kind) for p in ours] != [(p.name, p.kind) for p in params]:
                problems.append(
                    f"{name}: stand-in {[p.name for p in ours]} != real {[p.name for p in params]}"
                )
                continue
            for a, b in zip(ours, params, strict=True):
                simple = isinstance(b.default, int | float | str | bool) or b.default is None
                if simple and b.default is not inspect.Parameter.empty and a.default != b.default:
                    problems.append(f"{name}({a.name}): stand-in default {a.default!r} != real {b.default!r}")
        assert problems == []
    finally:
        for name in [n for n in sys.modules if n == "exllamav3" or n.startswith("exllamav3.")]:
            del sys.modules[name]
        sys.modules.update(saved)
