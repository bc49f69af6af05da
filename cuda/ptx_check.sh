#!/usr/bin/env bash
# Checks of the kernels that need no GPU. First cuda/checks/tile_loads_test.cpp (the 16-byte
# tile loaders against a scalar reference, on the host). Then the generated code:
# compiles every cuda/*.cu (but bench.cu) for each architecture (KVEVICT_PTX_ARCHS, default "80 86 89 90") with the
# pinned nvcc 13.0 and -Xptxas -v, keeps the PTX, disassembles the cubin
# (cuobjdump -sass), and fails when
#  - any kernel on any arch has spill stores or spill loads (local-memory spills);
#  - a tile kernel (window_pass1, window_pass2, vonorm_kernel; every dtype and head
#    dim) has fewer than 5 128-bit global loads in its SASS (LDG.E.128) or none in
#    its PTX (ld.global.nc.v4): the unrolled 16-byte K / V tile path alone gives 4
#    (LOAD_UNROLL), so 5 also needs the Q-chunk / G-chunk path;
#  - cuda/checks/smem_table.cu finds a shape kvevict_cuda.h documents as supported on every
#    arch that the window / vonorm launchers would refuse for lack of shared memory.
# Prints per kernel: registers on each arch, static shared memory, stack frame and
# the 128-bit global loads; the full table goes to $OUT_DIR/kernels.tsv.
# cuobjdump and nvdisasm are not in the nvcc wheels: $CUOBJDUMP, the toolkit's, PATH,
# else the pinned 13.2 wheels (the oldest 13.x on PyPI; they read 13.0 cubins) in
# a venv (KVEVICT_CUOBJDUMP_VENV, default <repo>/.venv-cuobjdump; offline:
# KVEVICT_NVCC_WHEELS as for install_nvcc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
archs=${KVEVICT_PTX_ARCHS:-80 86 89 90}
archs=${archs//,/ }
OUT_DIR=${KVEVICT_PTX_OUT:-$repo/build/ptx_check}
if [ -z "${NVCC:-}" ]; then
  NVCC="$(bash cuda/install_nvcc.sh)/bin/nvcc"
fi
CUDA_ROOT=$(dirname "$(dirname "$NVCC")")
echo "ptx_check: nvcc $("$NVCC" --version | tail -n 1)"

# The tile loaders on the host (the CUDA headers only for their include guards).
"${CXX:-g++}" -std=c++17 -O1 -Wall -Wno-unknown-pragmas -Wno-comment -Icuda \
  -I"$CUDA_ROOT/include" cuda/checks/tile_loads_test.cpp -o "${TMPDIR:-/tmp}/kvevict_tile_loads_test.$$"
"${TMPDIR:-/tmp}/kvevict_tile_loads_test.$$"
rm -f "${TMPDIR:-/tmp}/kvevict_tile_loads_test.$$"

# Every launcher reports its own launch's status (kve::launch_kernel: cudaLaunchKernelEx's
# return value), never cudaGetLastError, which would report and clear a caller's earlier error.
# device.cu clears only the error its own cudaGetDeviceCount just set.
if grep -nE '<<<|cudaGetLastError|cudaPeekAtLastError' $(ls cuda/*.cu | grep -vE '/(bench|device)\.cu$'); then
  echo "ptx_check: FAIL: a launcher uses <<<>>> or the thread's last error (use launch_kernel)" >&2
  exit 1
fi
echo "ptx_check: every launch goes through launch_kernel (its own status)"

find_cuobjdump() {
  local c
  for c in "${CUOBJDUMP:-}" "$CUDA_ROOT/bin/cuobjdump" "$(command -v cuobjdump || true)"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ -x "$(dirname "$c")/nvdisasm" ]; then
      printf '%s\n' "$c"; return 0
    fi
  done
  local venv=${KVEVICT_CUOBJDUMP_VENV:-$repo/.venv-cuobjdump}
  for c in "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump; do
    if [ -x "$c" ] && [ -x "$(dirname "$c")/nvdisasm" ]; then
      printf '%s\n' "$c"; return 0
    fi
  done
  return 1
}
if ! cuobjdump=$(find_cuobjdump); then
  venv=${KVEVICT_CUOBJDUMP_VENV:-$repo/.venv-cuobjdump}
  pins=(nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51)
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv" >&2
  if [ -n "${KVEVICT_NVCC_WHEELS:-}" ]; then
    "$venv/bin/python" -m pip install --quiet --no-index --find-links "$KVEVICT_NVCC_WHEELS" "${pins[@]}" >&2
  else
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
  fi
  cuobjdump=$(find_cuobjdump) || { echo "ptx_check: no cuobjdump + nvdisasm" >&2; exit 1; }
fi
# cuobjdump calls nvdisasm from PATH
export PATH="$(dirname "$cuobjdump"):$PATH"
echo "ptx_check: $("$cuobjdump" --version | tail -n 1) ($cuobjdump)"

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
sources=$(ls cuda/*.cu | grep -v '/bench\.cu$')

# One job per (arch, source): cubin + kept PTX + ptxas report + SASS.
compile_one() {
  local a=$1 src=$2 name d
  name=$(basename "$src" .cu)
  d="$OUT_DIR/sm_$a/$name"
  mkdir -p "$d"
  if ! "$NVCC" -O3 -std=c++17 -Icuda -gencode="arch=compute_$a,code=sm_$a" -Xptxas -v \
      -cubin --keep --keep-dir "$d" -o "$d/$name.cubin" "$src" >"$d/ptxas.log" 2>&1; then
    echo "ptx_check: nvcc failed for $src sm_$a:" >&2
    cat "$d/ptxas.log" >&2
    return 1
  fi
  "$cuobjdump" -sass "$d/$name.cubin" >"$d/$name.sass"
}
export -f compile_one
export NVCC OUT_DIR cuobjdump
t0=$(date +%s)
jobs=${KVEVICT_PTX_JOBS:-$(nproc)}

# kernel_deps FILE: FILE and every file it includes, transitively (`#include "x"` / `<x>` found
# next to the including file or in cuda/; a name found in neither is the toolkit's, which nvcc's
# version stands for), sorted. Every #include line counts, also one in an #if branch (more than
# needed, never less); one of another form (a macro, #include_next) counts every file of cuda/.
kernel_deps() {
  local todo=("$1") seen=" " f n d
  while [ ${#todo[@]} -gt 0 ]; do
    f=${todo[-1]}; unset 'todo[-1]'
    case "$seen" in *" $f "*) continue ;; esac
    seen+="$f "
    while IFS= read -r n; do
      case "$n" in
        \"*\"*|\<*\>*) n=${n:1}; n=${n%%[\">]*} ;;
        *) ls cuda/*.cu cuda/*.cuh cuda/*.h cuda/checks/*; return 0 ;;
      esac
      for d in "$(dirname "$f")" cuda; do
        if [ -f "$d/$n" ]; then todo+=("$d/$n"); break; fi
      done
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*//p' "$f")
  done
  printf '%s\n' $seen | sort
}
# KVEVICT_KERNEL_CACHE (scripts/test.sh): each (arch, source)'s ptxas report, PTX and SASS are kept
# there (ptx-<arch>-<source>-<key>), keyed by the source and the files it includes (kernel_deps),
# the arch, this compile step and the tools' versions, so a changed source recompiles its own four
# cubins only (and a changed header those of the sources that include it); the checks below run
# on the tree either way
tools=$( { "$NVCC" --version; "$cuobjdump" --version; declare -f compile_one; } | sha256sum | cut -c1-16)
todo=() hits=0
for a in $archs; do
  for s in $sources; do
    name=$(basename "$s" .cu)
    if [ -n "${KVEVICT_KERNEL_CACHE:-}" ]; then
      key=$( { echo "$tools sm_$a"; for f in $(kernel_deps "$s"); do echo "== $f"; cat "$f"; done; } \
             | sha256sum | cut -c1-16)
      hit="$KVEVICT_KERNEL_CACHE/ptx-sm_$a-$name-$key"
      if [ -f "$hit/ptxas.log" ]; then
        mkdir -p "$OUT_DIR/sm_$a"
        cp -a "$hit" "$OUT_DIR/sm_$a/$name"
        touch "$hit"
        hits=$((hits + 1))
        continue
      fi
    fi
    todo+=("$a $s ${hit:-}")
  done
done
if [ ${#todo[@]} -gt 0 ]; then
  printf '%s\n' "${todo[@]}" | cut -d' ' -f1,2 | xargs -P "$jobs" -n 2 bash -c 'compile_one "$0" "$1"'
fi
# (only what the checks read is kept: the .ii, .cudafe and cubin files are ~20x that)
for t in "${todo[@]}"; do
  read -r a s hit <<<"$t"
  [ -n "$hit" ] || continue
  d="$OUT_DIR/sm_$a/$(basename "$s" .cu)"
  tmp="$hit.$$"
  mkdir -p "$tmp" && cp "$d"/ptxas.log "$d"/*.ptx "$d"/*.sass "$tmp"/ && mv -T "$tmp" "$hit" 2>/dev/null || rm -rf "$tmp"
done
echo "ptx_check: compiled ${#todo[@]} of $(( $(echo $sources | wc -w) * $(echo $archs | wc -w) )) (source, arch) pairs in $(( $(date +%s) - t0 )) s (the rest, $hits, from the kernel cache)"

# kernels.tsv: arch, source, mangled kernel, registers, static smem, stack, spill
# stores, spill loads, SASS LDG.E.128, PTX ld.global(.nc).v4 (all in bytes / counts).
tsv="$OUT_DIR/kernels.tsv"
printf 'arch\tsource\tkernel\tregs\tsmem\tstack\tspill_st\tspill_ld\tldg128\tptx_v4\n' >"$tsv"
for a in $archs; do
  for s in $sources; do
    name=$(basename "$s" .cu)
    d="$OUT_DIR/sm_$a/$name"
    ptx=$(ls "$d"/*.ptx | head -n 1)
    awk -v arch="sm_$a" -v src="$name" -v sass="$d/$name.sass" -v ptx="$ptx" '
      BEGIN {
        while ((getline l < sass) > 0) {
          if (l ~ /Function : /) { f = l; sub(/.*Function : /, "", f); sub(/[ \t].*/, "", f) }
          else if (l ~ /LDG\.E\.128/) ldg[f]++
        }
        while ((getline l < ptx) > 0) {
          if (l ~ /^[. a-z]*\.entry /) { f = l; sub(/.*\.entry /, "", f); sub(/\(.*/, "", f) }
          else if (l ~ /ld\.global(\.nc)?\.v4\./) v4[f]++
        }
      }
      /Compiling entry function/ { f = $0; sub(/.*entry function \047/, "", f); sub(/\047.*/, "", f); fn = f }
      /Function properties for / { cur = $0; sub(/.*Function properties for /, "", cur); sub(/[ \t]*$/, "", cur) }
      /spill stores/ {
        match($0, /[0-9]+ bytes stack frame/); st = substr($0, RSTART, RLENGTH) + 0
        match($0, /[0-9]+ bytes spill stores/); ss = substr($0, RSTART, RLENGTH) + 0
        match($0, /[0-9]+ bytes spill loads/); sl = substr($0, RSTART, RLENGTH) + 0
        stack[cur] = st; sst[cur] = ss; sld[cur] = sl; seen[cur] = 1
      }
      /Used [0-9]+ registers/ {
        match($0, /Used [0-9]+ registers/); r = substr($0, RSTART + 5, RLENGTH - 5) + 0
        sm = 0
        if (match($0, /[0-9]+ bytes smem/)) sm = substr($0, RSTART, RLENGTH) + 0
        printf "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", arch, src, fn, r, sm, stack[fn], sst[fn], sld[fn], ldg[fn] + 0, v4[fn] + 0
        done[fn] = 1
      }
      # non-inlined device functions: their own spill lines (registers unknown: -1)
      END { for (f in seen) if (!(f in done))
              printf "%s\t%s\t%s\t-1\t0\t%d\t%d\t%d\t0\t0\n", arch, src, f, stack[f], sst[f], sld[f] }' "$d/ptxas.log" >>"$tsv"
  done
