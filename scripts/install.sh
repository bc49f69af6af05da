#!/usr/bin/env bash
# Build kvevict and install it under PREFIX:
#   PREFIX/include/kvevict.h, PREFIX/include/kvevict_ggml.hpp (the glue for engines built on ggml)
#   PREFIX/lib/libkvevict.a, PREFIX/lib/libkvevict.so
#   PREFIX/lib/pkgconfig/kvevict.pc
#   PREFIX/lib/cmake/kvevict/kvevictConfig.cmake (+ ConfigVersion)  -> target kvevict::kvevict
#
# Usage: scripts/install.sh PREFIX
# Environment: KVEVICT_PROFILE (cargo profile, default release),
#              KVEVICT_FEATURES (e.g. "cuda"), CARGO_TARGET_DIR (as cargo reads it),
#              KVEVICT_INSTALL_FROM (a folder holding libkvevict.a and libkvevict.so that a
#              cargo build already made: those are installed and cargo is not run; the
#              profile is then that build's, and KVEVICT_FEATURES must name its features
#              (they decide the static link line). tests/c_examples.rs passes its
#              own build's, so the test compiles the library once, not a second time).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
profile=${KVEVICT_PROFILE:-release}
features=${KVEVICT_FEATURES:-}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)

if [ -n "${KVEVICT_INSTALL_FROM:-}" ]; then
    out=$KVEVICT_INSTALL_FROM
    [ -f "$out/libkvevict.a" ] && [ -f "$out/libkvevict.so" ] ||
        { echo "install.sh: no libkvevict.a and libkvevict.so in KVEVICT_INSTALL_FROM=$out" >&2; exit 1; }
else
    args=(build --lib --manifest-path "$root/Cargo.toml" --profile "$profile")
    if [ -n "$features" ]; then
        args+=(--features "$features")
    fi
    cargo "${args[@]}"

    target_dir=${CARGO_TARGET_DIR:-$root/target}
    case "$profile" in
        dev) out="$target_dir/debug" ;;
        *) out="$target_dir/$profile" ;;
    esac
fi

# libraries the static archive needs (rustc --print native-static-libs on Linux)
static_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
# the CUDA builds (cuda, cuda-emu) bundle C++ objects (the launchers, cudart_static or the emulator)
case " ${features//,/ } " in *" cuda "* | *" cuda-emu "*) static_libs="-lstdc++ $static_libs" ;; esac

install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/kvevict"
install -m 644 "$root/include/kvevict.h" "$prefix/include/kvevict.h"
install -m 644 "$root/include/kvevict_ggml.hpp" "$prefix/include/kvevict_ggml.hpp"
install -m 644 "$out/libkvevict.a" "$prefix/lib/libkvevict.a"
install -m 755 "$out/libkvevict.so" "$prefix/lib/libkvevict.so"

sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@STATIC_LIBS@|$static_libs|g" \
    "$root/kvevict.pc.in" > "$prefix/lib/pkgconfig/kvevict.pc"
sed -e "s|@STATIC_LIBS@|$static_libs|g" \
    "$root/cmake/kvevictConfig.cmake.in" > "$prefix/lib/cmake/kvevict/kvevictConfig.cmake"
sed -e "s|@VERSION@|$version|g" \
    "$root/cmake/kvevictConfigVersion.cmake.in" > "$prefix/lib/cmake/kvevict/kvevictConfigVersion.cmake"

echo "installed kvevict $version (${KVEVICT_INSTALL_FROM:-$profile}) to $prefix"
