#!/usr/bin/env bash
# The public CUDA entry points without a GPU: the C API's device paths run on the
# plain-Rust test double of the launchers (feature cuda-mock, src/cuda/mock.rs) and are
# compared with the host C API for every scorer, allocator, granularity, dtype and layout.
# What this proves: the chains of launches, strides and buffers; not the kernels (those
# run on the emulator in 07-cuda-emu.sh, and on a GPU in cuda/check.sh). The double's one
# remaining user is the llama.cpp fork's device-path test (45-llama-fork.sh); these suites
# hold it to the launchers' contract.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --release --features cuda-mock --test cuda_capi --test device --test links_device -- --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|worst|selections|error"
# the CUDA C example end to end (host stand-ins for the six cudart calls it makes)
cargo test --release --features cuda-mock --test c_examples cuda_device -- --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|LaProx-span|error"