done

# Readable table: one line per kernel, registers per arch.
echo
awk -F'\t' -v archs="$archs" '
  NR == 1 { next }
  { k = $3; key[k] = 1; src[k] = $2; regs[k, $1] = $4; smem[k] = $5; stack[k] = ($6 > stack[k] ? $6 : stack[k])
    ldg[k, $1] = $9 }
  END {
    n = split(archs, A, " ")
    hdr = sprintf("%-44s %-10s", "kernel", "source")
    for (i = 1; i <= n; i++) hdr = hdr sprintf(" r%-4s", A[i])
    hdr = hdr sprintf(" %7s %5s", "smem_B", "stack")
    for (i = 1; i <= n; i++) hdr = hdr sprintf(" ldg128_%-3s", A[i])
    print hdr
    for (k in key) {
      cmd = "c++filt -p " "\047" k "\047"; cmd | getline dm; close(cmd)
      gsub(/kve::\(anonymous namespace\)::/, "", dm); gsub(/__nv_bfloat16/, "bf16", dm); gsub(/__half/, "f16", dm)
      line = sprintf("%-44s %-10s", substr(dm, 1, 44), src[k])
      for (i = 1; i <= n; i++) line = line sprintf(" %5s", regs[k, "sm_" A[i]])
      line = line sprintf(" %7d %5d", smem[k], stack[k])
      for (i = 1; i <= n; i++) line = line sprintf(" %10s", ldg[k, "sm_" A[i]])
      print line
    }
  }' "$tsv" | { read -r h; echo "$h"; sort; }

