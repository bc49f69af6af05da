"""Does a stand-in for the evicted tokens help? The evicted tokens (after `uniqueness`'s
selection at the budget minus M slots) are cut into M runs in position order; each run is
replaced by one slot holding its mean key (post-RoPE, so q·k̄ is the run's mean logit) and
mean value, with an additive attention bias log(run length), so the softmax gets back a
(Jensen lower bound of the) mass the run had. The slots count inside the budget.

    python eval/merged_standin.py PROMPTS SEED_BASE RATIOS MS [TASK]
    python eval/merged_standin.py 8 0 0.1,0.05 0,4,8,16 multikey

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
from engine import Model  # noqa: E402
from needle import CONTEXT_TOKENS, answer_correct  # noqa: E402

def build(cap, S, M):
    """K2, V2, bias [L, Hkv, N] for kept S plus M merged segments of the evicted tokens."""
    N = cap.n
    K2 = cap.keys.copy(); V2 = cap.values.copy()
    bias = np.full((cap.n_layers, cap.n_kv_heads, N), -np.inf, np.float32)
    bias[:, :, S] = 0
    if M:
        ev = np.setdiff1d(np.arange(N), S)
        for seg in np.array_split(ev, M):
            if len(seg) == 0: continue
            j = seg[len(seg) // 2]
            K2[:, :, j] = cap.keys[:, :, seg].mean(axis=2)
            V2[:, :, j] = cap.values[:, :, seg].mean(axis=2)
            bias[:, :, j] = np.log(len(seg))
    return K2, V2, bias

def main():
    n = int(sys.argv[1]); seed_base = int(sys.argv[2]); ratios = [float(r) for r in sys.argv[3].split(",")]
    Ms = [int(m) for m in sys.argv[4].split(",")]
    task = sys.argv[5] if len(sys.argv) > 5 else "multikey"
    model = Model(verbose=False)
    tok = model.tokenizer
    m = methods.METHODS["uniqueness"]
    tot = {}; full = 0; t0 = time.time()
    for p, cap in captures.answered(model, task, n, CONTEXT_TOKENS, seed_base, "agnostic"):
        full += 1
        marks = []
        for r in ratios:
            for M in Ms:
                budget = int(round(r * cap.n))
                S = np.asarray(m.select(cap, (budget - M) / cap.n, m.window)[0][0])
                K2, V2, bias = build(cap, S, M)
                ans, _ = model.generate_masked(cap.suffix_ids, K2, V2, bias[None], len(cap.answer_ids))
                a = tok.decode(ans[0]); c = answer_correct(a, p.key)
                tot[(r, M)] = tot.get((r, M), 0) + c
                marks.append(f"{r}/M{M}:{'ok' if c else a.strip()[:6]}")
        print(p.index, p.key, f"{time.time()-t0:.0f}s", " ".join(marks), flush=True)
    for k, v in tot.items():
        print("ratio %g merged %d: %d/%d" % (k[0], k[1], v, full))
if __name__ == "__main__":
    main()
