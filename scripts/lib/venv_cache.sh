# Sourced by scripts/test.sh after scripts/lib/cargo_cache.sh: the Python venvs the steps make
# (nvcc and cuobjdump from PyPI, the binding's numpy venv, the evaluation's, llama.cpp's cmake and
# models, the fork's cmake and ninja) kept between fresh clones (CI) instead of pip-installed into
# <clone>/.venv-* by every run.
#
# venv_cache VAR NAME FILE...: unless VAR is set already, exports VAR=$cache/venv-NAME-<key>, the
# key hashing the FILEs (the scripts that say what goes into that venv: a change of a pin or of
# the install commands is a new folder), the Python that makes it (path and version) and the
# machine (uname -m). The step's own idempotent setup fills the folder the first time and checks
# it every time (a run killed mid-install leaves a venv that the next run's check completes).
# Steps pip-install the clone's ./python into the binding's and the evaluation's venvs, so a
# folder is used by one run at a time, as cargo_cache's are: this shell holds its lock (flock on
# <folder>.lock) until it exits; when another run holds it, VAR stays unset (the step's default,
# a venv in the clone). Folders unused for 30 days are removed.
venv_cache() {
    local var=$1 name=$2 cache key dir
    shift 2
    [ -z "${!var:-}" ] || return 0
    cache=$(kve_cache_dir)
    [ "$cache" != none ] && command -v flock >/dev/null && mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] \
        || return 0
    key=$( (cd "$ROOT" && cat "$@"; "${PYTHON:-python3}" -c 'import sys; print(sys.executable, sys.version)'
            uname -m) | sha256sum | cut -c1-16)
    dir=$cache/venv-$name-$key
    kve_cache_take "$dir" "$var stays unset (a venv in the clone)" || return 0
    mkdir -p "$dir"
    touch "$dir/.kvevict-venv-used"
    export "$var=$dir"
    echo "venv cache: $var=$dir"
    kve_cache_prune "$cache/venv-$name-" .kvevict-venv-used "$dir"
}
