# specchat — two commands: `make run` and `make test`.
# TORCH_SPEC picks the PyTorch build. Plain `torch` is what a user with a GPU wants; on a CPU-only machine pass
# e.g. TORCH_SPEC=torch==2.13.0 (CI does) or a CPU wheel index to avoid the multi-GB CUDA build.
PYTHON ?= python3
TORCH_SPEC ?= torch
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast bench lint format fetch gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@command -v tmux >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1) || echo "note: tmux not found; the terminal end-to-end test will be skipped"
	$(BIN)/specchat fetch
	touch $(STAMP)

fetch: install
	$(BIN)/specchat fetch

run: install
	$(BIN)/specchat

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/specchat bench --quick --ui

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
