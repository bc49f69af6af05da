#!/usr/bin/env bash
# Builds the kvevict fork of llama.cpp: the pinned source (llama_fork/fetch.sh), the patch
# series llama_fork/patches/*.patch applied in order, kvevict installed to a prefix
# (scripts/install.sh) and linked statically into libllama; CMake, CPU backend,
# GGML_NATIVE=OFF, Release, targets llama, llama-cli, llama-server, llama-kvevict-needle.
# ggml is not compiled here: LLAMA_USE_SYSTEM_GGML=ON links the shared ggml of the pristine build
# (scripts/llama_pristine.sh: the same source, built once, cached by its inputs, also the llama.cpp
# of c_examples/llama_cpp); its prefix is part of the keys below. A build with
# KVEVICT_FORK_CMAKE_ARGS (CUDA) compiles its own ggml.
#
# Layout (all under $KVEVICT_FORK_DIR, default <repo>/build/llama-fork, gitignored):
#   src/     patched source     build/   CMake build (binaries in build/bin)
#   kvevict/ kvevict install prefix     STAMP: the llama.cpp key (below) and a hash of kvevict's sources
# A build whose STAMP matches is reused. Otherwise only what changed is rebuilt: the patched source
# is staged only when the llama.cpp key changed (SRC_STAMP), and then only the files whose content
# changed are rewritten; kvevict's header and archive are replaced only when their content changed,
# so a change of kvevict's sources alone costs a kvevict build and a relink of libllama and the
# tools (ninja: libkvevict.a is a link input, kvevict.h a compile input), not a llama.cpp build.
# The STAMP is removed before a build starts and written when it has finished, so a failed or
# interrupted build is never reused.
#
# Outside the clone: when KVEVICT_FORK_DIR is unset and <repo>/build/llama-fork does not exist (a
# fresh clone, as in CI), the build goes to, or is found in, a folder keyed by the pristine source
# and the kind of build (fetch.sh, KVEVICT_FORK_FEATURES and KVEVICT_FORK_CMAKE_ARGS) under
# ${KVEVICT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvevict}/llama-fork-<key>, so a machine that
# keeps $HOME builds llama.cpp once and then, like the folder in the clone, recompiles only the files
# a new patch series changes and relinks when kvevict changes (the folder's real path is used, so a
# key may be a symlink to an older folder whose CMake build it then reuses). Such a
# folder is used under its lock (flock on <folder>.lock; a second run waits, then reuses or updates
# it); keyed folders unused for 30 days are removed. KVEVICT_CACHE_DIR=none keeps everything in the
# clone.
# Prints KVEVICT_FORK_BIN=<dir>/build/bin on stdout. Environment: KVEVICT_FORK_JOBS (2);
# KVEVICT_FORK_FEATURES, KVEVICT_FORK_CMAKE_ARGS: cargo features of the linked kvevict and extra
# CMake arguments, for a GPU build in its own KVEVICT_FORK_DIR (the device path: "cuda" and
# "-DGGML_CUDA=ON"); kvevict is then built in <dir>/cargo-target (unless CARGO_TARGET_DIR is
# set), so <repo>/target keeps the default build. (The CPU test of the device path relinks this
# build instead: llama_fork/cuda_emu.sh.)
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
# the CPU build links the ggml of the pristine build (scripts/llama_pristine.sh, built once and cached:
# the patches never touch ggml/); a build with CMake arguments (CUDA) builds its own ggml
ggml_args=() ggml_key=
if [ ${#cmake_args[@]} = 0 ]; then
    eval "$("$root/scripts/llama_pristine.sh")"   # KVEVICT_LLAMA_PREFIX
    ggml_args=(-DLLAMA_USE_SYSTEM_GGML=ON)
    ggml_key=-ggml-$(echo "$KVEVICT_LLAMA_PREFIX" | sha256sum | cut -c1-8)
fi

patches=("$root"/llama_fork/patches/*.patch)
kve_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
# the llama.cpp key: the patches, the build's own flags (this script and the pinned source), the
# features and CMake arguments; it names the cache folder
script_hash=$(cat "$root/llama_fork/build.sh" "$root/llama_fork/fetch.sh" "$root/scripts/llama_pristine.sh" | sha256sum | cut -c1-8)
llama_key="$(cat "${patches[@]}" | sha256sum | cut -c1-16)-$script_hash${features:+-$features}${cmake_args[*]:+-$(echo "${cmake_args[*]}" | sha256sum | cut -c1-8)}$ggml_key"
# the STAMP of a finished build: the llama.cpp key and kvevict's sources (the fork links them)
kve_hash=$(cd "$root" && cat Cargo.toml Cargo.lock build.rs include/kvevict.h include/kvevict_ggml.hpp $(git ls-files src) | sha256sum | cut -c1-16)
stamp="$llama_key-kvevict-$kve_version-$kve_hash"

if [ -n "${KVEVICT_CACHE_DIR:-}" ]; then cache_dir=$KVEVICT_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache_dir=$XDG_CACHE_HOME/kvevict
elif [ -n "${HOME:-}" ]; then cache_dir=$HOME/.cache/kvevict
else cache_dir=none; fi
# (a cache folder that cannot be made or written, or no flock: build in the clone as before)
if [ -z "${KVEVICT_FORK_DIR:-}" ] && [ ! -e "$dir" ] && [ "$cache_dir" != none ] \
    && mkdir -p "$cache_dir" 2>/dev/null && [ -w "$cache_dir" ] && command -v flock >/dev/null; then
    # the folder's key: the pristine source and the kind of build, not the patches (a new series is
    # applied in place, recompiling only what it changed: SRC_STAMP below)
    folder_key="$(sha256sum < "$root/llama_fork/fetch.sh" | cut -c1-16)${features:+-$features}${cmake_args[*]:+-$(echo "${cmake_args[*]}" | sha256sum | cut -c1-8)}$ggml_key"
    dir=$cache_dir/llama-fork-$(echo "$folder_key" | sha256sum | cut -c1-16)
    # one build per keyed folder at a time; a run that waited finds the STAMP below (or updates
    # the folder's kvevict)
    exec 9> "$dir.lock"
    flock 9
    # CMake and ninja know a build folder by its real path (the key may be a symlink to it)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    # keyed folders unused for 30 days (their STAMP is touched on every use), unless in use now
    ROOT=$root . "$root/scripts/lib/cargo_cache.sh"
    kve_cache_prune "$cache_dir/llama-fork-" STAMP "$dir"
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

# kvevict: a static library and its CMake package, installed to a staging prefix; a file is replaced
# in $dir/kvevict only when its content changed, so ninja rebuilds only what depends on a change
mkdir -p "$dir"
rm -rf "$dir/kvevict.stage"
if [ -n "$features" ]; then
    KVEVICT_FEATURES=$features CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$dir/cargo-target} \
        "$root/scripts/install.sh" "$dir/kvevict.stage" >&2
else
    "$root/scripts/install.sh" "$dir/kvevict.stage" >&2
fi
sed -i "s|$dir/kvevict.stage|$dir/kvevict|g" "$dir/kvevict.stage/lib/pkgconfig/kvevict.pc"
(cd "$dir/kvevict.stage" && find . -type f) | while IFS= read -r f; do
    if ! cmp -s "$dir/kvevict.stage/$f" "$dir/kvevict/$f"; then
        mkdir -p "$(dirname "$dir/kvevict/$f")"
        cp -p "$dir/kvevict.stage/$f" "$dir/kvevict/$f"
        log "kvevict: ${f#./} changed"
    fi
done
rm -rf "$dir/kvevict.stage"

# source: the pristine tree with the series applied, staged; only files whose content differs
# from the previous build's source are copied over, so an incremental build recompiles only
# what the series changed (files a previous series added and this one does not are left in place:
# nothing builds them unless a CMakeLists names them). A copied file gets the time of the copy, not
# the staged file's: a file the previous series patched and this one leaves pristine has the
# pristine source's old mtime in the stage, and ninja (mtimes only) would keep its stale object.
# Skipped when the source in place is the patched source of this llama.cpp key (SRC_STAMP, written
# once it is complete).
if [ -f "$dir/SRC_STAMP" ] && [ "$(cat "$dir/SRC_STAMP")" = "$llama_key" ] && [ -d "$dir/src" ]; then
    log "patched source in place ($llama_key)"
else
    rm -f "$dir/SRC_STAMP"
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
                    cp "$stage/$f" "$dir/src/$f" ;;
                "Only in $stage"*)
                    d=${line#"Only in "}; d=${d%%: *}; n=${line#*: }
                    rel=${d#"$stage"}; cp -R "$d/$n" "$dir/src$rel/$n" ;;
            esac
        done
        rm -rf "$stage"
    else
        mv "$stage" "$dir/src"
    fi
    echo "$llama_key" > "$dir/SRC_STAMP"
fi

"$cmake" -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DCMAKE_PREFIX_PATH="$dir/kvevict${KVEVICT_LLAMA_PREFIX:+;$KVEVICT_LLAMA_PREFIX}" "${ggml_args[@]}" "${cmake_args[@]}" >&2
"$cmake" --build "$dir/build" -j "$jobs" --target llama llama-cli llama-server llama-kvevict-needle >&2

echo "$stamp" > "$dir/STAMP"
log "built in $(( $(date +%s) - t0 )) s"
echo "KVEVICT_FORK_BIN=$dir/build/bin"
