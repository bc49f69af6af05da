"""`uniqueness` scores (the library's) with other continuations in the selection: the forward
post-pool's kernel and decay, value links (`kve_select_model_linked`), none. Question-agnostic
setting. Prints one row per variant: correct at each ratio, of the prompts the full cache answers.

    python eval/uniqueness_pools.py TASK PROMPTS RATIOS [SEED_BASE [TOKENS]]
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025
    python eval/uniqueness_pools.py needle 16 0.1,0.05,0.025 1000 2000
    python eval/uniqueness_pools.py multikey 8 0.1,0.05 1000
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025 0 1000 max13,none  (some variants)
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025 0 1000 "fwd9(default),power8,power16"

Results: README "Question-agnostic" (real prose).
"""
import os
import sys
import time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import agnostic  # noqa: E402
import captures  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
W = 8  # the window, kept inside the budget
MODEL = []


def mk(post_pool=None, links=None, surprisal=None, power=None, nosink=False):
    """A select(cap, ratio) of the library's uniqueness scores with this continuation
    (optionally times the prefill surprisal ** `surprisal`; `power`: the scores raised to
    power / 24, i.e. `(1 - r)^power` with its lends, the library's being 24; `nosink`: position 0
    scores 0, so the selection keeps the first cell only if the budget reaches it)."""
    def sel(cap, r):
        b = methods.head_budget(cap.n, r, W) - W
        s = methods.library_scores(cap, "uniqueness", W)
        if power:
            s = np.ascontiguousarray(s.astype(np.float64) ** (power / 24.0), np.float32)
        if nosink:
            s = s.copy()
            s[:, :, 0] = 0.0
        if surprisal:
            su = agnostic.surprisal(MODEL[0], cap).astype(np.float64)[: cap.n - W] ** surprisal
            s = np.ascontiguousarray(s.astype(np.float64) * su, np.float32)
        return methods.library_select(cap, s, b, W, "uniqueness", post_pool=post_pool, links=links)
    return sel


def main():
    model = Model(verbose=False)
    MODEL.append(model)
    task, n, ratios = sys.argv[1], int(sys.argv[2]), [float(r) for r in sys.argv[3].split(",")]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ntok = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    V = {"fwd9(default)": mk(), "none": mk(("none", 1, 1.0, 1)), "fwd3": mk(("forward", 3, 1.0, 1)),
         "fwd5": mk(("forward", 5, 1.0, 1)), "fwd1+links": mk(("forward", 1, 1.0, 1), 0.5),
         "fwd3+links": mk(("forward", 3, 1.0, 1), 0.5), "fwd9+links": mk(None, 0.5),
         "fwd9d.95": mk(("forward", 9, 0.95, 1)), "fwd9d.9": mk(("forward", 9, 0.9, 1)),
         "fwd9d.8": mk(("forward", 9, 0.8, 1)), "fwd16d.9": mk(("forward", 16, 0.9, 1)),
         # centred max pools: the continuation reaches back too (to a fact's label)
         "max5": mk(("max", 5, 1.0, 1)), "max13": mk(("max", 13, 1.0, 1)), "max17": mk(("max", 17, 1.0, 1)),
         # times the prefill's surprisal (needs every position's logits: an LM-head product per token)
         "x surprisal": mk(surprisal=1.0), "x surprisal^0.5": mk(surprisal=0.5),
         # other sharpening powers (the library's is 24; 8 until 2026-12-02)
         "power8": mk(power=8), "power12": mk(power=12), "power16": mk(power=16),
         "power32": mk(power=32), "power48": mk(power=48),
         # the first cell (an attention sink: SmolLM2 has no BOS) not kept for its own score
         "nosink": mk(nosink=True)}
    if len(sys.argv) > 6:
        V = {k: V[k] for k in sys.argv[6].split(",")}
    tot = {}; full = 0; t0 = time.time()
    for p, cap in captures.answered(model, task, n, ntok, seed, "agnostic"):
        full += 1
        marks = []
        for name, r, e, _ in evaluate_selections(model, cap, list(V.items()), ratios, p.key):
            tot[(name, r)] = tot.get((name, r), 0) + e["correct"]
            marks.append(f"{name}@{r}:{'ok' if e['correct'] else 'x'}")
        print(p.index, f"{time.time()-t0:.0f}s", " ".join(marks), flush=True)
    print(f"{task} seed {seed}: of {full} the full cache answers")
    for name in V:
        print(f"| {name} | " + " | ".join(f"{tot.get((name, r), 0)}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
