#!/usr/bin/env bash
# Builds eval/decode/kvevict_decode_bench.cpp out of tree against a built kvevict fork of llama.cpp
# (llama_fork/build.sh): headers from its source, libllama and libggml* from its build/bin (rpath).
#   KVEVICT_FORK_DIR   the fork's folder (with src/ and build/bin/); default: the newest
#                      ${KVEVICT_CACHE_DIR:-~/.cache/kvevict}/llama-fork-*, else build/llama-fork
#   KVEVICT_DECODE_OUT the binary (default build/decode/kvevict_decode_bench)
# Prints KVEVICT_DECODE_BIN=<path>.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fork=${KVEVICT_FORK_DIR:-}
if [ -z "$fork" ]; then
    cache=${KVEVICT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvevict}
    fork=$(ls -dt "$cache"/llama-fork-*/ 2>/dev/null | head -1 || true)
    fork=${fork%/}
    [ -n "$fork" ] || fork=$root/build/llama-fork
fi
for p in "$fork/src/include/llama.h" "$fork/build/bin"; do
    [ -e "$p" ] || { echo "build.sh: no built fork at $fork (missing $p): run llama_fork/build.sh" >&2; exit 1; }
done
# a fork built against the pristine build's shared ggml (LLAMA_USE_SYSTEM_GGML, llama_fork/build.sh) has no
# libggml* in its build/bin: link and rpath the folder libllama itself loads them from
ggml=$fork/build/bin
if ! ls "$ggml"/libggml-base.so* >/dev/null 2>&1; then
    ggml=$(ldd "$fork/build/bin/libllama.so" | sed -n 's|.*libggml-base\.so[^ ]* => \(.*\)/libggml-base\.so.*|\1|p' | head -1)
    [ -n "$ggml" ] || { echo "build.sh: libllama of $fork loads no libggml-base" >&2; exit 1; }
fi
out=${KVEVICT_DECODE_OUT:-$root/build/decode/kvevict_decode_bench}
mkdir -p "$(dirname "$out")"
${CXX:-g++} -O2 -std=c++17 -Wall -Wextra -I"$fork/src/include" -I"$fork/src/ggml/include" \
    "$root/eval/decode/kvevict_decode_bench.cpp" -L"$fork/build/bin" -L"$ggml" -lllama -lggml -lggml-base \
    -Wl,-rpath,"$fork/build/bin" -Wl,-rpath,"$ggml" -o "$out"
echo "KVEVICT_DECODE_BIN=$out"
