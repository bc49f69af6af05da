#!/usr/bin/env bash
# The Python binding (python/): build the release cdylib, make the venv <repo>/.venv-py
# (numpy, ml_dtypes, setuptools), pip-install ./python into it, run python/tests against
# the installed package (from outside the source tree). Venv path: $KVEVICT_PY_VENV.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY_STEP=python
. scripts/lib/py_venv.sh

cargo build --release --lib 2>&1 | tail -n 3
test -f target/release/libkvevict.so || { echo "no target/release/libkvevict.so" >&2; exit 1; }

py_venv_setup

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # import the installed package, not python/kvevict
"$venv/bin/python" "$ROOT/python/tests/run.py"
