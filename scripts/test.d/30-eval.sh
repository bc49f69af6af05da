#!/usr/bin/env bash
# Real-model smoke of the evaluation (eval/smoke.py): SmolLM2-135M in numpy, 2 needle
# prompts, 2 keep ratios; the library's scores against numpy recomputations on the captured
# tensors, every method of eval/methods.py through the binding. Then the results driver at CI
# size (scripts/results.sh --quick: both settings, 2 prompts, 2 ratios, 4 methods, the plot;
# into eval/out/results-quick/, checked whole by the driver). On a fresh machine: the eval
# venv and model, the release library, the binding pip-installed into the venv
# (eval/binding.sh). Venv path: $KVEVICT_EVAL_VENV (default <repo>/.venv-eval). ~3-5 min the first time
# (weights dequantized and prompts prefilled once, cached in eval/out/cache/).
set -euo pipefail
cd "$(dirname "$0")/../.."
export KVEVICT_EVAL_VENV=${KVEVICT_EVAL_VENV:-$PWD/.venv-eval}
venv=$KVEVICT_EVAL_VENV
eval/binding.sh
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} "$venv/bin/python" eval/smoke.py
scripts/results.sh --quick
