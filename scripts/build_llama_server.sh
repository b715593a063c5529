#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only, no web UI, no network features) from the llama.cpp source that the
# llama-cpp-python sdist carries, once, into a cache folder keyed by version:
#   ${SPECCHAT_LLAMA_SERVER_DIR:-~/.cache/specchat/llama-server-<ver>}/bin/llama-server
# Used by the remote backend's real-server tests and by `specchat bench --remote`. Idempotent: exits at once when the
# binary is already there. Prints how long the build took. Exit status 1 when the build failed (the Makefile treats
# that as non-fatal; the tests that need the binary then skip and say why).
set -euo pipefail
VER="${LLAMA_CPP_PY_VERSION:-0.3.36}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specchat"
DEST="${SPECCHAT_LLAMA_SERVER_DIR:-$CACHE/llama-server-$VER}"
BIN="$DEST/bin/llama-server"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
if [ -x "$BIN" ]; then echo "llama-server $VER ready: $BIN"; exit 0; fi
mkdir -p "$DEST"
exec 9>"$DEST/.lock"
flock 9
if [ -x "$BIN" ]; then echo "llama-server $VER ready: $BIN"; exit 0; fi
start=$(date +%s)
rm -f "$DEST/FAILED"
# A failure leaves its reason in FAILED (the tests that need the binary quote it when they skip).
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "build failed after $(( $(date +%s) - start )) s (exit $rc); log: $WORK" >"$DEST/FAILED"; fi' EXIT
WORK="$DEST/work"
mkdir -p "$WORK"  # an interrupted build's folder is kept: ninja goes on where it stopped
SRC="$WORK/llama_cpp_python-$VER/vendor/llama.cpp"
if [ ! -f "$SRC/tools/server/server.cpp" ]; then
  echo "llama-server: fetching the llama-cpp-python $VER sdist (pip cache first)..."
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$WORK"
  tar -xzf "$WORK"/llama_cpp_python-"$VER".tar.gz -C "$WORK"
fi
test -f "$SRC/tools/server/server.cpp" || { echo "llama-server: no tools/server in $SRC" >&2; exit 1; }
echo "llama-server: configuring (CPU, no web UI, no curl/openssl)..."
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE="${GGML_NATIVE:-ON}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF >"$WORK/configure.log" 2>&1 \
  || { tail -20 "$WORK/configure.log" >&2; exit 1; }
echo "llama-server: compiling with $JOBS jobs (many minutes on 2 cores)..."
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$VER" >"$DEST/VERSION"
rm -rf "$WORK"
echo "llama-server $VER built in $(( $(date +%s) - start )) s: $BIN"
