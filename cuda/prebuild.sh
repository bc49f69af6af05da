#!/usr/bin/env bash
# Builds, on a machine without a GPU, the binaries cuda/check.sh runs on the GPU machine
# (which may lack cargo): build/gpu/device (the launchers, stream included),
# build/gpu/capi_cuda and build/gpu/capi_cuda_links (the GPU test binaries) and
# build/gpu/kvevict_bench. Carry them with run(carry=["build/gpu"]).
# Archs: KVEVICT_CUDA_ARCHS (default 90, the H200). Needs nvcc: $NVCC or
# cuda/install_nvcc.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export KVEVICT_CUDA_ARCHS=${KVEVICT_CUDA_ARCHS:-90}
if [ -z "${NVCC:-}" ]; then
  NVCC="$(bash cuda/install_nvcc.sh)/bin/nvcc"
fi
export NVCC
LIBDIR=$(dirname "$(dirname "$NVCC")")/lib
mkdir -p build/gpu
cargo test --release --features cuda --test device --test capi_cuda --test capi_cuda_links --no-run 2>&1 | tail -3
for t in device capi_cuda capi_cuda_links; do
  bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/$t-* | grep -v '\.d$' | head -1)
  cp "$bin" build/gpu/$t
  strip --strip-debug build/gpu/$t 2>/dev/null || true
done
archflags=""
for a in ${KVEVICT_CUDA_ARCHS//,/ }; do archflags+=" -gencode=arch=compute_$a,code=sm_$a"; done
"$NVCC" -O3 -std=c++17 $archflags -Icuda -L"$LIBDIR" cuda/bench.cu $(ls cuda/*.cu | grep -v bench.cu) -o build/gpu/kvevict_bench
ls -la build/gpu
