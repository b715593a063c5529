"""Where the repository and the tests' own files are, for tests anywhere under tests/ (never relative to a test's
own file, so a test moves without its paths changing)."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
DATA = SUPPORT / "data"
EXL2_STANDIN = SUPPORT / "exl2_standin"
EXL3_STANDIN = SUPPORT / "exl3_standin"
E2E = TESTS / "e2e"
SCRIPTS = ROOT / "scripts"
DOCS = ROOT / "docs"
SPECCHAT = ROOT / ".venv" / "bin" / "specchat"
