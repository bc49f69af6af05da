#!/usr/bin/env bash
# Creates (idempotently) a Python venv holding the pinned nvcc 13.0 from PyPI and
# prints the CUDA root inside it (…/site-packages/nvidia/cu13: bin/nvcc, include/,
# lib/libcudart_static.a). Venv path: $KVEVICT_NVCC_VENV, default <repo>/.venv-nvcc
# (gitignored). Offline machines: a venv carried there already is used as it is;
# or point KVEVICT_NVCC_WHEELS at a folder of the wheels (pip --no-index).
#
# Use:  CUDA_ROOT=$(bash cuda/install_nvcc.sh)
#       NVCC=$CUDA_ROOT/bin/nvcc cargo build --features cuda
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVEVICT_NVCC_VENV:-$here/.venv-nvcc}
pins=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)

find_root() {
  local r
  for r in "$venv"/lib/python3*/site-packages/nvidia/cu13; do
    if [ -x "$r/bin/nvcc" ] && [ -f "$r/lib/libcudart_static.a" ]; then
      printf '%s\n' "$r"; return 0
    fi
  done
  return 1
}

if root=$(find_root); then
  printf '%s\n' "$root"; exit 0
fi

py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" >&2
fi
if [ -n "${KVEVICT_NVCC_WHEELS:-}" ]; then
  "$venv/bin/python" -m pip install --quiet --no-index --find-links "$KVEVICT_NVCC_WHEELS" "${pins[@]}" >&2
else
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
if root=$(find_root); then
  # sanity: nvcc runs (called by its real path; a symlink breaks its relative lookups)
  "$root/bin/nvcc" --version >&2
  printf '%s\n' "$root"
else
  echo "install_nvcc.sh: nvcc not found in $venv after install" >&2
  exit 1
fi