fail=0
echo
spills=$(awk -F'\t' 'NR > 1 && ($7 > 0 || $8 > 0)' "$tsv")
if [ -n "$spills" ]; then
  echo "FAIL: local-memory spills (arch, source, kernel, regs, smem, stack, spill st, spill ld):"
  echo "$spills"
  fail=1
else
  echo "ok: 0 bytes spill stores / loads in all $(($(wc -l <"$tsv") - 1)) kernel builds"
fi
tiles=$(awk -F'\t' 'NR > 1 && $3 ~ /window_pass[12]|vonorm_kernel/' "$tsv")
ntiles=$(printf '%s\n' "$tiles" | grep -c . || true)
want=$(( $(echo $archs | wc -w) * 2 * 3 * 3 + $(echo $archs | wc -w) * 3 * 3 ))
if [ "$ntiles" -ne "$want" ]; then
  echo "FAIL: expected $want tile-kernel builds (window pass 1/2, vonorm; 3 dtypes x 3 dims), found $ntiles"
  fail=1
fi
novec=$(printf '%s\n' "$tiles" | awk -F'\t' '$9 < 5 || $10 < 1')
if [ -n "$novec" ]; then
  echo "FAIL: tile kernels without the 16-byte load paths (need >= 5 LDG.E.128, >= 1 ld.global.v4):"
  echo "$novec"
  fail=1
