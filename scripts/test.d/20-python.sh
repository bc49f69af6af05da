#!/usr/bin/env bash
# The Python binding (python/): build the release cdylib, make the venv <repo>/.venv-py
# (numpy, ml_dtypes, setuptools), pip-install ./python into it, run python/tests against
# the installed package (from outside the source tree). Venv path: $KVEVICT_PY_VENV.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
venv=${KVEVICT_PY_VENV:-$ROOT/.venv-py}
python=${PYTHON:-python3}

cargo build --release --lib 2>&1 | tail -n 3
test -f target/release/libkvevict.so || { echo "no target/release/libkvevict.so" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
    echo "python: creating venv $venv"
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy, ml_dtypes, setuptools, wheel' 2>/dev/null; then
    echo "python: installing numpy ml_dtypes setuptools wheel"
    "$venv/bin/pip" install -q --disable-pip-version-check numpy ml_dtypes "setuptools>=61" wheel
fi
# --no-build-isolation: build with the venv's setuptools (no download per run)
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$ROOT/python"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # import the installed package, not python/kvevict
"$venv/bin/python" "$ROOT/python/tests/run.py"
