#!/usr/bin/env bash
# Fuzz the C entry points for a fixed time: fuzz/run.sh SECONDS [extra libFuzzer args]
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Prints libFuzzer's final stats; exits non-zero when a crash or a broken invariant is found
# (the reproducer lands in fuzz/artifacts/capi/).
set -euo pipefail
secs=${1:?usage: fuzz/run.sh SECONDS}
shift
cd "$(dirname "$0")"
mkdir -p corpus/capi
# seeds/capi: valid inputs the fuzzer mutates from (the paged op's need a layout, a table
# and lists that agree, rarely found from scratch); new units go to corpus/capi
# -timeout=60: the device ops run the kernels on the CPU emulator; when its thread switches were
# swapcontext (ASan's interceptor clears the shadow of a 256 KiB stack at each), a small
# kve_cuda_select_model input took ~0.7 s of CPU, and >12 s on a loaded machine, which
# -timeout=10 reported as a finding (2026-12-06); a real hang still stops at 60 s
# detect_stack_use_after_return=0: the emulator then takes its fast stack switch (with ASan's
# fiber hooks) instead of swapcontext, ~5x the device ops' speed (the corpus replayed:
# 20.9 -> 4.2 s, 2026-12-06); the fuzzed code is Rust, whose safe code cannot return a local's
# address, and the C ABI's pointer checks do not depend on it
export ASAN_OPTIONS="detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
exec cargo +nightly fuzz run capi corpus/capi seeds/capi -- \
    -max_total_time="$secs" -max_len=4096 -timeout=60 -report_slow_units=5 -rss_limit_mb=2048 \
    -print_final_stats=1 "$@"
