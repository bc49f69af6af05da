#!/usr/bin/env bash
# A second libllama for the device path's CPU test: the fork's build (llama_fork/build.sh) relinked
# against kvevict built with the cargo feature cuda-mock, whose kve_cuda_* entry points run a
# plain-Rust double of the CUDA kernels on host memory. The object files are the build's own (the
# kve_cuda_* entry points exist in every kvevict build; only the archive differs), so this costs one
# kvevict build and one link, not a second llama.cpp build.
#
# Run the fork's binaries with LD_LIBRARY_PATH=<dir>/cuda-mock (ahead of their RUNPATH) and
# KVEVICT_FORK_DEVICE_PATH=1 to take the device path on the CPU cache (tests/llama_fork.rs).
# Layout: <dir>/cuda-mock/{libllama.so.0, kvevict/ (install prefix), STAMP (the build's STAMP)};
# kvevict is built in <dir>/cargo-target-cuda-mock (CARGO_TARGET_DIR overrides), so <repo>/target
# keeps the default build. Prints KVEVICT_FORK_BIN=... and KVEVICT_FORK_MOCK_LIB=... on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
log() { printf 'llama_fork/cuda_mock: %s\n' "$*" >&2; }

eval "$("$root/llama_fork/build.sh")"   # KVEVICT_FORK_BIN=<dir>/build/bin
dir=$(cd "$KVEVICT_FORK_BIN/../.." && pwd)
out=$dir/cuda-mock
echo "KVEVICT_FORK_BIN=$KVEVICT_FORK_BIN"
# the build folder's lock (llama_fork/build.sh): one relink at a time; a run that waited finds the STAMP
if command -v flock >/dev/null; then
    exec 9> "$dir.lock"
    flock 9
fi

if [ -f "$out/STAMP" ] && [ "$(cat "$out/STAMP")" = "$(cat "$dir/STAMP")" ] && [ -f "$out/libllama.so.0" ]; then
    log "cached ($out)"
    echo "KVEVICT_FORK_MOCK_LIB=$out"
    exit 0
fi
t0=$(date +%s)
rm -rf "$out"   # (with its STAMP: a failed relink is never reused)
mkdir -p "$out"
KVEVICT_FEATURES=cuda-mock CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$dir/cargo-target-cuda-mock} \
    "$root/scripts/install.sh" "$out/kvevict" >&2

# libllama's link line as CMake wrote it, with the cuda-mock archive and another output
link=$(cd "$dir/build" && "$venv/bin/ninja" -t commands llama | grep -e '-soname,libllama\.so' | tail -n 1)
archive="$dir/kvevict/lib/libkvevict.a"
case "$link" in
    *" $archive "*" -o bin/libllama.so"* | *" -o bin/libllama.so"*" $archive "*) ;;
    *) log "libllama's link line does not name $archive and bin/libllama.so*"; exit 1 ;;
esac
link=${link//" $archive "/" $out/kvevict/lib/libkvevict.a "}
link=$(printf '%s' "$link" | sed -E "s# -o bin/libllama\.so[^ ]*# -o $out/libllama.so.0#")
(cd "$dir/build" && eval "$link")
cp "$dir/STAMP" "$out/STAMP"
log "relinked in $(( $(date +%s) - t0 )) s"
echo "KVEVICT_FORK_MOCK_LIB=$out"
