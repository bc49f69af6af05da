#!/usr/bin/env bash
# The REAL kernels of cuda/ without a GPU: feature cuda-emu compiles cuda/*.cu with the
# host C++ compiler against cuda/emu (an emulated CUDA runtime and device language:
# blocks in turn, threads as coroutines meeting at __syncthreads / warp collectives /
# WMMA, guard pages, capture rules; see cuda/emu/emu.cpp), and the GPU test suites run
# against the CPU core exactly as on a GPU. Four passes:
#  1. the emulator's own self-test and the suites on sm_90's shared-memory limit in thread order
#     (with the C examples and the launcher declarations);
#  2. the suites again with threads in reverse order (a result that changes is a missing
#     barrier) on the 99 KiB limit of sm_86 / sm_89 (the launchers' smaller plans);
#  3. the launcher suite on sm_80's 163 KiB in shuffled order;
#  4. the launcher suite with the kernels under UBSan in shuffled order (misaligned vector
#     accesses, which fault on a GPU; out-of-bounds static shared arrays; overflow).
# The emulator runs one kernel at a time per process (a launch holds its lock), so one test
# process keeps about one core busy: the passes run as separate processes, KVEVICT_EMU_JOBS at
# a time (default: the number of cores), each pass's output printed whole when it ends. Passes
# 1-3 share one build (their differences are environment variables the emulator reads at run
# time); the UBSan pass has its own target folder (target/emu-ubsan), so neither build replaces
# the other (in one folder each switch recompiled kvevict), and it is compiled while the other
# passes run.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# pass N: runs pass N, its output (cargo's too) into $logs/N.log; when it ends, prints its title,
# seconds and test lines (one pass at a time: a pass cut by CI's time limit leaves the others' in
# the log) and keeps its exit status in $logs/N.rc
pass() {
  local n=$1 s rc=0 tests=(--test cuda_emu --test device --test capi_cuda --test capi_cuda_links)
  local titles=("" "sm_90 limit (227 KiB), forward block and thread order"
                "sm_86/89 limit (99 KiB), reverse block and thread order"
                "sm_80 limit (163 KiB), shuffled block and thread order"
                "UBSan, shuffled block and thread order (target/emu-ubsan)")
  s=$(date +%s)
  case $n in
    1) env -u KVEVICT_EMU_SANITIZE -u KVEVICT_EMU_ORDER -u KVEVICT_EMU_SMEM_OPTIN \
         cargo test --release --features cuda-emu "${tests[@]}" --test c_examples --test launcher_decls \
         -- --nocapture ;;
    2) env -u KVEVICT_EMU_SANITIZE KVEVICT_EMU_SMEM_OPTIN=101376 KVEVICT_EMU_ORDER=reverse \
         cargo test --release --features cuda-emu "${tests[@]}" ;;
    3) env -u KVEVICT_EMU_SANITIZE KVEVICT_EMU_SMEM_OPTIN=166912 KVEVICT_EMU_ORDER=shuffle \
         cargo test --release --features cuda-emu --test device ;;
    4) env -u KVEVICT_EMU_SMEM_OPTIN KVEVICT_EMU_SANITIZE=undefined KVEVICT_EMU_ORDER=shuffle \
         CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/emu-ubsan" \
         cargo test --release --features cuda-emu --test device ;;
  esac >"$logs/$n.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$n.rc"
  {
    flock 9
    echo "-- pass $n: ${titles[$n]}: $(( $(date +%s) - s )) s$([ "$rc" = 0 ] || echo ", FAILED (exit $rc)")"
    grep -E '^test |test result|panicked|cuda-emu:|error|runtime error' "$logs/$n.log" || true
    if [ "$rc" != 0 ]; then
      echo "-- pass $n failed: the end of its output"
      tail -n 80 "$logs/$n.log"
    fi
  } 9>"$logs/print.lock"
  return 0
}
export -f pass
export logs root

# The UBSan pass first: its build (kvevict and the launcher suite again, the kernels from the
# kernel cache or compiled) overlaps pass 1's build and run. Passes 2 and 3 wait for pass 1's
# build through cargo's lock on the target folder, never for its tests.
jobs=${KVEVICT_EMU_JOBS:-$(nproc)}
printf '%s\n' 4 1 2 3 | xargs -P "$jobs" -I{} bash -c 'pass {}'

failed=()
for n in 1 2 3 4; do
  [ "$(cat "$logs/$n.rc" 2>/dev/null)" = 0 ] || failed+=("$n")
done
[ ${#failed[@]} = 0 ] || { echo "cuda-emu: FAILED passes: ${failed[*]}"; exit 1; }
