#!/usr/bin/env bash
# The REAL kernels of cuda/ without a GPU: feature cuda-emu compiles cuda/*.cu with the
# host C++ compiler against cuda/emu (an emulated CUDA runtime and device language:
# blocks in turn, threads as coroutines meeting at __syncthreads / warp collectives /
# WMMA, guard pages, capture rules; see cuda/emu/emu.cpp), and the GPU test suites run
# against the CPU core exactly as on a GPU. First the emulator's own self-test, then the
# suites on sm_90's shared-memory limit in thread order, then again with threads in
# reverse order (a result that changes is a missing barrier) on the 99 KiB limit of
# sm_86 / sm_89 (the launchers' smaller plans), the launcher suite on sm_80's 163 KiB in
# shuffled order, then the kernels under UBSan in shuffled
# order (misaligned vector accesses, which fault on a GPU; out-of-bounds static shared
# arrays; overflow).
set -euo pipefail
cd "$(dirname "$0")/../.."
tests=(--test cuda_emu --test device --test capi_cuda --test capi_cuda_links)
filter='^test |test result|panicked|cuda-emu:|error'
echo "-- sm_90 limit (227 KiB), forward block and thread order"
cargo test --release --features cuda-emu "${tests[@]}" --test c_examples --test launcher_decls -- --nocapture 2>&1 | grep -E "$filter"
echo "-- sm_86/89 limit (99 KiB), reverse block and thread order"
KVEVICT_EMU_SMEM_OPTIN=101376 KVEVICT_EMU_ORDER=reverse \
  cargo test --release --features cuda-emu "${tests[@]}" 2>&1 | grep -E "$filter"
echo "-- sm_80 limit (163 KiB), shuffled block and thread order"
KVEVICT_EMU_SMEM_OPTIN=166912 KVEVICT_EMU_ORDER=shuffle \
  cargo test --release --features cuda-emu --test device 2>&1 | grep -E "$filter"
echo "-- UBSan, shuffled block and thread order"
KVEVICT_EMU_SANITIZE=undefined KVEVICT_EMU_ORDER=shuffle \
  cargo test --release --features cuda-emu --test device 2>&1 | grep -E "$filter|runtime error"
