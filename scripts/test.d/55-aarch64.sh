#!/usr/bin/env bash
# The core on AArch64 (issue 31): cross-compiles the unit tests and the f64 reference tests
# for aarch64-unknown-linux-gnu, where the kernels take the NEON path, and runs them under
# qemu-user. Installs what it needs: the Rust target, Debian's gcc-aarch64-linux-gnu (the
# linker) and qemu-user (apt-get, when missing and run as root). Speed on ARM cannot be
# measured this way (qemu emulates); `bench_cpu --arm` prints what to run on an ARM machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=aarch64-unknown-linux-gnu
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
t0=$(date +%s)
# the library's unit tests (NEON against the portable kernels and the scalar lane order,
# bit for bit) and every scorer against the f64 reference, on the NEON kernels
log=$(mktemp)
rc=0
cargo test --release --target "$T" --lib --test reference_scores >"$log" 2>&1 || rc=$?
grep -E "^test result|FAILED|panicked" "$log" || tail -n 40 "$log"
[ $rc = 0 ] || { tail -n 60 "$log"; rm -f "$log"; echo "aarch64: FAILED"; exit $rc; }
rm -f "$log"
echo "aarch64: NEON unit + reference tests passed under qemu in $(( $(date +%s) - t0 )) s"
