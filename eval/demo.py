"""kvevict on a real model: SmolLM2-135M answers a needle question from 10 % of its KV cache.

    scripts/demo.sh                     (fresh machine: setup, build, install, then this)
    python eval/demo.py [--ratio 0.1] [--prompt 10] [--method laprox-span-w8]

One needle prompt (~1000 tokens, a 5-digit pass key hidden in filler), question-aware: the
prompt but its last token is prefilled, the cache is compressed, then the last token and
the answer go through the compressed cache. Prints the answers of the full cache, of the
best LaProx preset and of StreamingLLM at the same budget (kvpress accounting: the
observation window counts inside floor(N * ratio) positions per layer and KV head), the KV
memory kept (bytes and %, after the library's varlen compaction) and kvevict's time.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate  # noqa: E402
from needle import make_prompt  # noqa: E402

BEST = methods.BEST_PRESET


def csr(kept):
    """kept[l][h] -> the library's (offsets, indices) CSR over units l*Hkv + h."""
    flat = [np.asarray(k, np.uint32) for row in kept for k in row]
    offsets = np.zeros(len(flat) + 1, np.uint64)
    offsets[1:] = np.cumsum([len(k) for k in flat])
    return offsets, np.concatenate(flat)


def compacted_bytes(kve, cap, kept):
    """Compact K and V of every layer with the library (varlen layout) -> (bytes, seconds)."""
    offsets, indices = csr(kept)
    t0 = time.perf_counter()
    nbytes = 0
    for l in range(cap.n_layers):
        for src in (cap.keys[l], cap.values[l]):
            rows, cu = kve.compact_varlen(src, offsets, indices, first_unit=l * cap.n_kv_heads)
            assert int(cu[-1]) == rows.shape[0]
            nbytes += rows.nbytes
    return nbytes, time.perf_counter() - t0


def mib(b):
    return f"{b / 2 ** 20:.2f} MiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratio", type=float, default=0.1, help="keep ratio, window inside (default 0.1)")
    ap.add_argument("--prompt", type=int, default=10, help="prompt index of --prompts (needle depth index/(prompts-1))")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--method", default=BEST, help=f"method of eval/methods.py (default {BEST})")
    args = ap.parse_args(argv)

    t_start = time.time()
    kve = methods.kvevict()
    model = Model()
    p = make_prompt(model.tokenizer, args.prompt, args.prompts)
    print(f"prompt {args.prompt}: {len(p.ids)} tokens, pass key {p.key} at depth {100 * p.depth:.0f} % of the filler")
    at = p.context.index("The pass key is")
    print(f'  ..."{p.context[max(at - 60, 0):at + 60]}"...')
    print(f"  question: {p.question.strip()!r}")
    t0 = time.time()
    cap, cached = captures.load_or_compute(model, p, "aware")
    print(f"prefill of {cap.n} tokens (full cache, captures {'cached' if cached else 'computed'}) in {time.time() - t0:.1f}s")

    elem = cap.keys.dtype.itemsize
    full_bytes = 2 * cap.n_layers * cap.n_kv_heads * cap.n * cap.head_dim * elem
    rows = [("full cache", methods.select_full(cap, 1.0, 32), full_bytes, None)]

    # kvevict: Gram matrices once per model, then score + select for this prompt
    best = methods.get(args.method)
    t0 = time.perf_counter()
    for l in range(cap.n_layers):
        kve.gram_cache.get(cap.wo, l, cap.n_heads, cap.n_kv_heads, False)
    t_gram = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    kept = best.select(cap, args.ratio, best.window)
    t_sel = (time.perf_counter() - t0, time.process_time() - c0)
    nbytes, t_comp = compacted_bytes(kve, cap, kept)
    rows.append((f"{args.method} @ {args.ratio:g}", kept, nbytes, (t_sel, t_comp)))

    sl = methods.get("streamingllm")
    kept = sl.select(cap, args.ratio, sl.window)
    nbytes, _ = compacted_bytes(kve, cap, kept)
    rows.append((f"streamingllm @ {args.ratio:g}", kept, nbytes, None))

    print(f"\nKV cache: {cap.n_layers} layers x {cap.n_kv_heads} KV heads x {cap.n} tokens x {cap.head_dim} dims, "
          f"K and V, float{8 * elem}. Budget: floor({cap.n} x {args.ratio:g}) = "
          f"{methods.head_budget(cap.n, args.ratio, 32)} positions per (layer, KV head), the observation window "
          f"included (kvpress accounting; {args.method}: w = {best.window}, streamingllm: 4 sinks + recent).\n")
    print(f"{'method':<24} {'KV kept':>22}   answer")
    for name, kept, nbytes, _ in rows:
        r = evaluate(model, cap, kept, p.key)
        mark = "right" if r["correct"] else "WRONG"
        print(f"{name:<24} {mib(nbytes):>10} ({100 * nbytes / full_bytes:5.1f} %)   {r['answer']!r} ({mark}; "
              f"KL {r['kl']:.3f}, layer err {r['layer_err']:.3f})")
    t_sel, t_comp = rows[1][3]
    print(f"\nkvevict ({kve.library_path()}), one thread: {args.method} scored {cap.n_layers} layers and selected in "
          f"{1000 * t_sel[0]:.0f} ms ({1000 * t_sel[1]:.0f} ms CPU), compacted K and V (varlen) in {1000 * t_comp:.0f} ms; "
          f"the Gram matrices (once per model) took {1000 * t_gram:.0f} ms.")
    print(f"demo: {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
