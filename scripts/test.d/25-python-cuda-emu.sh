#!/usr/bin/env bash
# The Python device API (kvevict.cuda, python/kvevict/cuda.py) without a GPU: build the
# cdylib with feature cuda-emu (the REAL kernels of cuda/ on the CPU emulator of cuda/emu)
# and run python/tests/test_cuda.py, test_cuda_evictor.py and test_cuda_evictor_paged.py against it (KVEVICT_LIB), comparing kvevict.cuda with
# the host API. Its fake device arrays are numpy memory registered with the emulated
# runtime (kve_emu_host_register, as cudaHostRegister'd mapped memory), so the emulator
# still aborts on a kernel pointer outside every registered range. Built in target/emu-lib as
# 22-torch.sh builds it (one build for both; its own folder, so target/release keeps the default
# build the later steps link; the kernels come from the kernel cache). Same venv as 20-python.sh ($KVEVICT_PY_VENV or
# <repo>/.venv-py, created the same way when missing). Fails on any failure, skip, or when
# no test ran. What this proves: the binding's descriptors, strides, lengths and statuses,
# and the kernels' results through it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY_STEP=python-cuda-emu
. scripts/lib/py_venv.sh
lib=$ROOT/target/emu-lib/release/libkvevict.so

env -u KVEVICT_EMU_SANITIZE CARGO_TARGET_DIR="$ROOT/target/emu-lib" \
    cargo build --release --lib --features cuda-emu 2>&1 | tail -n 3
test -f "$lib" || { echo "no $lib" >&2; exit 1; }

# the package under test, installed as 20-python.sh does (KVEVICT_LIB wins over a bundled copy)
py_venv_setup

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # import the installed package, not python/kvevict
KVEVICT_LIB=$lib "$venv/bin/python" "$ROOT/python/tests/run.py" --pattern 'test_cuda.py' --pattern 'test_cuda_evictor.py' --pattern 'test_cuda_evictor_paged.py' \
    --label python-cuda-emu --no-skips
