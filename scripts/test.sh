#!/usr/bin/env bash
# The whole test suite, on a fresh machine (no GPU needed). Installs what it needs:
# the thumbv7em target, the pinned PyPI nvcc 13.0 (CUDA compile + link proof), Python
# venvs for the binding and the evaluation smoke test, llama.cpp from PyPI.
# Steps can be skipped with KVEVICT_SKIP="cuda-mock cuda-emu cuda python torch docs python-cuda-emu llama llama-fork eval fuzz" (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
skip() { [[ " ${KVEVICT_SKIP:-} " == *" $1 "* ]]; }
step() { printf '\n==== %s ====\n' "$*"; }
t0=$(date +%s)

step "core + C ABI + reference + conformance tests (cargo test)"
cargo test --release 2>&1 | tail -n 400

step "no_std proof: core for thumbv7em-none-eabihf"
rustup target add thumbv7em-none-eabihf >/dev/null 2>&1 || true
cargo rustc --release --lib --no-default-features --target thumbv7em-none-eabihf --crate-type rlib

for s in scripts/test.d/*.sh; do
  [ -e "$s" ] || continue
  name=$(basename "$s" .sh); name=${name#*-}
  if skip "$name"; then step "$name: skipped (KVEVICT_SKIP)"; continue; fi
  step "$name"
  bash "$s"
done

step "all passed in $(( $(date +%s) - t0 )) s"
