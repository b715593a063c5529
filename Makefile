# specchat — two commands: `make run` and `make test`.
# The PyTorch build is picked by scripts/install_torch.py, which says which and why: the CUDA build where
# `nvidia-smi` lists a GPU, else a CPU build where one is reachable (else plain torch). TORCH_SPEC=... overrides.
PYTHON ?= python3
TORCH_SPEC ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama.cpp bindings, built from source for this machine's CPU with specchat's patch (scripts/patch_llama_cpp.py;
# about 8 minutes on 2 cores, the wheel kept in ~/.cache/specchat/wheels/); the stock build where the patch fails.
LLAMA_CPP_VERSION ?= 0.3.36

.PHONY: install run test test-fast bench lint format fetch gpu-check gpu-bundle clean llama-server

install: $(STAMP)

$(STAMP): pyproject.toml Makefile scripts/install_torch.py scripts/build_llama_cpp.sh scripts/patch_llama_cpp.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python scripts/install_torch.py
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for this CPU, with specchat's patch (minutes; a failure here is not fatal)..."; start=$$(date +%s); \
	if PYTHON=$(BIN)/python LLAMA_CPP_PY_VERSION=$(LLAMA_CPP_VERSION) bash scripts/build_llama_cpp.sh; \
	then :; \
	else echo "note: llama-cpp-python $(LLAMA_CPP_VERSION) failed to build after $$(( $$(date +%s) - start )) s; --backend auto falls back to transformers (docs/troubleshooting.md)"; fi
	@command -v tmux >/dev/null 2>&1 || echo "note: tmux not found; the terminal end-to-end test will be skipped (install tmux to run it, e.g. sudo apt-get install tmux)"
	$(BIN)/specchat fetch
	touch $(STAMP)

fetch: install
	$(BIN)/specchat fetch

run: install
	$(BIN)/specchat

# pytest's workers: one per core this process may use, at most 4 (none on one core). tests/conftest.py gives each
# worker its share of the cores, and llama.cpp and torch size their threads from it; the few tests about llama.cpp's
# thread count (marked all_cores) run after the rest, alone. `--dist loadgroup`: a module's tests run on one worker
# (split by its module-scoped params: each engine of the exactness harness), which builds its fixtures once.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)); print(min(4, n) if n > 1 else 0)" 2>/dev/null || echo 0)

test: lint
	@$(MAKE) --no-print-directory llama-server
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup -m "not all_cores"
	$(BIN)/python -m pytest -q --durations=5 -m all_cores

# llama.cpp's llama-server (CPU), for the remote backend's real-server tests: built once into
# ~/.cache/specchat/llama-server-<version>/ (about half an hour on 2 busy cores). Not fatal: without it those
# tests skip and say why.
llama-server:
	@PYTHON=$(BIN)/python bash scripts/build_llama_server.sh || echo "note: llama-server did not build; the real-server tests of the remote backend will skip (docs/troubleshooting.md)"

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

# An offline GPU check's bundle (<= 64 MiB): run `scripts/gpu_check.sh --offline gpu-bundle` on the CUDA machine.
# GPU_BUNDLE_ARGS="--prebuilt-ext DIR" adds exllamav2_ext / exllamav3_ext built ahead for sm_90 ("--build-ext" builds
# them here first: hours on 2 cores); `bash scripts/gpu_check.sh --dry-run` prints the check's steps and times.
GPU_BUNDLE_ARGS ?=
gpu-bundle: install
	$(BIN)/python scripts/gpu_bundle.py gpu-bundle $(GPU_BUNDLE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info gpu-bundle
