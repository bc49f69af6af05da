#!/usr/bin/env bash
# Regenerate the results of docs/results/: scripts/results.sh [--quick] [--only STEP,...]
# Each step writes docs/results/generated/STEP.md (and .csv for a table), stamped with this
# command, the commit, kvevict's version, the UTC date, the CPU and the load; `plot` draws
# docs/results/accuracy.png from the CSVs. --quick: CI size (2 prompts, 2 ratios, 4 methods)
# into eval/out/results-quick/ (scripts/test.d/30-eval.sh runs it). Steps and the results not
# yet regenerated: eval/results.py. Needs the eval venv (eval/setup.sh, $KVEVICT_EVAL_VENV)
# and a release build of the library (made here). The full run took 21 min on the shared
# 2-core machine at load 6-7 (2026-12-05, prefills not cached): run it under nice.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
venv=${KVEVICT_EVAL_VENV:-$ROOT/.venv-eval}
KVEVICT_EVAL_VENV=$venv eval/setup.sh
cargo build --release --lib 2>&1 | tail -n 1
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export KVEVICT_LIB=$ROOT/target/release/libkvevict.so
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec "$venv/bin/python" eval/results.py --command "scripts/results.sh${*:+ $*}" "$@"
