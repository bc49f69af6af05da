#!/usr/bin/env bash
# The evaluation's environment, made whole: the venv and model (eval/setup.sh), the release
# library, and the binding ./python pip-installed into the venv. Venv path: $KVEVICT_EVAL_VENV
# (default <repo>/.venv-eval). Used by scripts/demo.sh and scripts/test.d/30-eval.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${KVEVICT_EVAL_VENV:-$PWD/.venv-eval}
KVEVICT_EVAL_VENV=$venv eval/setup.sh
echo "eval: building libkvevict (cargo build --release --lib)" >&2
cargo build --release --lib 2>&1 | tail -n 3 >&2
# (the shared library the binding loads: .so, or .dylib on macOS)
[ -f target/release/libkvevict.so ] || [ -f target/release/libkvevict.dylib ] ||
    { echo "no target/release/libkvevict.so" >&2; exit 1; }
# --no-build-isolation: the venv's setuptools/wheel (setup.sh), no download per run
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$PWD/python"
