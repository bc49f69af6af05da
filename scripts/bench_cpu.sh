#!/usr/bin/env bash
# CPU benchmark (issue 2; not a timed test): scores ONE layer at the SmolLM2 shape
# (Hq=9, Hkv=3, d=64, f32) and the Llama-3-8B shape (Hq=32, Hkv=8, d=128, f16) for
# N = 4k and 32k with every scorer, single-threaded, and compares with the same math in
# numpy (single-threaded BLAS) and with the machine's single-core sgemm rate (numpy's, measured
# in the same run: every row's "% of sgemm"; TOVA and KNorm, which read each key once, also
# their share of the rate of reading the key bytes (the faster of bench_cpu's plain vector read
# loops, `read`, and numpy's reductions), and TOVA of a numpy sgemv of its shape,
# both measured in the same run: "% of bound"). Besides the presets: `<scorer>+lse` (given the
# window rows' log-sum-exp), `<scorer>-w8` (window 8), `value-forms` (LaProx's cached value
# forms alone). Prints a markdown table at the end.
#
#   scripts/bench_cpu.sh [--rounds 3] [--reps 5] [--np-reps 3] [--n 4096,32768]
#                        [--shapes smol,llama] [--scorers snapkv,laprox,...]
#   scripts/bench_cpu.sh --arm     # what to run on an ARM machine (prints it, runs nothing)
#
# Every row names the kernel build that ran (AVX-512, AVX2, NEON, portable);
# KVEVICT_NO_AVX512=1 measures AVX2 on an AVX-512 machine, KVEVICT_PORTABLE=1 the portable one.
# To compare two builds on a loaded machine, `bench/ab_cpu.py` runs their `bench_cpu` binaries
# alternately on dumped cases against each round's sgemm (ratios only, no numpy math).
#
# The machine may be shared: times are thread CPU time, minimum over --rounds rounds of
# --reps (Rust) / --np-reps (numpy) runs, the two alternating case by case.
# Makes its own venv with numpy (<repo>/.venv-bench). Inputs and scores travel through a
# temporary directory (about 0.5 GB at the default sizes), removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=3
REPS=5
NP_REPS=3
SCORERS=""
RUST_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --np-reps) NP_REPS=$2; shift 2 ;;
    --scorers) SCORERS=$2; shift 2 ;;
    --n|--shapes) RUST_ARGS+=("$1" "$2"); shift 2 ;;
    --arm) cargo run -q --release --example bench_cpu -- --arm; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

VENV=$ROOT/.venv-bench
if ! "$VENV/bin/python" -c "import numpy" 2>/dev/null; then
  echo "== making $VENV with numpy" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q numpy
fi

echo "== cargo build --release --example bench_cpu" >&2
cargo build --release --example bench_cpu >&2

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

echo "== making the inputs" >&2
"$ROOT/target/release/examples/bench_cpu" --reps 0 --dump "$TMP" "${RUST_ARGS[@]}" >/dev/null
echo "== kvevict score_layer (Rust, one thread) and numpy (one BLAS thread), $ROUNDS rounds"
"$VENV/bin/python" "$ROOT/bench/numpy_ref.py" "$TMP" --rust "$ROOT/target/release/examples/bench_cpu" \
  --rounds "$ROUNDS" --reps "$REPS" --np-reps "$NP_REPS" --scorers "$SCORERS"
