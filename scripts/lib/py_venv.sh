# Sourced by the Python test steps: the venv ($KVEVICT_PY_VENV or <repo>/.venv-py) with
# numpy, ml_dtypes and setuptools, and the package python/ installed into it.
# Needs ROOT (the repository) and a step label in PY_STEP.
py_venv_setup() {
    venv=${KVEVICT_PY_VENV:-$ROOT/.venv-py}
    local python=${PYTHON:-python3}
    if [ ! -x "$venv/bin/python" ]; then
        echo "$PY_STEP: creating venv $venv"
        "$python" -m venv "$venv"
    fi
    if ! "$venv/bin/python" -c 'import numpy, ml_dtypes, setuptools, wheel' 2>/dev/null; then
        echo "$PY_STEP: installing numpy ml_dtypes setuptools wheel"
        "$venv/bin/pip" install -q --disable-pip-version-check numpy ml_dtypes "setuptools>=61" wheel
    fi
    # --no-build-isolation: build with the venv's setuptools (no download per run)
    "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
        --force-reinstall "$ROOT/python"
}
