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
exec cargo +nightly fuzz run capi corpus/capi seeds/capi -- \
    -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$@"
