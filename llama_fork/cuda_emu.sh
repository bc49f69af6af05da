#!/usr/bin/env bash
# A second libllama for the device path's CPU test: the fork's build (llama_fork/build.sh) relinked
# against kvevict built with the cargo feature cuda-emu, whose kve_cuda_* entry points run the REAL
# kernels of cuda/ on the CPU emulator (cuda/emu), plus a constructor that calls
# kve_emu_host_memory_as_device(1): the emulator then takes the fork's host buffers as device memory
# (the fork's adapter registers nothing; its patches are unchanged). The object files are the
# build's own (the kve_cuda_* entry points exist in every kvevict build; only the archive differs),
# so this costs one kvevict build and one link, not a second llama.cpp build.
#
# Run the fork's binaries with LD_LIBRARY_PATH=<dir>/cuda-emu (ahead of their RUNPATH) and
# KVEVICT_FORK_DEVICE_PATH=1 to take the device path on the CPU cache (tests/llama_fork/).
# Layout: <dir>/cuda-emu/{libllama.so.0, kvevict/ (install prefix), STAMP (the build's STAMP)};
# kvevict is built in <dir>/cargo-target-cuda-emu (CARGO_TARGET_DIR overrides; KVEVICT_FORK_EMU_TARGET names
# a target folder of this clone whose cuda-emu build is taken as it stands), kept between runs
# (its dependencies are built once; kvevict's fingerprints are dropped when the STAMP changed, so
# a build of other sources is never reused), so <repo>/target keeps the default build. Prints
# KVEVICT_FORK_BIN=... and KVEVICT_FORK_EMU_LIB=... on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
log() { printf 'llama_fork/cuda_emu: %s\n' "$*" >&2; }

eval "$("$root/llama_fork/build.sh")"   # KVEVICT_FORK_BIN=<dir>/build/bin
dir=$(cd "$KVEVICT_FORK_BIN/../.." && pwd)
out=$dir/cuda-emu
echo "KVEVICT_FORK_BIN=$KVEVICT_FORK_BIN"
# the build folder's lock (llama_fork/build.sh): one relink at a time; a run that waited finds the STAMP
if command -v flock >/dev/null; then
    exec 9> "$dir.lock"
    flock 9
fi

if [ -f "$out/STAMP" ] && [ "$(cat "$out/STAMP")" = "$(cat "$dir/STAMP")" ] && [ -f "$out/libllama.so.0" ]; then
    log "cached ($out)"
    echo "KVEVICT_FORK_EMU_LIB=$out"
    exit 0
fi
t0=$(date +%s)
rm -rf "$out"   # (with its STAMP: a failed relink is never reused)
mkdir -p "$out"
if [ -n "${KVEVICT_FORK_EMU_TARGET:-}" ]; then
    # this clone's own target folder (scripts/test.d/60-llama-fork.sh: target/emu-lib, which the
    # python-cuda-emu and torch steps built from these sources): cargo's mtimes are this clone's,
    # so its build is reused as it stands (one kvevict compile less per run)
    env -u KVEVICT_EMU_SANITIZE KVEVICT_FEATURES=cuda-emu CARGO_TARGET_DIR="$KVEVICT_FORK_EMU_TARGET" \
        "$root/scripts/install.sh" "$out/kvevict" >&2
else
    target=${CARGO_TARGET_DIR:-$dir/cargo-target-cuda-emu}
    # cargo judges kvevict fresh by mtimes: sources older than the last build there (another clone)
    # would look fresh, so kvevict's own units are rebuilt whenever the STAMP differs from the last one
    if [ "$(cat "$target/.kvevict-stamp" 2>/dev/null)" != "$(cat "$dir/STAMP")" ]; then
        find "$target" -maxdepth 4 -type d -path '*/.fingerprint/kvevict*' -prune -exec rm -rf {} + 2>/dev/null || true
    fi
    KVEVICT_FEATURES=cuda-emu CARGO_TARGET_DIR=$target "$root/scripts/install.sh" "$out/kvevict" >&2
    cp "$dir/STAMP" "$target/.kvevict-stamp"
fi

# the constructor that switches the emulator to host memory when libllama is loaded
printf '%s\n' 'void kve_emu_host_memory_as_device(int on);' \
    '__attribute__((constructor)) static void kve_fork_host_memory(void) { kve_emu_host_memory_as_device(1); }' \
    > "$out/host_memory.c"
"${CC:-cc}" -O2 -fPIC -c "$out/host_memory.c" -o "$out/host_memory.o"

# libllama's link line as CMake wrote it, with the constructor, the cuda-emu archive and another output
link=$(cd "$dir/build" && "$venv/bin/ninja" -t commands llama | grep -e '-soname,libllama\.so' | tail -n 1)
archive="$dir/kvevict/lib/libkvevict.a"
case "$link" in
    *" $archive "*" -o bin/libllama.so"* | *" -o bin/libllama.so"*" $archive "*) ;;
    *) log "libllama's link line does not name $archive and bin/libllama.so*"; exit 1 ;;
esac
link=${link//" $archive "/" $out/host_memory.o $out/kvevict/lib/libkvevict.a "}
link=$(printf '%s' "$link" | sed -E "s# -o bin/libllama\.so[^ ]*# -o $out/libllama.so.0#")
(cd "$dir/build" && eval "$link")
cp "$dir/STAMP" "$out/STAMP"
log "relinked in $(( $(date +%s) - t0 )) s"
echo "KVEVICT_FORK_EMU_LIB=$out"
