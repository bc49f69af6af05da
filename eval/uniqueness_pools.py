"""`uniqueness` scores (the library's) with other continuations in the selection: the forward
post-pool's kernel and decay, value links (`kve_select_model_linked`), none. Question-agnostic
setting. Prints one row per variant: correct at each ratio, of the prompts the full cache answers.

    python eval/uniqueness_pools.py TASK PROMPTS RATIOS [SEED_BASE [TOKENS]]
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025
    python eval/uniqueness_pools.py needle 16 0.1,0.05,0.025 1000 2000
    python eval/uniqueness_pools.py multikey 8 0.1,0.05 1000
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025 0 1000 max13,none  (some variants)
    python eval/uniqueness_pools.py needle-prose 20 0.1,0.05,0.025 0 1000 "fwd9(default),power8,power16"
    python eval/uniqueness_pools.py needle 20 0.1,0.05,0.025 0 1000 "fwd9(default),w8|w1<4%,w1"

`wW`: another observation window W inside the same budget (scores computed for it);
`w8|w1<4%`: the 8-token window at 4 % and above, only the last position below (docs/results/
agnostic.md "One-shot at 2.5 %").

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


def mk2(window=W, sinks=0, base=None, post_pool=None, power=None):
    """The default selection with another window `window` (kept inside the same budget
    floor(N r); the scores computed for that window) and the first `sinks` positions kept
    outright (their scores zeroed, the budget less `sinks`). `base(cap, r)` -> (window, sinks)
    makes both ratio-dependent."""
    def sel(cap, r):
        w, s0, pp = base(cap, r) if base else (window, sinks, post_pool)
        b = methods.head_budget(cap.n, r, w) - w
        s = methods.library_scores(cap, "uniqueness", max(w, 1))
        if power:
            s = np.ascontiguousarray(s.astype(np.float64) ** (power / 24.0), np.float32)
        if w == 0:  # (the last position scored 0)
            s = np.concatenate([s, np.zeros(s.shape[:2] + (1,), s.dtype)], axis=2)
        if s0:
            s = s.copy()
            s[:, :, :s0] = 0.0
            b -= s0
        kept = methods.library_select(cap, s, b, w, "uniqueness", post_pool=pp)
        if s0:
            kept = methods._union(kept, np.arange(s0))
        return kept
    return sel


_FLOORS = {}


def floors(cap, rank=4):
    """[L, Hkv, n] every token's `rank`-th largest min(cos k, cos v) over the other tokens
    (numpy, float64; the library's `uniqueness` floor at rank 4)."""
    key = (id(cap), rank)
    if key not in _FLOORS:
        for k in [k for k in _FLOORS if k[0] != id(cap)]:
            del _FLOORS[k]
        out = np.empty((cap.n_layers, cap.n_kv_heads, cap.n))
        for l in range(cap.n_layers):
            for h in range(cap.n_kv_heads):
                k = cap.keys[l, h].astype(np.float64); v = cap.values[l, h].astype(np.float64)
                k /= np.linalg.norm(k, axis=1, keepdims=True); v /= np.linalg.norm(v, axis=1, keepdims=True)
                sim = np.minimum(k @ k.T, v @ v.T)
                np.fill_diagonal(sim, -np.inf)
                out[l, h] = -np.partition(-sim, rank - 1, axis=1)[:, rank - 1]
        _FLOORS[key] = (cap, out)
    return _FLOORS[key][1]


def emu_scores(cap, w, flat=6, reach=10, decay=0.729, power=24, rank=4):
    """The library's `uniqueness` scores in numpy with another backward lend (flat / reach)
    or twin rank."""
    r = floors(cap, rank)[:, :, : cap.n - w]
    u = np.where(r >= 0.5, 0.0, np.maximum(0.0, 1.0 - r) ** power)
    out = u.copy()
    P = u.shape[2]
    for j in range(1, reach + 1):
        f = 1.0 if j <= flat else decay ** (j - flat)
        out[:, :, : P - j] = np.maximum(out[:, :, : P - j], f * u[:, :, j:])
    return np.ascontiguousarray(out, np.float32)


def mk3(window=1, flat=6, reach=10, post_pool=None, check=False, rank=4):
    """Selection of numpy-emulated `uniqueness` scores with another lend (`check`: the
    emulation at the library's lend against the library's scores)."""
    def sel(cap, r):
        b = methods.head_budget(cap.n, r, window) - window
        s = emu_scores(cap, window, flat, reach, rank=rank)
        if check:
            lib = methods.library_scores(cap, "uniqueness", window)
            err = np.abs(s - lib).max() / max(np.abs(lib).max(), 1e-30)
            print(f"  emu vs library: max rel err {err:.2e}", flush=True)
        return methods.library_select(cap, s, b, window, "uniqueness", post_pool=post_pool)
    return sel


def mk_keep1(threshold=0.04):
    """Below `threshold` keep ratio, the scores and window of the preset (8) but only the
    window's last position kept, its other 7 cells given to the prefix budget (a selection-
    only change: the scores are the library's as they are)."""
    def sel(cap, r):
        if r >= threshold:
            return mk()(cap, r)
        b = methods.head_budget(cap.n, r, W) - 1
        s = methods.library_scores(cap, "uniqueness", W)
        kept = methods.library_select(cap, s, b, W, "uniqueness")
        drop = np.arange(cap.n - W, cap.n - 1)
        return [[np.setdiff1d(k, drop).astype(np.int64) for k in row] for row in kept]
    return sel


def mk3r(hi, lo, threshold=0.04):
    """`hi` (a select) at a keep ratio >= `threshold`, `lo` below."""
    def sel(cap, r):
        return (hi if r >= threshold else lo)(cap, r)
    return sel


def variants():
    """name -> select(cap, ratio)."""
    return {"fwd9(default)": mk(), "none": mk(("none", 1, 1.0, 1)), "fwd3": mk(("forward", 3, 1.0, 1)),
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
         "nosink": mk(nosink=True),
         # another window inside the same budget; the first positions kept outright
         "w0": mk2(0), "w1": mk2(1), "w2": mk2(2), "w4": mk2(4), "w16": mk2(16),
         "sink2": mk2(sinks=2), "sink4": mk2(sinks=4),
         "w1fwd5": mk2(1, post_pool=("forward", 5, 1.0, 1)), "w1fwd7": mk2(1, post_pool=("forward", 7, 1.0, 1)),
         "w1fwd3": mk2(1, post_pool=("forward", 3, 1.0, 1)), "w8fwd5": mk2(8, post_pool=("forward", 5, 1.0, 1)),
         "w2fwd5": mk2(2, post_pool=("forward", 5, 1.0, 1)), "w3": mk2(3), "w6": mk2(6),
         # budget-dependent window: the 8-token window where it is at most a quarter of the
         # per-head budget floor(N r), else only the last position (the rest competes by score)
         "w8|w1<32": mk2(base=lambda cap, r: (8 if methods.head_budget(cap.n, r, W) >= 4 * W else 1, 0, None)),
         "w1p16": mk2(1, power=16), "w1p32": mk2(1, power=32), "w1p48": mk2(1, power=48),
         # numpy-emulated scores, other backward lends (window 1)
         "e-w1": mk3(1, check=True), "e-w1-l3r5": mk3(1, 3, 5), "e-w1-l4r6": mk3(1, 4, 6),
         "e-w1-l6r6": mk3(1, 6, 6), "e-w1-l2r4": mk3(1, 2, 4),
         "e-w1-l4r6f5": mk3(1, 4, 6, ("forward", 5, 1.0, 1)), "e-w1-l6r10f5": mk3(1, 6, 10, ("forward", 5, 1.0, 1)),
         "e-w1-k2": mk3(1, rank=2), "e-w1-k3": mk3(1, rank=3), "e-w1-k6": mk3(1, rank=6),
         "e-w1-k8": mk3(1, rank=8),
         "e-k6": mk3(8, rank=6), "e-k8": mk3(8, rank=8),
         # the twin rank and the window by keep ratio: (window 8, rank a) at 4 % and above,
         # (window 1, rank b) below
         "w8|w1k6<4%": mk3r(mk(), mk3(1, rank=6)), "w8|w1k8<4%": mk3r(mk(), mk3(1, rank=8)),
         "k6|w1k6<4%": mk3r(mk3(8, rank=6), mk3(1, rank=6)), "k8|w1k8<4%": mk3r(mk3(8, rank=8), mk3(1, rank=8)),
         "w8keep1<4%": mk_keep1(),
         # the same by ratio: window 1 below 4 %
         "w8|w1<4%": mk2(base=lambda cap, r: (8 if r >= 0.04 else 1, 0, None))}


def main():
    model = Model(verbose=False)
    MODEL.append(model)
    task, n, ratios = sys.argv[1], int(sys.argv[2]), [float(r) for r in sys.argv[3].split(",")]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ntok = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    V = variants()
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
