#!/usr/bin/env bash
# Fuzz the C entry points for a short fixed time (KVEVICT_FUZZ_SECONDS, default 60) with
# cargo-fuzz on the nightly toolchain; installs cargo-fuzz when missing (~2.5 min). The
# device entry points run the real kernels on the CPU emulator (feature cuda-emu; its
# aborts print "kvevict cuda-emu: ...").
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${KVEVICT_FUZZ_SECONDS:-60}
# fuzz/Cargo.toml's debug line tables, not scripts/test.sh's setting: a finding's stack trace keeps its lines
unset CARGO_PROFILE_RELEASE_DEBUG
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || true
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: skipped: no nightly toolchain could be installed"; exit 0
fi
# (three tries: a download that fails once should not fail the suite)
for try in 1 2 3; do
  cargo fuzz --help >/dev/null 2>&1 && break
  echo "fuzz: installing cargo-fuzz (try $try)"
  cargo install cargo-fuzz --locked -q || { [ $try -lt 3 ] && sleep 20; }
done
log=$(mktemp)
rc=0
bash fuzz/run.sh "$secs" >"$log" 2>&1 || rc=$?
grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss|stat::slowest|Slowest unit|ERROR|SUMMARY|panicked|cuda-emu:" "$log" || tail -n 30 "$log"
if [ $rc != 0 ]; then
  # what the finding was, and the input itself (base64): a CI log is all a failed run leaves
  grep -E -A 40 "==ERROR|panicked at|deadly signal|libFuzzer: (timeout|out-of-memory)" "$log" | head -n 80 || tail -n 80 "$log"
  for a in $(ls -t fuzz/artifacts/capi/* 2>/dev/null | head -n 2); do
    echo "reproducer $a (base64; decode it to FILE, then: cd fuzz && cargo +nightly fuzz run capi FILE):"
    base64 -w 100 "$a" | head -n 60
  done
fi
rm -f "$log"
exit $rc
