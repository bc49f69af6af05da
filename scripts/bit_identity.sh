#!/usr/bin/env bash
# Bit-identity of every bench scorer's scores across a code change (how the README's
# "bit-identical" claims are checked): `save DIR` dumps the scores of the current build for
# all bench cases at N = 777 and 4096, with the AVX2 kernels and with KVEVICT_PORTABLE=1;
# `check DIR` (after the change) dumps them again and compares byte for byte.
#
#   scripts/bit_identity.sh save /tmp/ref     # on the old commit
#   scripts/bit_identity.sh check /tmp/ref    # on the new one: exit 1 on any difference
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?save or check}
REF=${2:?directory}
cargo build --release --example bench_cpu >&2
BIN=$PWD/target/release/examples/bench_cpu
dump() { # $1 = dir, $2 = 1 for the portable kernels
  mkdir -p "$1"
  if [ "$2" = 1 ]; then
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
    bad=0 n=0
    for f in $(cd "$REF" && find . -name 'scores_*.bin' | sort); do
      n=$((n + 1))
      if ! cmp -s "$REF/$f" "$NEW/$f"; then
        echo "DIFFERS: $f"
        bad=$((bad + 1))
      fi
    done
    [ "$n" -gt 0 ] || { echo "no reference scores under $REF" >&2; exit 2; }
    echo "$((n - bad)) of $n score files bit-identical"
    [ "$bad" = 0 ]
    ;;
  *) echo "unknown mode $MODE (save or check)" >&2; exit 2 ;;
esac
