"""Does closing the gaps help? After a method's selection, the kept tokens are moved closer:
every gap between kept tokens shrunk to at most G positions, keys re-rotated by the RoPE
difference (G = 0: original positions, what the library and llama.cpp do), the question
fed after the last kept position. Question-agnostic setting, token-granularity methods.

    python eval/reposition.py PROMPTS SEED_BASE RATIOS TASK TOKENS GAPS [METHOD]
    python eval/reposition.py 20 0 0.1,0.05,0.025 needle 1000 0,1,2,4,16
    python eval/reposition.py 16 1000 0.1,0.05,0.025 needle 2000 0,1,2,4,16
    python eval/reposition.py 8 0 0.1,0.05 multikey 1000 0,1,2,4,16

Results: eval/README.md ("Closing the gaps").
"""
import os
import sys
import time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import captures  # noqa: E402
import methods  # noqa: E402
from engine import KVCache, Model  # noqa: E402
from needle import answer_correct  # noqa: E402

def decode(model, cap, S, G):
    S = np.asarray(sorted(S), np.int64)
    if G == 0:
        kept = [[S for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]
        cache = KVCache.from_arrays(cap.keys, cap.values, kept)
    else:
        d = np.diff(S, prepend=-1)
        newpos = np.cumsum(np.minimum(d, G)) - 1
        T = int(newpos[-1]) + 1
        delta = (newpos - S).astype(np.float64)
        L, H, _, hd = cap.keys.shape
        K = np.zeros((L, H, T, hd), np.float32); V = np.zeros((L, H, T, hd), np.float32)
        for l in range(L):
            K[l][:, newpos] = model._rope(cap.keys[l][:, S], delta)
            V[l][:, newpos] = cap.values[l][:, S]
        kept = [[newpos for _ in range(H)] for _ in range(L)]
        cache = KVCache.from_arrays(K, V, kept)
    ans, _, _ = model.generate(cap.suffix_ids, cache, len(cap.answer_ids))
    return model.tokenizer.decode(ans)

def main():
    n = int(sys.argv[1]); seed_base = int(sys.argv[2]); ratios = [float(r) for r in sys.argv[3].split(",")]
    task = sys.argv[4]; ntok = int(sys.argv[5]); Gs = [int(g) for g in sys.argv[6].split(",")]
    meth = sys.argv[7] if len(sys.argv) > 7 else "uniqueness"
    model = Model(verbose=False)
    tok = model.tokenizer
    m = methods.METHODS[meth]
    tot = {}; full = 0; t0 = time.time()
    for p, cap in captures.answered(model, task, n, ntok, seed_base, "agnostic"):
        full += 1
        marks = []
        for r in ratios:
            S = m.select(cap, r, m.window)[0][0]
            for G in Gs:
                a = decode(model, cap, S, G)
                c = answer_correct(a, p.key)
                tot[(r, G)] = tot.get((r, G), 0) + c
                marks.append(f"{r}/G{G}:{'ok' if c else a.strip()[:6]}")
        print(p.index, p.key, f"{time.time()-t0:.0f}s", " ".join(marks), flush=True)
    for k, v in sorted(tot.items()):
        print("%s %s ratio %g gap<=%d: %d/%d" % (task, meth, k[0], k[1], v, full))
if __name__ == "__main__":
    main()
