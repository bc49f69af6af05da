#!/usr/bin/env bash
# Bit-identity of every bench scorer's scores across a code change (how the README's
# "bit-identical" claims are checked): `save DIR` dumps the scores of the current build for
# all bench cases at N = 777 and 4096 with each kernel build this CPU can run: native
# (AVX-512 where the CPU has it, else AVX2; NEON on AArch64), KVEVICT_NO_AVX512=1 (AVX2
# only) and KVEVICT_PORTABLE=1; `check DIR` (after the change) dumps them again and
# compares each build with its own saved scores, byte for byte. The builds do not share
# bits with each other (design.md §2: AVX-512 and NEON give the shared bits, AVX2 alone its
# own, with one exp per logit; portable its unfused ones), so each is its own reference.
#
#   scripts/bit_identity.sh save /tmp/ref     # on the old commit
#   scripts/bit_identity.sh check /tmp/ref    # on the new one: exit 1 on any difference
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?save or check}
REF=${2:?directory}
cargo build --release --example bench_cpu >&2
BIN=$PWD/target/release/examples/bench_cpu
BUILDS="native no512 portable"
dump() { # $1 = dir, $2 = the build: native, no512 (AVX2 without AVX-512) or portable
  mkdir -p "$1"
  case "$2" in
    no512) env -u KVEVICT_PORTABLE KVEVICT_NO_AVX512=1 "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1 ;;
    portable) KVEVICT_PORTABLE=1 "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1 ;;
    *) env -u KVEVICT_PORTABLE -u KVEVICT_NO_AVX512 "$BIN" --reps 1 --n 777,4096 --dump "$1" >/dev/null 2>&1 ;;
  esac
}
case "$MODE" in
  save)
    for b in $BUILDS; do dump "$REF/$b" "$b"; done
    echo "saved $(find "$REF" -name 'scores_*.bin' | wc -l) score files under $REF"
    ;;
  check)
    NEW=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-bits.XXXXXX")
    trap 'rm -rf "$NEW"' EXIT
    for b in $BUILDS; do dump "$NEW/$b" "$b"; done
    bad=0 n=0
    for b in $BUILDS; do
      [ -d "$REF/$b" ] || { echo "no $b scores under $REF (saved by an older script?)" >&2; exit 2; }
      for f in $(cd "$REF/$b" && find . -name 'scores_*.bin' | sort); do
        n=$((n + 1))
        if ! cmp -s "$REF/$b/$f" "$NEW/$b/$f"; then
          echo "DIFFERS: $b/${f#./}"
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
