#!/usr/bin/env bash
# CUDA: compile every kernel for sm_90 (KVEVICT_CUDA_ARCHS, default here 90: the GPU machines'
# arch) with the pinned PyPI nvcc 13.0, link, and run the GPU tests and the C examples with the
# feature on. The default fat binary (sm_80/86/89/90 + PTX) is not built here: it compiled every
# kernel four times (~7 min on a kernel-cache miss), and cuda/ptx_check.sh below compiles every
# source for each of those archs anyway, so a kernel that fails on one arch still fails the step.
# Without a GPU the GPU tests print "skipped: no CUDA device" and pass; compile and link
# are still proven. Then cuda/ptx_check.sh: the 16-byte tile loaders on the host, and per
# arch no local-memory spills, 128-bit loads in the tile kernels, shared memory within
# each arch's limit for the documented shapes. On the GPU machine use cuda/check.sh
# (sanitizers, benchmark).
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA_ROOT=$(bash cuda/install_nvcc.sh)
export NVCC="$CUDA_ROOT/bin/nvcc"
export KVEVICT_CUDA_ARCHS=${KVEVICT_CUDA_ARCHS:-90}
echo "nvcc: $("$NVCC" --version | tail -n 1)"
# (no separate `cargo build --release --features cuda` first: cargo test builds the library's
# every crate type, rlib, staticlib and cdylib, with the kernels linked in, and c_examples links
# the C examples against those; the separate build compiled the crate once more, for panic=abort)
cargo test --release --features cuda --test device --test capi_cuda --test c_examples --test capi_cuda_links -- --nocapture 2>&1 | grep -E "skipped|^test |test result|panicked|error" 
bash cuda/ptx_check.sh
