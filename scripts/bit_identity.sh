#!/usr/bin/env bash
# Bit-identity of every bench scorer's scores across a code change (how the README's
# "bit-identical" claims are checked): `save DIR` dumps the scores of the current build for
# all bench cases at N = 777 and 4096, with the native kernels and with KVEVICT_PORTABLE=1;
# `check DIR` (after the change) dumps them again and compares byte for byte, and also
# the native run with KVEVICT_NO_AVX512=1 (AVX2 only) against the same native reference.
#
#   scripts/bit_identity.sh save /tmp/ref     # on the old commit
#   scripts/bit_identity.sh check /tmp/ref    # on the new one: exit 1 on any difference
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?save or check}
REF=${2:?directory}
cargo build --release --example bench_cpu >&2
BIN=$PWD/target/release/examples/bench_cpu
dump() { # $1 = dir, $2 = 1 for the portable kernels, 2 for AVX2 without AVX-512
  mkdir -p "$1"
  if [ "$2" = 2 ]; then
    env -u KVEVICT_PORTABLE KVEVICT_NO_AVX512=1 "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1
  elif [ "$2" = 1 ]; then
    KVEVICT_PORTABLE=1 "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1
  else
    env -u KVEVICT_PORTABLE "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1
  fi
}
case "$MODE" in
  save)
    dump "$REF/avx2" 0
    dump "$REF/portable" 1
    echo "saved $(find "$REF" -name 'scores_*.bin' | wc -l) score files under $REF"
    ;;
  check)
    NEW=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-bits.XXXXXX")
    trap 'rm -rf "$NEW"' EXIT
    dump "$NEW/avx2" 0
    dump "$NEW/portable" 1
    dump "$NEW/no512" 2
    bad=0 n=0
    for f in $(cd "$REF" && find . -name 'scores_*.bin' | sort); do
      for g in "$f" $(case "$f" in ./avx2/*) echo "./no512/${f#./avx2/}" ;; esac); do
        n=$((n + 1))
        if ! cmp -s "$REF/$f" "$NEW/$g"; then
          echo "DIFFERS: $g"
          bad=$((bad + 1))
        fi
      done
    done
    [ "$n" -gt 0 ] || { echo "no reference scores under $REF" >&2; exit 2; }
    echo "$((n - bad)) of $n score files bit-identical"
    [ "$bad" = 0 ]
    ;;
  *) echo "unknown mode $MODE (save or check)" >&2; exit 2 ;;
esac
