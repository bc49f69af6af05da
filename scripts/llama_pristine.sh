#!/usr/bin/env bash
# The pristine llama.cpp, built once: the source llama_fork/fetch.sh fetches (llama.cpp 0c1e57098,
# the one llama-cpp-python 0.3.36 vendors), CMake, CPU backend, GGML_NATIVE=OFF, Release, shared
# libraries (libllama, libggml, libggml-base, libggml-cpu; their RUNPATH $ORIGIN), installed to a
# prefix with llama.h, ggml*.h and the CMake packages lib/cmake/{llama,ggml}. Two users:
#   - c_examples/llama_cpp (scripts/test.d/40-llama.sh): find_package(llama) with this prefix on
#     CMAKE_PREFIX_PATH, a plain CMake consumer of an installed llama.cpp;
#   - the fork (llama_fork/build.sh): LLAMA_USE_SYSTEM_GGML=ON against this prefix's ggml (the
#     patches never touch ggml/), so ggml is compiled once for both.
#
# Where: a folder keyed by the inputs (fetch.sh, this script, the compilers' versions),
# ${KVEVICT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvevict}/llama-pristine-<key> (the cache
# folder of llama_fork/build.sh and scripts/lib/cargo_cache.sh), used under its lock (flock on
# <folder>.lock) and reused while its STAMP matches; without a usable cache folder (or with
# KVEVICT_CACHE_DIR=none) <repo>/build/llama-pristine. Keyed folders unused for 30 days are
# removed. The CMake build folder is removed once the prefix is installed (the key names the
# whole build: a new key is a new build; a failed build's folder is kept for the next try).
# Prints KVEVICT_LLAMA_PREFIX=<folder>/prefix on stdout (logs on stderr). Environment:
# KVEVICT_FORK_JOBS (2), KVEVICT_FORK_VENV (fetch.sh's venv: cmake, ninja).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${KVEVICT_FORK_JOBS:-2}
venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
log() { printf 'llama_pristine: %s\n' "$*" >&2; }

eval "$("$root/llama_fork/fetch.sh")"   # KVEVICT_LLAMA_SRC, and the venv with cmake and ninja
ROOT=$root . "$root/scripts/lib/cargo_cache.sh"   # kve_cache_dir
key=$( { cat "$root/llama_fork/fetch.sh" "$root/scripts/llama_pristine.sh"
         "${CC:-cc}" --version; "${CXX:-c++}" --version; } 2>&1 | sha256sum | cut -c1-16)

cache=$(kve_cache_dir)
if [ "$cache" != none ] && mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] && command -v flock >/dev/null; then
    dir=$cache/llama-pristine-$key
    exec 9> "$dir.lock"
    flock 9
    kve_cache_prune "$cache/llama-pristine-" STAMP "$dir"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)   # (CMake knows its build folder by the real path)
else
    dir=$root/build/llama-pristine
fi
prefix=$dir/prefix

if [ -f "$dir/STAMP" ] && [ "$(cat "$dir/STAMP")" = "$key" ] && [ -f "$prefix/lib/cmake/llama/llama-config.cmake" ]; then
    log "cached build ($key in $dir)"
    touch "$dir/STAMP"
    echo "KVEVICT_LLAMA_PREFIX=$prefix"
    exit 0
fi
t0=$(date +%s)
# (the STAMP and the prefix first: a failed or interrupted build is never reused; its CMake folder
# is, by the next build of this key, which then compiles only what is missing)
rm -rf "$dir/STAMP" "$prefix"
mkdir -p "$dir"
"$venv/bin/cmake" -S "$KVEVICT_LLAMA_SRC" -B "$dir/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_RPATH='$ORIGIN' >&2
"$venv/bin/cmake" --build "$dir/build" -j "$jobs" --target ggml >&2
log "ggml built in $(( $(date +%s) - t0 )) s"
"$venv/bin/cmake" --build "$dir/build" -j "$jobs" >&2
"$venv/bin/cmake" --install "$dir/build" >&2
rm -rf "$dir/build"
echo "$key" > "$dir/STAMP"
log "built and installed in $(( $(date +%s) - t0 )) s ($prefix)"
echo "KVEVICT_LLAMA_PREFIX=$prefix"
