#!/usr/bin/env bash
# The core on AArch64 (issue 31): cross-compiles the library's unit tests and every integration
# test of the core (tests/*.rs and tests/*/main.rs, less the ones listed below) for
# aarch64-unknown-linux-gnu, where the kernels take the NEON path (the unit test
# aarch64_takes_the_neon_kernels checks it), and runs them under qemu-user. Installs what it
# needs: the Rust target, Debian's gcc-aarch64-linux-gnu (the linker) and qemu-user (apt-get,
# when missing and run as root). Speed on ARM cannot be measured this way (qemu emulates);
# `bench_cpu --arm` prints what to run on an ARM machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=aarch64-unknown-linux-gnu
# not the core's: they build or run host programs (C examples, llama.cpp, the fork, the CUDA
# emulator, the header's C compile) or need the cuda feature (empty without it)
skip=" c_examples llama_cpp llama_fork decode_bench cuda_emu header capi_cuda capi_cuda_links launcher_decls device "
rustup target add "$T" >/dev/null 2>&1 || true
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
  fi
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  echo "aarch64: skipped: needs gcc-aarch64-linux-gnu and qemu-user (apt-get as root)"; exit 0
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
tests=()
for f in tests/*.rs tests/*/main.rs; do
  n=${f#tests/}; n=${n%.rs}; n=${n%/main}
  [[ "$skip" == *" $n "* ]] || tests+=(--test "$n")
done
t0=$(date +%s)
log=$(mktemp)
rc=0
cargo test --release --target "$T" --no-fail-fast --lib "${tests[@]}" >"$log" 2>&1 || rc=$?
grep -E "^test result|FAILED|panicked" "$log" || tail -n 40 "$log"
[ $rc = 0 ] || { tail -n 60 "$log"; rm -f "$log"; echo "aarch64: FAILED"; exit $rc; }
rm -f "$log"
echo "aarch64: NEON unit tests and $(( ${#tests[@]} / 2 )) test files of the core passed under qemu in $(( $(date +%s) - t0 )) s"
