# Sourced by scripts/test.sh: a cargo target folder kept between fresh clones (CI), so the
# crates.io dependencies (cbindgen and its tree, half, libm, cc; libfuzzer-sys for fuzz/) are
# not compiled again by every run. kvevict itself is always rebuilt when its sources differ.
#
# cargo_cache TARGET KEYFILE...: when TARGET (a clone's target folder, relative to ROOT) does
# not exist, makes it a symlink to $cache/cargo-target-<key> (the cache folder of
# llama_fork/build.sh: ${KVEVICT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvevict}; none: off),
# keyed by the KEYFILEs (Cargo.toml, Cargo.lock) and the toolchain (`rustc -vV`). The folder is
# used by one run at a time: this shell holds its lock (flock on <folder>.lock) until it exits;
# when another run holds it, TARGET stays a plain folder of this clone (no cache, nothing
# shared). A TARGET that is already such a symlink (a second run in the same clone) is locked
# the same way, waiting for the lock.
#
# Stale builds: cargo decides whether kvevict is fresh by the mtimes of its files, and a clone
# older than the cache's last build (a run that waited for another) would look fresh. So each
# folder records the content of the sources it last built (git's blob hashes of the tracked
# files, the uncommitted diff and the clone's path, .kvevict-sources); when that differs, kvevict's own
# fingerprints (.fingerprint/kvevict*, every profile and target) are removed first, so cargo
# rebuilds every unit of kvevict (and of kvevict-fuzz) and reuses only the dependencies.
# Folders unused for 30 days are removed.
# The cache folder (llama_fork/build.sh's), or "none".
kve_cache_dir() {
    if [ -n "${KVEVICT_CACHE_DIR:-}" ]; then echo "$KVEVICT_CACHE_DIR"
    elif [ -n "${XDG_CACHE_HOME:-}" ]; then echo "$XDG_CACHE_HOME/kvevict"
    elif [ -n "${HOME:-}" ]; then echo "$HOME/.cache/kvevict"
    else echo none; fi
}

cargo_cache() {
    local target=$1 cache key dir fd old d
    shift
    cache=$(kve_cache_dir)
    [ "$cache" != none ] && command -v flock >/dev/null && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 \
        || return 0
    if [ -L "$ROOT/$target" ]; then
        dir=$(readlink "$ROOT/$target")
        case "$dir" in "$cache"/cargo-target-*) ;; *) return 0 ;; esac
        exec {fd}> "$dir.lock"
        flock "$fd"
    elif [ -e "$ROOT/$target" ]; then
        return 0
    else
        mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || return 0
        key=$( (cd "$ROOT" && cat "$@"; rustc -vV) | sha256sum | cut -c1-16)
        dir=$cache/cargo-target-$key
        kve_cache_take "$dir" "$target stays in this clone" || return 0
        mkdir -p "$dir"
        ln -s "$dir" "$ROOT/$target"
        echo "cargo cache: $target -> $dir"
    fi
    local sources
    # (the clone's path too: test binaries and build scripts bake it in, env!("CARGO_MANIFEST_DIR"))
    sources=$(cd "$ROOT" && { pwd -P; git ls-files -s; git diff HEAD; } | sha256sum | cut -c1-32)
    if [ "$(cat "$dir/.kvevict-sources" 2>/dev/null)" != "$sources" ]; then
        echo "cargo cache: sources differ from the last build in $dir: kvevict's fingerprints removed"
        find "$dir" -maxdepth 4 -type d -path '*/.fingerprint/kvevict*' -prune -exec rm -rf {} +
        echo "$sources" > "$dir/.kvevict-sources"
    fi
    touch "$dir/.kvevict-sources"
    kve_cache_prune "$cache/cargo-target-" .kvevict-sources "$dir"
}

# kve_cache_take DIR INSTEAD: this shell takes DIR's lock (flock on DIR.lock) and holds it until it
# exits; when another run holds it, says so and what is done INSTEAD, and returns 1.
kve_cache_take() {
    local fd
    exec {fd}> "$1.lock"
    if ! flock -n "$fd"; then
        echo "kvevict cache: $1 is in use by another run: $2"
        exec {fd}>&-
        return 1
    fi
}

# kve_cache_prune PREFIX MARK KEEP: removes the keyed folders PREFIX* whose file MARK (touched on
# every use) is older than 30 days, except KEEP (the folder in use) and those a run holds (each
# under its lock, flock on <folder>.lock: a run wanting that key waits, then rebuilds).
kve_cache_prune() {
    local old d
    for old in "$1"*/"$2"; do
        d=${old%/"$2"}
        if [ -f "$old" ] && [ "$d" != "$3" ] && [ -n "$(find "$old" -mtime +30)" ]; then
            ( flock -n 8 || exit 0; echo "kvevict cache: removing $d (unused for 30 days)" >&2; rm -rf "$d" ) 8> "$d.lock"
        fi
    done
}

# kernel_cache: exports KVEVICT_KERNEL_CACHE=$cache/kernels (build.rs: compiled kernel objects,
# one per source, keyed by its text and the headers it includes, the mode, the compiler's command
# line and version, so each kernel source is compiled once per content and compiler setup, not
# once per clone, profile and feature set, and a changed source recompiles its own object only;
# cuda/ptx_check.sh's per-(arch, source) reports and smem_table too); entries unused for 30 days
# are removed. Off with KVEVICT_CACHE_DIR=none.
kernel_cache() {
    local cache
    cache=$(kve_cache_dir)
    [ "$cache" != none ] && mkdir -p "$cache/kernels" 2>/dev/null && [ -w "$cache/kernels" ] || return 0
    find "$cache/kernels" -mindepth 1 -maxdepth 1 -mtime +30 -exec rm -rf {} + 2>/dev/null || true
    export KVEVICT_KERNEL_CACHE=$cache/kernels
    echo "kernel cache: $KVEVICT_KERNEL_CACHE"
}
