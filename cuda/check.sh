#!/usr/bin/env bash
# The one script for a GPU machine (built for the lent H200, CUDA 13.0 driver).
# Builds the kernels, runs the GPU-vs-CPU tests, compute-sanitizer memcheck and
# racecheck over the test binary, then the Llama-3-8B-shaped benchmark
# (cuda/bench.cu) at N = 32k and 128k and the same math in PyTorch.
# Whole run: well under 8 minutes on an H200 (the cargo build is the long part).
#
# What it needs, in order of preference (the GPU machine may have no internet,
# no cargo, and no project venv):
#   nvcc:  $NVCC; else nvcc on PATH or /usr/local/cuda/bin/nvcc (the CUDA image has
#          13.0); else a carried .venv-nvcc ($KVEVICT_NVCC_VENV); else
#          cuda/install_nvcc.sh (needs PyPI, or KVEVICT_NVCC_WHEELS=<dir of wheels>).
#   tests: cargo if present (cargo test --release --features cuda --test device);
#          else a prebuilt test binary build/gpu/device (made on a dev machine by
#          cuda/prebuild.sh and carried: run(carry=["build/gpu"]); the binary links
#          cudart statically and needs only glibc).
#   bench: build/gpu/kvevict_bench if carried (KVEVICT_REBUILD_BENCH=1 rebuilds it),
#          else built here with nvcc.
# Environment: KVEVICT_CUDA_ARCHS (default 90 here), CHECK_N (default 32768,131072),
#   CHECK_SKIP="tests sanitizer bench torch" to leave steps out.
# Output: a summary at the end, with every benchmarked stage's ms, GB/s and TFLOP/s
# against the H200 roofline (HBM 4.8 TB/s, 990 TFLOP/s dense f16) beside PyTorch's time
# for the same stage in the same run; logs in build/gpu/logs, and the main ones (7
# files: the device tool brings back 8) copied to $OUT when it is set.
# Exit status: 1 when a GPU is listed (nvidia-smi) and a step fails, errors, or cannot
# run on it (tests, C API tests, stream tests, sanitizer errors, the benchmark, the
# PyTorch version when torch imports); 0 otherwise. Without a listed GPU, steps that
# cannot run are noted, not failures.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG=$ROOT/build/gpu/logs
mkdir -p "$LOG" build/gpu
# this run's logs only (a stale torch.log would set an old run's times beside this one's)
rm -f "$LOG"/*.log "$LOG"/*.txt
export KVEVICT_CUDA_ARCHS=${KVEVICT_CUDA_ARCHS:-90}
CHECK_N=${CHECK_N:-32768,131072}
declare -a SUMMARY
say() { printf '\n==== %s ====\n' "$*"; }
note() { SUMMARY+=("$*"); }
FAILED=0
fail() { SUMMARY+=("$*"); FAILED=1; }
GPU_LISTED=0
# with a GPU listed a step that cannot run fails the check; without one it is only noted
need() { if [ "$GPU_LISTED" = 1 ]; then fail "$*"; else note "$*"; fi; }
skip() { [[ " ${CHECK_SKIP:-} " == *" $1 "* ]]; }
t0=$(date +%s)
# The whole script stays within CHECK_BUDGET_S (default 420 s): each step's timeout is
# its own limit or what is left, and a step with under 20 s left is skipped.
CHECK_BUDGET_S=${CHECK_BUDGET_S:-420}
tmo() {  # tmo LIMIT -> seconds for the next step (1: no time left, the step is cut)
  local left=$(( CHECK_BUDGET_S - ($(date +%s) - t0) ))
  if [ "$left" -lt 20 ]; then echo 1; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | head -3
# A GPU listed by the driver: the tests must run on it, so "no device" from the CUDA runtime
# (e.g. a driver too old for the static cudart 13) fails them instead of skipping them.
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  GPU_LISTED=1
  export KVEVICT_REQUIRE_GPU=${KVEVICT_REQUIRE_GPU:-1}
  echo "GPU listed by nvidia-smi: KVEVICT_REQUIRE_GPU=$KVEVICT_REQUIRE_GPU (no device = failure)"
fi

# ---------------------------------------------------------------- nvcc --
find_nvcc() {
  if [ -n "${NVCC:-}" ] && [ -x "$NVCC" ]; then echo "$NVCC"; return 0; fi
  local c
  for c in "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ]; then readlink -f "$c"; return 0; fi
  done
  local venv=${KVEVICT_NVCC_VENV:-$ROOT/.venv-nvcc}
  for c in "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do
    if [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  local root
  if root=$(bash cuda/install_nvcc.sh 2>"$LOG/install_nvcc.log"); then
    echo "$root/bin/nvcc"; return 0
  fi
  return 1
}
if NVCC=$(find_nvcc); then
  export NVCC
  echo "nvcc: $NVCC"; "$NVCC" --version | tail -2
  NVROOT=$(dirname "$(dirname "$NVCC")")
  LIBDIR=""
  for d in "$NVROOT/lib64" "$NVROOT/lib" "$NVROOT/targets/x86_64-linux/lib"; do
    [ -f "$d/libcudart_static.a" ] && { LIBDIR=$d; break; }
  done
  [ -n "$LIBDIR" ] && export KVEVICT_CUDA_LIB_DIR=$LIBDIR
else
  NVCC=""
  echo "no nvcc found (see $LOG/install_nvcc.log)"
  note "nvcc: NOT FOUND - only prebuilt binaries can run"
fi

# --------------------------------------------------------------- tests --
TEST_BIN=""
if ! skip tests; then
  say "GPU tests"
  if command -v cargo >/dev/null 2>&1 && [ -n "$NVCC" ]; then
    if timeout "$(tmo 240)" cargo test --release --features cuda --test device --test capi_cuda --test capi_cuda_links --no-run 2>&1 | tee "$LOG/cargo_build.log" | tail -3; then
      TEST_BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/device-* 2>/dev/null | grep -v '\.d$' | head -1)
      CAPI_BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/capi_cuda-* 2>/dev/null | grep -v '\.d$' | head -1)
      LINKS_BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/capi_cuda_links-* 2>/dev/null | grep -v '\.d$' | head -1)
    fi
  fi
  if [ -z "$TEST_BIN" ] && [ -x build/gpu/device ]; then
    TEST_BIN=build/gpu/device
    echo "using the prebuilt test binary build/gpu/device"
  fi
  if [ -z "${CAPI_BIN:-}" ] && [ -x build/gpu/capi_cuda ]; then CAPI_BIN=build/gpu/capi_cuda; fi
  # the public C API's device paths against the host C API (every scorer / allocator)
  if [ -n "${CAPI_BIN:-}" ]; then
    if timeout "$(tmo 120)" "$CAPI_BIN" --test-threads=4 --nocapture 2>&1 | tee "$LOG/capi.log" | grep -E "^test |worst|selections|panicked" ; then
      note "C API device tests: $(grep -E '^test result' "$LOG/capi.log" | tail -1) $(grep -E 'worst relative' "$LOG/capi.log" | head -1)"
    else
      fail "C API device tests: FAILED (see capi.log): $(grep -E 'panicked' -A2 "$LOG/capi.log" | head -4 | tr '\n' ' ')"
    fi
  else
    need "C API device tests: NOT RUN (no build/gpu/capi_cuda)"
  fi
  if [ -z "${LINKS_BIN:-}" ] && [ -x build/gpu/capi_cuda_links ]; then LINKS_BIN=build/gpu/capi_cuda_links; fi
  # value links and the linked selection against the host (links bit for bit)
  if [ -n "${LINKS_BIN:-}" ]; then
    if timeout "$(tmo 60)" "$LINKS_BIN" --nocapture 2>&1 | tee "$LOG/links.log" | grep -E "^test |skipped|equal|panicked"; then
      note "value-link tests: $(grep -E '^test result' "$LOG/links.log" | tail -1)"
    else
      note "value-link tests: FAILED (see links.log): $(grep -E 'panicked' -A2 "$LOG/links.log" | head -4 | tr '\n' ' ')"
    fi
  else
    note "value-link tests: NOT RUN (no build/gpu/capi_cuda_links)"
  fi
  if [ -n "$TEST_BIN" ]; then
    if timeout "$(tmo 150)" "$TEST_BIN" --test-threads=4 2>&1 | tee "$LOG/tests.log" | tail -25; then
      note "tests: $(grep -E '^test result' "$LOG/tests.log" | tail -1)"
    else
      fail "tests: FAILED (see tests.log): $(grep -E '^test .* FAILED|panicked' "$LOG/tests.log" | head -5 | tr '\n' ' ')"
    fi
    grep -E "max rel err" "$LOG/tests.log" | sort -t' ' -k1,1 | awk '{print}' > "$LOG/errors.txt" || true
  else
    need "tests: NOT RUN (no cargo+nvcc, no build/gpu/device)"
  fi
fi

# ----------------------------------------------------------- sanitizer --
if ! skip sanitizer && [ -n "$TEST_BIN" ]; then
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$SAN" ]; then
    for tool in memcheck racecheck; do
      say "compute-sanitizer --tool $tool"
      # small tests only (the sanitizer slows kernels 10-100x)
      t=$(tmo 100); [ "$t" -le 1 ] && { note "sanitizer $tool: skipped (time budget)"; continue; }
      timeout "$t" "$SAN" --tool "$tool" --error-exitcode 99 "$TEST_BIN" --test-threads=1 \
          window_aggregates window_row_lse window_single select_matches compact_matches compact_batch vonorm_matches vonorm_factor lava_factor \
          pool_matches head_reduce knorm score_power sink_scores critical_combine mark_forced broadcast_lists append_range layer_budgets \
          laprox_pipeline uniqueness_two_scans >"$LOG/sanitizer_$tool.log" 2>&1
      rc=$?
      slog=$LOG/sanitizer_$tool.log
      if [ "$rc" -eq 0 ]; then
        note "sanitizer $tool: clean ($(grep -E 'ERROR SUMMARY' "$slog" | tail -1))"
      elif grep -qiE 'device not supported|not supported on this|unsupported (device|gpu)|Target application terminated before first instrumented API' "$slog" \
           && ! grep -qE 'Invalid (__global__|__shared__|__local__)|Race reported|hazard' "$slog"; then
        # the tool cannot instrument this GPU/driver: say so, do not count it as kernel errors
        note "sanitizer $tool: UNAVAILABLE here (rc $rc): $(grep -iE 'not supported|unsupported|terminated' "$slog" | head -2 | tr '\n' ' ')"
      elif [ "$rc" -eq 124 ]; then
        note "sanitizer $tool: TIMEOUT after ${t} s"
      else
        fail "sanitizer $tool: ERRORS (rc $rc): $(grep -E 'ERROR SUMMARY|Invalid|hazard|Race' "$slog" | head -3 | tr '\n' ' ')"
      fi
      tail -5 "$LOG/sanitizer_$tool.log"
    done
  else
    note "sanitizer: compute-sanitizer not found"
  fi
fi

# ---------------------------------------------------------------- torch --
MM_ARG=""
TORCH_LINES=""
if ! skip torch; then
  say "PyTorch: matmul ceiling"
  PY=$(command -v python3 || true)
  if [ -n "$PY" ] && timeout "$(tmo 60)" "$PY" cuda/bench_torch.py --mm-only >"$LOG/torch_mm.log" 2>&1; then
    cat "$LOG/torch_mm.log"
    r=$(awk '/^MM_TFLOPS/{print $2}' "$LOG/torch_mm.log")
    [ -n "$r" ] && MM_ARG="--mm-tflops $r"
  else
    cat "$LOG/torch_mm.log" 2>/dev/null | tail -3
  fi
fi

# ---------------------------------------------------------------- bench --
if ! skip bench; then
  say "benchmark (cuda/bench.cu)"
  BENCH=build/gpu/kvevict_bench
  if [ -n "$NVCC" ]; then
    inc=""; [ -n "${LIBDIR:-}" ] && inc="-L$LIBDIR"
    archflags=""
    for a in ${KVEVICT_CUDA_ARCHS//,/ }; do archflags+=" -gencode=arch=compute_$a,code=sm_$a"; done
    # a carried prebuilt binary (cuda/prebuild.sh, same sources) is used as it is
    if [ -x "$BENCH" ] && [ -z "${KVEVICT_REBUILD_BENCH:-}" ]; then :; elif timeout "$(tmo 120)" "$NVCC" -O3 -std=c++17 $archflags -Icuda $inc cuda/bench.cu $(ls cuda/*.cu | grep -v bench.cu) -o build/gpu/kvevict_bench.new >"$LOG/bench_build.log" 2>&1; then
      mv build/gpu/kvevict_bench.new "$BENCH"
    else
      echo "bench build failed:"; tail -20 "$LOG/bench_build.log"
      need "bench: build FAILED (see bench_build.log)"
    fi
  fi
  if [ -x "$BENCH" ]; then
    if timeout "$(tmo 150)" "$BENCH" --n "$CHECK_N" $MM_ARG 2>&1 | tee "$LOG/bench.log"; then :; else
      fail "bench: FAILED (rc $?): $(grep -E ' -> [0-9]+ \(' "$LOG/bench.log" | head -2 | tr '\n' ' ')"
    fi
    # the bench skips without a device: with a GPU listed that is the runtime failing
    if grep -q '^skipped: no CUDA device' "$LOG/bench.log"; then need "bench: the CUDA runtime sees no device"; fi
    while read -r l; do note "bench: $l"; done < <(grep -E '^RESULT|^ceilings|matmul rate used' "$LOG/bench.log")
  else
    need "bench: no binary"
  fi
fi

if ! skip torch; then
  say "PyTorch: same math"
  PY=$(command -v python3 || true)
  if [ -n "$PY" ]; then
    timeout "$(tmo 120)" "$PY" cuda/bench_torch.py --n "$CHECK_N" 2>&1 | tee "$LOG/torch.log" | tail -16
    trc=$?
    if grep -q "no CUDA device" "$LOG/torch.log"; then need "torch: imports but sees no CUDA device"
    elif grep -q "torch not available" "$LOG/torch.log"; then note "torch not available"
    elif [ "$trc" -ne 0 ]; then need "torch: FAILED (rc $trc, see torch.log): $(tail -2 "$LOG/torch.log" | tr '\n' ' ')"; fi
    while read -r l; do note "torch: $l"; done < <(grep -E '^TORCH ' "$LOG/torch.log")
  else
    echo "torch not available"; note "torch not available (no python3)"
  fi
fi

# ------------------------------------------------------- per-stage table --
# Every stage the bench timed (STAGE lines), with GB/s and TFLOP/s against the H200's
# nominal roofline, beside PyTorch's time for the same stage in this run (TORCH_STAGE).
stage_table() {  # stage_table BENCH_LOG TORCH_LOG
  awk -v hbm=4.8e12 -v f16=990e12 '
    function kv(line, key,   m) { return match(line, key "=[^ ]+") ? substr(line, RSTART + length(key) + 1, RLENGTH - length(key) - 1) : "" }
    FILENAME == ARGV[1] && /^STAGE / { k = kv($0, "n") "|" kv($0, "name"); ord[++no] = k
      ms[k] = kv($0, "ms"); by[k] = kv($0, "bytes"); fl[k] = kv($0, "flops") }
    FILENAME == ARGV[2] && /^TORCH_STAGE / { tm[kv($0, "n") "|" kv($0, "name")] = kv($0, "ms") }
    END {
      if (no == 0) { print "no stage timings (bench not run)"; exit }
      printf "%-7s %-14s %10s %9s %7s %9s %7s %11s %8s\n", "N", "stage", "ms", "GB/s", "%HBM", "TFLOP/s", "%f16", "torch ms", "torch/us"
      for (i = 1; i <= no; i++) { k = ord[i]; split(k, a, "|"); t = tm[k]
        # the factor form and the graph replay compute what torch does in its Gram / eager version
        if (t == "" && a[2] == "vonorm_factor") t = tm[a[1] "|vonorm"]
        if (t == "" && a[2] == "whole_graph") t = tm[a[1] "|whole"]
        s = ms[k] / 1e3
        printf "%-7s %-14s %10.3f %9.1f %6.1f%% %9.2f %6.2f%% %11s %8s\n", a[1], a[2], ms[k], by[k] / s / 1e9,
               100 * by[k] / s / hbm, fl[k] / s / 1e12, 100 * fl[k] / s / f16,
               (t == "" ? "-" : sprintf("%.3f", t)), (t == "" || ms[k] == 0 ? "-" : sprintf("%.1fx", t / ms[k])) } }
  ' "$1" "$2"
}
if ! skip bench; then
  say "stages against the H200 roofline and PyTorch"
  bl=$LOG/bench.log; tl=$LOG/torch.log
  [ -f "$bl" ] || bl=/dev/null; [ -f "$tl" ] || tl=/dev/null
  stage_table "$bl" "$tl" 2>&1 | tee "$LOG/stages.txt"
  while read -r l; do note "stage: $l"; done < "$LOG/stages.txt"
fi

say "summary ($(( $(date +%s) - t0 )) s)"
for l in "${SUMMARY[@]}"; do echo "  $l"; done | tee "$LOG/summary.txt"
if [ -n "${OUT:-}" ]; then
  for f in summary.txt tests.log capi.log sanitizer_memcheck.log sanitizer_racecheck.log bench.log torch.log; do
    [ -f "$LOG/$f" ] && cp "$LOG/$f" "$OUT/$f"
  done
fi
if [ "$FAILED" -ne 0 ]; then echo "check.sh: FAILED (a GPU is listed and a step failed; see the summary)"; exit 1; fi
echo "check.sh: passed"
