#!/usr/bin/env bash
# The documentation: every relative link and anchor of README.md and docs/ resolves, the README
# stays within 150 lines, and the README's C, Rust and Python quick starts build and run
# (docs/check.py --quickstarts; the Python one in the binding's venv, which has numpy).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
venv=${KVEVICT_PY_VENV:-$ROOT/.venv-py}
cargo build --release --lib 2>&1 | tail -n 1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import numpy' 2>/dev/null; then
    KVEVICT_DOCS_PYTHON="$venv/bin/python" python3 docs/check.py --quickstarts
else
    echo "docs: no numpy venv at $venv (the python step makes it): links only, quick starts not run" >&2
    python3 docs/check.py
fi
