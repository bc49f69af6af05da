#!/usr/bin/env bash
# Builds the kvevict fork of llama.cpp: the pinned source (llama_fork/fetch.sh), the patch
# series llama_fork/patches/*.patch applied in order, kvevict installed to a prefix
# (scripts/install.sh) and linked statically into libllama; CMake, CPU backend,
# GGML_NATIVE=OFF, Release, targets llama, llama-cli, llama-server, llama-kvevict-needle.
#
# Layout (all under $KVEVICT_FORK_DIR, default <repo>/build/llama-fork, gitignored):
#   src/     patched source     build/   CMake build (binaries in build/bin)
#   kvevict/ kvevict install prefix     STAMP: hash of the patches, kvevict's sources and the build flags
# A build whose STAMP matches is reused; after a change of the series only the files whose patched
# content changed are rewritten, so only they recompile. The STAMP is removed before a build starts
# and written when it has finished, so a failed or interrupted build is never reused.
#
# Outside the clone: when KVEVICT_FORK_DIR is unset and <repo>/build/llama-fork does not exist (a
# fresh clone, as in CI), the build goes to, or is found in, a folder keyed by the STAMP under
# ${KVEVICT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvevict}/llama-fork-<key>, so a machine that
# keeps $HOME builds each version of the fork once. Such a folder is complete (STAMP) or being built
# under its lock (flock on <folder>.lock; a second run waits, then reuses it); keyed folders unused
# for 30 days are removed. KVEVICT_CACHE_DIR=none keeps everything in the clone.
# Prints KVEVICT_FORK_BIN=<dir>/build/bin on stdout. Environment: KVEVICT_FORK_JOBS (2);
# KVEVICT_FORK_FEATURES, KVEVICT_FORK_CMAKE_ARGS: cargo features of the linked kvevict and extra
# CMake arguments, for a GPU build in its own KVEVICT_FORK_DIR (the device path: "cuda" and
# "-DGGML_CUDA=ON"); kvevict is then built in <dir>/cargo-target (unless CARGO_TARGET_DIR is
# set), so <repo>/target keeps the default build. (The CPU test of the device path relinks this
# build instead: llama_fork/cuda_mock.sh.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${KVEVICT_FORK_DIR:-$root/build/llama-fork}
jobs=${KVEVICT_FORK_JOBS:-2}
features=${KVEVICT_FORK_FEATURES:-}
read -r -a cmake_args <<< "${KVEVICT_FORK_CMAKE_ARGS:-}"
venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
log() { printf 'llama_fork/build: %s\n' "$*" >&2; }

eval "$("$root/llama_fork/fetch.sh")"   # KVEVICT_LLAMA_SRC: the pristine source
cmake=$venv/bin/cmake

patches=("$root"/llama_fork/patches/*.patch)
kve_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
# kvevict's sources are part of the key: the fork links them
kve_hash=$(cd "$root" && cat Cargo.toml Cargo.lock build.rs include/kvevict.h $(git ls-files src) | sha256sum | cut -c1-16)
# the build's own flags (this script and the pinned source) are part of the key too
script_hash=$(cat "$root/llama_fork/build.sh" "$root/llama_fork/fetch.sh" | sha256sum | cut -c1-8)
stamp="$(cat "${patches[@]}" | sha256sum | cut -c1-16)-kvevict-$kve_version-$kve_hash-$script_hash${features:+-$features}${cmake_args[*]:+-$(echo "${cmake_args[*]}" | sha256sum | cut -c1-8)}"

if [ -n "${KVEVICT_CACHE_DIR:-}" ]; then cache_dir=$KVEVICT_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache_dir=$XDG_CACHE_HOME/kvevict
elif [ -n "${HOME:-}" ]; then cache_dir=$HOME/.cache/kvevict
else cache_dir=none; fi
# (a cache folder that cannot be made or written, or no flock: build in the clone as before)
if [ -z "${KVEVICT_FORK_DIR:-}" ] && [ ! -e "$dir" ] && [ "$cache_dir" != none ] \
    && mkdir -p "$cache_dir" 2>/dev/null && [ -w "$cache_dir" ] && command -v flock >/dev/null; then
    dir=$cache_dir/llama-fork-$(echo "$stamp" | sha256sum | cut -c1-16)
    # one build per keyed folder at a time; a run that waited finds the STAMP below
    exec 9> "$dir.lock"
    flock 9
    # keyed folders unused for 30 days (their STAMP is touched on every use), unless in use now
    for old in "$cache_dir"/llama-fork-*/STAMP; do
        d=${old%/STAMP}
        if [ -f "$old" ] && [ "$d" != "$dir" ] && [ -n "$(find "$old" -mtime +30)" ]; then
            # under its lock (skipped if a run holds it): a run wanting that key waits, then rebuilds
            ( flock -n 8 || exit 0; log "removing $d (unused for 30 days)"; rm -rf "$d" ) 8> "$d.lock"
        fi
    done
fi

if [ -f "$dir/STAMP" ] && [ "$(cat "$dir/STAMP")" = "$stamp" ] && [ -x "$dir/build/bin/llama-server" ]; then
    log "cached build ($stamp in $dir)"
    touch "$dir/STAMP"
    echo "KVEVICT_FORK_BIN=$dir/build/bin"
    exit 0
fi
t0=$(date +%s)
# from here on the folder does not hold a finished build of any key until the STAMP is written again
rm -f "$dir/STAMP"

# kvevict: a static library and its CMake package
if [ -n "$features" ]; then
    KVEVICT_FEATURES=$features CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$dir/cargo-target} \
        "$root/scripts/install.sh" "$dir/kvevict" >&2
else
    "$root/scripts/install.sh" "$dir/kvevict" >&2
fi

# source: the pristine tree with the series applied, staged; only files whose content differs
# from the previous build's source are copied over, so an incremental build recompiles only
# what the series changed (files a previous series added and this one does not are left in place:
# nothing builds them unless a CMakeLists names them)
mkdir -p "$dir"
stage=$dir/src.stage
rm -rf "$stage"
cp -a "$KVEVICT_LLAMA_SRC" "$stage"
for p in "${patches[@]}"; do
    log "applying $(basename "$p")"
    # the ceiling keeps git from treating an enclosing repository (this one) as the patch root
    (cd "$stage" && GIT_CEILING_DIRECTORIES="$dir" git apply --whitespace=nowarn "$p")
done
if [ -d "$dir/src" ]; then
    # (diff exits 1 when the trees differ, which is the point: not an error under pipefail)
    { diff -rq --exclude=.git "$stage" "$dir/src" || true; } | while IFS= read -r line; do
        case "$line" in
            "Files $stage/"*" differ")
                f=${line#"Files $stage/"}; f=${f%% and *}
                cp -p "$stage/$f" "$dir/src/$f" ;;
            "Only in $stage"*)
                d=${line#"Only in "}; d=${d%%: *}; n=${line#*: }
                rel=${d#"$stage"}; cp -a "$d/$n" "$dir/src$rel/$n" ;;
        esac
    done
    rm -rf "$stage"
else
    mv "$stage" "$dir/src"
fi

"$cmake" -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DCMAKE_PREFIX_PATH="$dir/kvevict" "${cmake_args[@]}" >&2
"$cmake" --build "$dir/build" -j "$jobs" --target llama llama-cli llama-server llama-kvevict-needle >&2

echo "$stamp" > "$dir/STAMP"
log "built in $(( $(date +%s) - t0 )) s"
echo "KVEVICT_FORK_BIN=$dir/build/bin"
