#!/usr/bin/env bash
# The Python device API (kvevict.cuda, python/kvevict/cuda.py) without a GPU: build the
# cdylib with feature cuda-mock (the CUDA launchers replaced by the plain-Rust test double
# of src/cuda/mock.rs, "device pointers" being host pointers) into target/cuda-mock, and
# run python/tests/test_cuda.py against it (KVEVICT_LIB), comparing kvevict.cuda with the
# host API. Same venv as 20-python.sh ($KVEVICT_PY_VENV or <repo>/.venv-py, created the
# same way when missing). Fails on any failure, skip, or when no test ran. What this
# proves: the binding's descriptors, strides, lengths and statuses; not the kernels.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY_STEP=python-cuda-mock
. scripts/lib/py_venv.sh
lib=$ROOT/target/cuda-mock/release/libkvevict.so

CARGO_TARGET_DIR=target/cuda-mock cargo build --release --lib --features cuda-mock 2>&1 | tail -n 3
test -f "$lib" || { echo "no $lib" >&2; exit 1; }

# the package under test, installed as 20-python.sh does (KVEVICT_LIB wins over a bundled copy)
py_venv_setup

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # import the installed package, not python/kvevict
KVEVICT_LIB=$lib "$venv/bin/python" "$ROOT/python/tests/run.py" --pattern 'test_cuda.py' \
    --label python-cuda-mock --no-skips
