"""The front door stays true: every command in README.md and docs/*.md still runs as written, every path and link
they name exists, the README stays short, and every key binding is in a key list.

Commands are read from shell code blocks (```sh / bash / shell / console), indented code lines, and inline code
spans that start with `specchat`, `.venv/bin/specchat`, `make` or `python -m`. What "runs" means per command:
- `specchat ...` / `.venv/bin/specchat ...`: the real CLI parser accepts it (parsed the way `tui.cli.entry.main`
  parses, nothing run, no model loaded). Synopsis notation is read as a user would: `[--json]` is given, `a|b`
  takes `a`, and metavariables (ID, FILE, N, ...) get a sample value;
- `make TARGET`: the Makefile has the target;
- `python -m MODULE` (also `.venv/bin/python`): the module exists; `scripts/x.sh`, `bash tests/x.sh`: the file
  exists. Other programs (llama-server, vllm, export, ...) are not ours and are skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest


def _repo_root() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


ROOT = _repo_root()
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150

SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
COMMAND_START = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/specchat|specchat|make|(?:\.venv/bin/)?python3? -m)(?:\s|$)"
)
REPO_PATH = re.compile(r"^(?:engine|tui|tests|scripts|presets|docs)/[\w.*/-]+$")
# Metavariables of synopsis lines, and a value each that the parser takes.
PLACEHOLDERS = {
    "ID": "1",
    "FILE": "out.txt",
    "FILE.jsonl": "prompts.jsonl",
    "N": "4",
    "T": "0.7",
    "TEXT": "hello",
    "PATH": "model-folder",
    "NAME": "code",
    "WORD": "paris",
    "URL": "http://127.0.0.1:8080",
    "DIR": "out",
    "VAR": "MY_KEY",
    "M": "model-folder",
    "D": "draft-folder",
    "MODEL.gguf": "model.gguf",
}
SEPARATORS = {";", "&&", "||", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>>", "&>"}


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


# --- reading the pages ---------------------------------------------------------------------------------------


def _fenced_and_prose(text: str) -> tuple[list[tuple[str, int, str]], str]:
    """(language, line number, line) of every line inside a fence, and the prose with fenced lines blanked (so
    line numbers stay)."""
    fenced: list[tuple[str, int, str]] = []
    prose: list[str] = []
    language: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*(```|~~~)\s*([\w-]*)", line)
        if fence:
            language = fence.group(2).lower() if language is None else None
            prose.append("")
        elif language is not None:
            fenced.append((language, number, line))
            prose.append("")
        else:
            prose.append(line)
    return fenced, "\n".join(prose)


def _without_comment(line: str) -> str:
    return re.sub(r"(^|\s)#.*$", "", line).strip()


def commands_in(doc: Path) -> list[Command]:
    text = doc.read_text(encoding="utf-8")
    fenced, prose = _fenced_and_prose(text)
    found: list[Command] = []
    pending = ""
    for language, number, line in fenced:
        if language not in SHELL_LANGUAGES:
            continue
        line = pending + _without_comment(line)
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line:
            found.append(Command(doc, number, line))
    for number, line in enumerate(prose.splitlines(), 1):
        if line.startswith("    ") and COMMAND_START.match(line.strip()):
            found.append(Command(doc, number, _without_comment(line.strip())))
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        code = " ".join(span.group(1).split())
        if COMMAND_START.match(code):
            found.append(Command(doc, prose.count("\n", 0, span.start()) + 1, code))
    return found


def paths_in(doc: Path) -> list[tuple[int, str]]:
    _, prose = _fenced_and_prose(doc.read_text(encoding="utf-8"))
    return [
        (prose.count("\n", 0, span.start()) + 1, span.group(1))
        for span in re.finditer(r"(?<!`)`([^`\s]+)`(?!`)", prose)
        if REPO_PATH.match(span.group(1))
    ]


def links_in(doc: Path) -> list[tuple[int, str]]:
    _, prose = _fenced_and_prose(doc.read_text(encoding="utf-8"))
    return [
        (prose.count("\n", 0, link.start()) + 1, link.group(1))
        for link in re.finditer(r"\]\(([^)\s]+)\)", prose)
        if not re.match(r"^[a-z]+:", link.group(1))
    ]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(doc: Path) -> set[str]:
    _, prose = _fenced_and_prose(doc.read_text(encoding="utf-8"))
    return {github_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+?)\s*#*$", prose, re.MULTILINE)}


# --- checking one command -------------------------------------------------------------------------------------


def expand_synopsis(text: str) -> str:
    """A synopsis as a user types it: optional parts given, the first of alternatives, no ellipsis."""
    while True:
        expanded = re.sub(r"\[([^\[\]]*)\]", r"\1", text)
        if expanded == text:
            break
        text = expanded
    text = re.sub(r"(?<=[^\s|])\|\S+", "", text)  # md|json -> md (a pipe has spaces around it)
    return re.sub(r"(^|\s)\.\.\.(?=\s|$)", " ", text)


def segments(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ; && || |), redirections dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    result: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in SEPARATORS:
            result.append([])
        elif token in REDIRECTS or token.endswith(">"):
            skip_next = True
        else:
            result[-1].append(token)
    return [words for words in result if words]


def make_targets() -> set[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        rule = re.match(r"^([\w.$()/-]+(?:\s+[\w.$()/-]+)*)\s*:(?!=)", line)
        if rule:
            targets.update(rule.group(1).split())
    return targets


def parse_specchat(argv: list[str]) -> str | None:
    """None when the CLI parser accepts argv, else what it said (the parsing of `tui.cli.entry.main`)."""
    from tui.cli import entry

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse = getattr(entry, "parse_command_line", None) or getattr(entry, "parse_args", None)
            if parse is not None:
                parse(argv)
            else:  # as entry.main: find the subcommand, then parse with its own arguments
                chosen, _ = entry.build_parser().parse_known_args(argv)
                entry.build_parser(chosen.command).parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip() or f"exit {exc.code}"
    return None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def check_command(text: str) -> list[str]:
    """What is wrong with a documented command line (empty: it runs as written)."""
    problems: list[str] = []
    for words in segments(expand_synopsis(text)):
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]  # VAR=value before the program
        if not words:
            continue
        program, args = words[0], [PLACEHOLDERS.get(word, word) for word in words[1:]]
        if program in ("specchat", ".venv/bin/specchat"):
            said = parse_specchat(args)
            if said:
                problems.append(f"the CLI refuses `{' '.join(words)}`: {said}")
        elif program == "make":
            targets = make_targets()
            for word in args:
                if not word.startswith("-") and "=" not in word and word not in targets:
                    problems.append(f"the Makefile has no target `{word}`")
        elif program in ("python", "python3", ".venv/bin/python") and args[:1] == ["-m"] and len(args) > 1:
            if not _module_exists(args[1]):
                problems.append(f"no module `{args[1]}`")
        elif program in ("bash", "sh") and args and "/" in args[0]:
            if not (ROOT / args[0]).exists():
                problems.append(f"no file `{args[0]}`")
        elif (
            "/" in program and not program.startswith((".venv/", "~", "/")) and not (ROOT / program).exists()
        ):
            problems.append(f"no file `{program}`")
    return problems


ALL_COMMANDS = [command for doc in DOCS for command in commands_in(doc)]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=str)
def test_documented_command_runs_as_written(command: Command) -> None:
    assert check_command(command.text) == [], str(command)


def test_the_pages_have_commands_to_check() -> None:
    texts = {command.text for command in ALL_COMMANDS if command.doc == README}
    assert {"make run", "make test"} <= texts
    assert len(ALL_COMMANDS) > 40


def test_a_misspelt_command_fails() -> None:
    assert check_command("specchat benhc --quick")
    assert check_command("specchat bench --quik")
    assert check_command(".venv/bin/specchat --modle x")
    assert check_command("make tset")
    assert check_command("python -m engine.no_such_module")
    assert check_command("python -m no_such_package.module")
    assert check_command("scripts/no_such_script.sh")
    assert check_command("specchat history export ID [--format md|json] [-o FILE]") == []
    assert check_command("CMAKE_ARGS=-DGGML_METAL=on make install") == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_named_paths_exist(doc: Path) -> None:
    missing = [f"{line}: {path}" for line, path in paths_in(doc) if not list(ROOT.glob(path.rstrip("/")))]
    assert missing == [], f"{doc.relative_to(ROOT)} names files that do not exist"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    broken = []
    for line, link in links_in(doc):
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{line}: {link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors_of(path):
            broken.append(f"{line}: {link} (no such heading)")
    assert broken == [], f"{doc.relative_to(ROOT)} has broken links"


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


# --- keys -------------------------------------------------------------------------------------------------------

KEY_ALIASES = {"esc": "escape", "pgup": "pageup", "pgdn": "pagedown"}


def key_specs() -> dict[str, object]:
    """Every binding of tui/keymap.py's key tables, by id."""
    import tui.keymap as keymap

    specs: dict[str, object] = {}
    for value in vars(keymap).values():
        if (
            isinstance(value, tuple | list)
            and value
            and all(hasattr(v, "id") and hasattr(v, "key") for v in value)
        ):
            for spec in value:
                specs.setdefault(spec.id, spec)
    return specs


