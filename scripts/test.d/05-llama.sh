#!/usr/bin/env bash
# llama.cpp integration: the pristine llama.cpp (scripts/llama_pristine.sh, built once and cached
# by its inputs; the fork's build links its ggml) + the GGUF models (scripts/setup_llama.sh),
# install kvevict to a temporary prefix (scripts/install.sh), build
# c_examples/llama_cpp with its CMakeLists.txt (find_package(llama), find_package(kvevict)),
# then run tests/llama_cpp.rs against that binary: the needle at 10% keep and the
# decode-time budget.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
t0=$(date +%s)

paths=$(scripts/setup_llama.sh)   # KVEVICT_LLAMA_VENV, KVEVICT_LLAMA_PREFIX, KVEVICT_LLAMA_MODEL, KVEVICT_LLAMA_GEMMA
eval "$paths"
export KVEVICT_LLAMA_VENV KVEVICT_LLAMA_PREFIX KVEVICT_LLAMA_MODEL KVEVICT_LLAMA_GEMMA
echo "llama setup: $(( $(date +%s) - t0 )) s (venv $KVEVICT_LLAMA_VENV)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the libkvevict.a/.so installed are the ones `cargo test --release` built for its tests
# (target/release/deps), as tests/c_examples.rs does: right after the cargo test step they are
# fresh, so this step compiles no kvevict (an install.sh build, panic=abort, and then this test's
# panic=unwind build replaced each other in target/release: two compiles of the crate)
cargo test --release --test llama_cpp --no-run 2>&1 | tail -n 1
KVEVICT_INSTALL_FROM=$root/target/release/deps scripts/install.sh "$work/prefix" >/dev/null
"$KVEVICT_LLAMA_VENV/bin/cmake" -S c_examples/llama_cpp -B "$work/build" \
    -DCMAKE_PREFIX_PATH="$KVEVICT_LLAMA_PREFIX;$work/prefix" >/dev/null
"$KVEVICT_LLAMA_VENV/bin/cmake" --build "$work/build" -j 2 >/dev/null
export KVEVICT_LLAMA_EXAMPLE="$work/build/kvevict_llama"
echo "built $KVEVICT_LLAMA_EXAMPLE with CMake ($(( $(date +%s) - t0 )) s so far)"

cargo test --release --test llama_cpp -- --nocapture --test-threads 1 2>&1
echo "llama step: $(( $(date +%s) - t0 )) s"
