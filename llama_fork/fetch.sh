#!/usr/bin/env bash
# Fetches the llama.cpp source the fork patches: llama-cpp-python 0.3.36's source
# distribution from PyPI (its vendor/llama.cpp is llama.cpp commit 0c1e57098), checks its
# sha256 and unpacks vendor/llama.cpp to $KVEVICT_LLAMA_SRC (default <repo>/build/llama-src).
# The sdist is cached in $KVEVICT_LLAMA_CACHE (default <repo>/build/cache). `pip download`
# of an sdist prepares its metadata, which needs scikit-build-core: it runs from a small
# venv (<repo>/.venv-fork, with cmake and ninja for build.sh) with --no-build-isolation, so
# nothing is compiled here. Prints KVEVICT_LLAMA_SRC=... on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVEVICT_LLAMA_CACHE:-$root/build/cache}
src=${KVEVICT_LLAMA_SRC:-$root/build/llama-src}
venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
sdist=llama_cpp_python-0.3.36.tar.gz
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

log() { printf 'llama_fork/fetch: %s\n' "$*" >&2; }

if ! "$venv/bin/python" -c 'import scikit_build_core, cmake, ninja' 2>/dev/null; then
    log "creating $venv (cmake, ninja, scikit-build-core)"
    "${PYTHON:-python3}" -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check "cmake>=3.21,<5" ninja scikit-build-core >&2
fi

mkdir -p "$cache"
if [ ! -f "$cache/$sdist" ] || ! echo "$sha256  $cache/$sdist" | sha256sum -c --status; then
    log "downloading $sdist"
    rm -f "$cache/$sdist"
    (cd "$cache" && "$venv/bin/pip" download --disable-pip-version-check --no-deps --no-binary :all: \
        --no-build-isolation "llama-cpp-python==0.3.36" -d . >&2)
fi
echo "$sha256  $cache/$sdist" | sha256sum -c --status || { log "sha256 mismatch for $cache/$sdist"; exit 1; }

# unpack once per sdist hash; build.sh applies the patches to a fresh copy
stamp="$src/.kvevict-sdist-sha256"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sha256" ]; then
    log "unpacking vendor/llama.cpp to $src"
    rm -rf "$src" "$src.tmp"
    mkdir -p "$src.tmp"
    tar -xzf "$cache/$sdist" -C "$src.tmp" --strip-components=3 "llama_cpp_python-0.3.36/vendor/llama.cpp"
    rm -f "$src.tmp/.git"   # a submodule pointer into llama-cpp-python's repository: breaks git apply
    echo "$sha256" > "$src.tmp/.kvevict-sdist-sha256"
    mv "$src.tmp" "$src"
fi
echo "KVEVICT_LLAMA_SRC=$src"
