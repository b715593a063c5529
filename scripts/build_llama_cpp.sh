#!/usr/bin/env bash
# Installs llama-cpp-python into $PYTHON's environment, built for this CPU from its sdist with specchat's patch
# (scripts/patch_llama_cpp.py: float32 activations for float16 weights, and one token computed exactly as a row
# of a batch of up to 64, float16 and quantized weights alike, repacked Q4_K included, so the exact speculative path
# needs no padded plain steps). The wheel is kept in
#   ${XDG_CACHE_HOME:-~/.cache}/specchat/wheels/llama-cpp-python-<version>-<edits hash>-<cpu hash>-<CMAKE_ARGS hash>/
# so a fresh checkout on the same machine installs in seconds. Where the patch does not apply or the patched build
# fails, the stock bindings are built instead (pip caches that wheel) and the reason is printed: specchat then finds
# at load that the kernels disagree and pads plain steps (exact, slower). A non-zero exit only when neither builds.
set -euo pipefail
VER="${LLAMA_CPP_PY_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specchat"
# Without OpenMP: ggml's own thread pool instead. With libgomp, once one thread (the main one, say, at load) has
# run llama.cpp, a decode from another thread (the chat's reply worker) runs 2x slower (19.7 -> 42 ms a token,
# SmolLM2 F16, 2 cores): the first thread's idle OpenMP worker still counts, so libgomp sees more threads than
# CPUs and spins only 100 times at each of the hundreds of barriers a token takes before sleeping. ggml's pool
# runs 19.9 ms from any thread.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_OPENMP=OFF}"
start=$(date +%s)
hash12() { "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:12])'; }
cpu_key=$( (grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m) | hash12)
patch_key=$("$PY" "$HERE/patch_llama_cpp.py" --key)  # a hash of the edits the patch makes
args_key=$(echo "$CMAKE_ARGS" | hash12 | cut -c1-8)
WHEELS="$CACHE/wheels/llama-cpp-python-$VER-$patch_key-$cpu_key-$args_key"

# The flags of the CPU the library was compiled for (-march=native), beside the installed package: specchat refuses
# to load it on a CPU that lacks one of its instruction sets (engine/backends/llamacpp/library.py) instead of dying.
record_cpu() {
  local pkg
  pkg=$("$PY" -c 'import importlib.util; print(importlib.util.find_spec("llama_cpp").submodule_search_locations[0])') || return 0
  (grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) > "$pkg/specchat-build-cpu.txt"
}

stock() {
  echo "llama.cpp bindings: $1; building the stock $VER instead (exact plain steps then run as padded batches)"
  "$PY" -m pip install --quiet "llama-cpp-python==$VER"
  record_cpu
}

mkdir -p "$CACHE/wheels"
if command -v flock >/dev/null 2>&1; then  # two installs at once: the second waits, then finds the first's wheel
  exec 9>"$CACHE/wheels/.lock"
  flock 9
fi
wheel=$(ls "$WHEELS"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  echo "llama.cpp bindings: fetching the llama-cpp-python $VER sdist (pip cache first)..."
  if ! "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$WORK"; then
    stock "the sdist could not be fetched"
    exit 0
  fi
  tar -xzf "$WORK"/llama_cpp_python-"$VER".tar.gz -C "$WORK"
  SRC="$WORK/llama_cpp_python-$VER"
  if ! "$PY" "$HERE/patch_llama_cpp.py" "$SRC/vendor/llama.cpp"; then
    stock "the patch did not apply"
    exit 0
  fi
  echo "llama.cpp bindings: compiling the patched $VER for this CPU (about 8 minutes on 2 cores)..."
  mkdir -p "$WHEELS.tmp"
  if ! "$PY" -m pip wheel --quiet --no-deps "$SRC" -w "$WHEELS.tmp" >"$WORK/build.log" 2>&1; then
    tail -5 "$WORK/build.log" >&2
    rm -rf "$WHEELS.tmp"
    stock "the patched build failed"
    exit 0
  fi
  rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
  wheel=$(ls "$WHEELS"/llama_cpp_python-*.whl | head -1)
fi
"$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$PY" -m pip install --quiet "$wheel"  # its dependencies (numpy, jinja2, diskcache), where missing
record_cpu  # the wheel's folder is keyed by this CPU's flags: it was compiled for them
echo "llama.cpp bindings ready, patched (took $(( $(date +%s) - start )) s): $wheel"
