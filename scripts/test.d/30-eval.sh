#!/usr/bin/env bash
# Real-model smoke of the evaluation (eval/smoke.py): SmolLM2-135M in numpy, 2 needle
# prompts, 2 keep ratios; the library's scores against numpy recomputations on the captured
# tensors, every method of eval/methods.py through the binding. Then the results driver at CI
# size (scripts/results.sh --quick: both settings, 2 prompts, 2 ratios, 4 methods, the plot;
# into eval/out/results-quick/, checked whole by the driver). On a fresh machine: the eval
# venv and model (eval/setup.sh), the release library, the binding pip-installed into the
# venv. Venv path: $KVEVICT_EVAL_VENV (default <repo>/.venv-eval). ~3-5 min the first time
# (weights dequantized and prompts prefilled once, cached in eval/out/cache/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export KVEVICT_EVAL_VENV=${KVEVICT_EVAL_VENV:-$ROOT/.venv-eval}
venv=$KVEVICT_EVAL_VENV

eval/setup.sh
cargo build --release --lib 2>&1 | tail -n 3
test -f target/release/libkvevict.so || { echo "no target/release/libkvevict.so" >&2; exit 1; }
# --no-build-isolation: the venv's setuptools/wheel (setup.sh), no download per run
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$ROOT/python"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} "$venv/bin/python" eval/smoke.py
scripts/results.sh --quick
