"""The house rules of the code's layout, read from the code's own imports (every import, function-level ones too).

- no import cycle between files;
- the engine never imports textual;
- the decoding core (engine/decoding/) imports no backend, and no storage nor session: the history drafter's
  corpus is handed in (engine.request.HistoryCorpus), never read from the store there;
- the config imports no backend: only the registry of engines, a leaf that names each engine's package as a string
  (engine/backends/registry.py), so nothing the config reaches is an engine;
- the TUI's screens and widgets reach the engine only through the session, its events and the errors, and the two
  pure leaves that describe a reply's text as the engine hands it over (engine.reasoning: where its reasoning
  ends; engine.origins: which runs of it came from which drafter), imported where they are used, not re-exported;
- storage (engine/storage/) imports nothing of the session;
- nothing on the chat path (tui.app, engine.session, engine.backends and all they import) imports the tools
  (engine.benchmarks, tui.ui_bench);
- importing tui.app or tui.cli loads no torch;
- engine/'s root holds at most 14 modules, and no file in engine/ or tui/ runs over 600 lines;
- no function in engine/ or tui/ runs over 60 lines, unless its docstring says why ("Kept whole: ...");
- every folder of Python files is a package (pyproject.toml finds packages by their __init__.py).

Imports under `if TYPE_CHECKING:` are left out: they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.support import paths

ROOT = paths.ROOT
PACKAGES = ("engine", "tui", "presets")
MAX_LINES = 600
MAX_FUNCTION_LINES = 60
KEPT_WHOLE = "Kept whole:"  # a long function's docstring says why it reads best as one
FRONT_DOOR = (
    "engine.session",
    "engine.events",
    "engine.errors",
    "engine.reasoning",
    "engine.origins",
)  # what screens and widgets may import of the engine
MAX_ENGINE_ROOT_MODULES = 14
CHAT_PATH = ("tui.app", "engine.session", "engine.backends")
TOOLS = ("engine.benchmarks", "tui.ui_bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.AST, package: str) -> list[str]:
    """Every module name an import statement anywhere in `tree` names (`from a import b`: a.b and a)."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
            names.append(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _resolve(name: str) -> str | None:
    """The project module an imported name lives in (the longest module prefix), or None (not ours)."""
    known = modules()
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def imports_of(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """(project modules, top-level names of everything else) that `module` imports."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours: set[str] = set()
    other: set[str] = set()
    for name in imported_names(ast.parse(path.read_text(encoding="utf-8")), package):
        target = _resolve(name)
        if target is None:
            other.add(name.split(".")[0])
        elif target != module:
            ours.add(target)
    return frozenset(ours), frozenset(other)


def graph() -> dict[str, frozenset[str]]:
    return {m: imports_of(m)[0] for m in modules()}


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def offending_imports(sources: str, targets: str) -> list[str]:
    """`a -> b` for each module under `sources` that imports one under `targets`."""
    return sorted(
        f"{m} -> {t}"
        for m, imported in graph().items()
        if within(m, sources)
        for t in imported
        if within(t, targets)
    )


def reachable(starts: tuple[str, ...]) -> dict[str, str]:
    """Every module the `starts` (and the modules under them) import, directly or not: {module: who imported it}."""
    edges = graph()
    seen = {m: m for m in edges if any(within(m, s) for s in starts)}
    todo = list(seen)
    while todo:
        module = todo.pop()
        for target in edges[module]:
            if target not in seen:
                seen[target] = module
                todo.append(target)
    return seen


# --- the rules ---------------------------------------------------------------------------------------------


def test_the_parser_sees_function_level_imports_and_skips_type_checking_ones():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from engine.config import Settings\n"
        "def f():\n    from engine.storage import metrics\n    import engine.models\n"
    )
    names = imported_names(tree, "engine")
    assert "engine.storage.metrics" in names and "engine.models" in names
    assert "engine.config.Settings" not in names and "engine.config" not in names


def test_the_cycle_finder_finds_a_cycle():
    assert cycles(
        {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    ) == [["a", "b", "c"]]


def test_no_import_cycle_between_files():
    assert cycles(graph()) == []


def test_the_engine_never_imports_textual():
    users = sorted(m for m in modules() if within(m, "engine") and {"textual", "rich"} & imports_of(m)[1])
    assert users == [], "the engine imports textual (or rich): " + ", ".join(users)


def test_the_decoding_core_imports_no_backend():
    assert offending_imports("engine.decoding", "engine.backends") == []


def test_the_decoding_core_reads_no_storage_and_knows_no_session():
    assert offending_imports("engine.decoding", "engine.storage") == []
    assert offending_imports("engine.decoding", "engine.session") == []


def test_the_config_imports_no_backend():
    # The one way in is the registry, and the registry imports no engine: it names their packages as strings.
    assert offending_imports("engine.config", "engine.backends") == [
        "engine.config -> engine.backends.registry"
    ]
    reached = reachable(("engine.config",))
    engines = sorted(
        f"{reached[m]} -> {m}"
        for m in reached
        if within(m, "engine.backends") and m not in ("engine.backends", "engine.backends.registry")
    )
    assert engines == [], "the config reaches an engine: " + ", ".join(engines)


def test_screens_and_widgets_reach_only_the_session_its_events_and_the_errors():
    offending = sorted(
        f"{m} -> {t}"
        for m, imported in graph().items()
        if within(m, "tui.screens") or within(m, "tui.widgets")
        for t in imported
        if within(t, "engine") and not any(within(t, door) for door in FRONT_DOOR)
    )
    assert offending == [], "a screen or widget imports the engine directly: " + ", ".join(offending)


def test_storage_imports_nothing_of_the_session():
    assert offending_imports("engine.storage", "engine.session") == []


def test_nothing_on_the_chat_path_imports_the_tools():
    seen = reachable(CHAT_PATH)
    tools = sorted(f"{seen[m]} -> {m}" for m in seen if any(within(m, t) for t in TOOLS))
    assert tools == [], "the chat path reaches the tools: " + ", ".join(tools)


@pytest.mark.parametrize("module", ["tui.app", "tui.cli"])
def test_importing_the_front_end_loads_no_torch(module: str):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", f"import {module} loaded torch"


def test_every_folder_of_python_files_is_a_package():
    """pyproject.toml finds packages by their __init__.py: a folder without one would be left out of the wheel."""
    folders = {p.parent for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert missing == [], f"no __init__.py (left out of the wheel): {missing}"


def test_the_engine_root_holds_at_most_14_modules():
    root = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(root) <= MAX_ENGINE_ROOT_MODULES, f"{len(root)} modules in engine/: {', '.join(root)}"


def test_no_file_in_engine_or_tui_runs_over_600_lines():
    lengths = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for package in ("engine", "tui")
        for p in (ROOT / package).rglob("*.py")
    }
    long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines (split it by concept): {long}"


def long_functions(source: str, path: str) -> dict[str, int]:
    """The functions of `source` over MAX_FUNCTION_LINES lines whose docstring gives no reason ("Kept whole: ...")."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES and KEPT_WHOLE not in (ast.get_docstring(node) or ""):
                found[f"{path}:{node.lineno} {node.name}"] = length
    return found


def test_the_function_check_sees_a_long_function_and_its_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert list(long_functions(f"def f():\n{body}\n", "m.py")) == ["m.py:1 f"]
    reasoned = f'def f():\n    """{KEPT_WHOLE} one table, read top to bottom."""\n{body}\n'
    assert long_functions(reasoned, "m.py") == {}
    assert long_functions(f"def f():\n{body[: body.rindex(chr(10))]}\n", "m.py") == {}


def test_no_function_in_engine_or_tui_runs_over_60_lines_without_a_reason():
    long = {}
    for package in ("engine", "tui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            long |= long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert long == {}, (
        f"over {MAX_FUNCTION_LINES} lines (split it into named steps, or say why not in its docstring, "
        f'"{KEPT_WHOLE} ..."): {long}'
    )