else
  echo "ok: all $ntiles tile-kernel builds have >= 5 LDG.E.128 in SASS and ld.global.nc.v4 in PTX"
fi

# Dynamic shared memory of the window / vonorm launchers against each arch's limit. The table
# program (it includes window.cu and vonorm.cu) is kept in KVEVICT_KERNEL_CACHE too, keyed by the
# program's source and the files it includes (kernel_deps), its compile command and the versions of nvcc and of the
# host compiler: its compile (~1-2 min on 2 cores) was the one left in a warm CI run.
echo
compile_smem_table() {
  "$NVCC" -O1 -std=c++17 -Icuda -gencode=arch=compute_90,code=sm_90 -L"$CUDA_ROOT/lib" \
    cuda/checks/smem_table.cu -o "$1"
}
skey=""
if [ -n "${KVEVICT_KERNEL_CACHE:-}" ]; then
  skey=$( { for f in $(kernel_deps cuda/checks/smem_table.cu); do echo "== $f"; cat "$f"; done
            declare -f compile_smem_table; "$NVCC" --version; "${NVCC_CCBIN:-g++}" --version; } 2>&1 \
          | sha256sum | cut -c1-16)
  shit="$KVEVICT_KERNEL_CACHE/smem-table-$skey"
fi
if [ -n "$skey" ] && [ -x "$shit/smem_table" ]; then
  cp "$shit/smem_table" "$OUT_DIR/smem_table"
  touch "$shit"
  echo "ptx_check: smem_table from $shit"
else
  compile_smem_table "$OUT_DIR/smem_table"
  if [ -n "$skey" ]; then
    tmp="$KVEVICT_KERNEL_CACHE/.smem-table-$skey.$$"
    mkdir -p "$tmp" && cp "$OUT_DIR/smem_table" "$tmp/" && mv -T "$tmp" "$shit" 2>/dev/null || rm -rf "$tmp"
  fi
fi
"$OUT_DIR/smem_table" || fail=1

echo
if [ "$fail" -ne 0 ]; then
  echo "ptx_check: FAILED"
  exit 1
fi
echo "ptx_check: passed ($(echo $archs | wc -w) archs)"