def _normal_key(key: str) -> str:
    *modifiers, base = key.strip().lower().split("+")
    return "+".join([*modifiers, KEY_ALIASES.get(base, base)])


def key_rows(doc: Path) -> list[tuple[set[str], list[str]]]:
    """(keys, binding ids) of each key-table row that names binding ids."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 3:
            continue
        ids = re.findall(r"`([a-z_]+\.[a-z_]+)`", cells[-1])
        if ids:
            words = re.split(r"[\s/,():]+", cells[0].lower())
            rows.append(({_normal_key(word) for word in words if word}, ids))
    return rows


def test_every_key_is_in_a_key_list() -> None:
    specs = key_specs()
    assert specs, "tui/keymap.py has no key table this test can read"
    documented = {binding_id for doc in (README, USAGE) for _, ids in key_rows(doc) for binding_id in ids}
    missing = sorted(set(specs) - documented)
    assert missing == [], f"bindings in no key list (README.md or docs/usage.md): {missing}"


@pytest.mark.parametrize("doc", [README, USAGE], ids=lambda doc: str(doc.relative_to(ROOT)))
def test_key_lists_match_the_keymap(doc: Path) -> None:
    specs = key_specs()
    wrong = []
    for keys, ids in key_rows(doc):
        for binding_id in ids:
            spec = specs.get(binding_id)
            if spec is None:
                wrong.append(f"{binding_id}: no such binding")
                continue
            default = {_normal_key(key) for key in spec.key.split(",")}
            if not default <= keys:
                wrong.append(f"{binding_id}: the keymap says {spec.key}, the row says {sorted(keys)}")
    assert wrong == [], f"{doc.relative_to(ROOT)}'s key list differs from tui/keymap.py"
