"""What a tiny budget keeps: token-level vs per-head selections of the same scores.

    python eval/diag_small.py --prompts 20 --ratio 0.025 --methods laprox-span-w8,laprox-k1-fwdpost-w8
    python eval/diag_small.py --only 2,5,10,15 --oracle      # fixed sets decoded: what 16 tokens need

Per prompt and method: prefix tokens kept per head (mean), distinct prefix positions kept by
the model (union over heads), how many of the needle's 5 digits the union keeps, the share of
heads that keep all 5, and the kept tokens (token-level methods: the whole set, decoded).
Then the rank of the worst-ranked digit under laprox-span's token score (layer-normalised
sum of the library's laprox k = 1 scores, w = 8) pooled the old way (forward 8 / 0.9, the
sink lending) and the new way (forward 9 / 1.0, position 0 lending nothing).
`--oracle`: fixed token sets (+ the window) decoded through the compressed cache instead.
"""
import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import explore  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
from needle import CONTEXT_TOKENS, make_prompts  # noqa: E402

W = 8


def needle_positions(tok, ids, key):
    for i in range(len(ids) - len(key) + 1):
        if tok.decode(ids[i:i + len(key)]) == key:
            return list(range(i, i + len(key)))
    return []


def forward_pool(s, k, decay, sinks=0):
    """design §3 forward pooling, the first `sinks` positions lending nothing."""
    src = s.copy()
    src[:sinks] = 0.0
    out = s.copy()
    for j in range(1, k):
        out[j:] = np.maximum(out[j:], decay ** j * src[:-j])
    return out


def worst_rank(t, pos):
    order = np.lexsort((-np.arange(len(t)), -t))  # score desc, later position first
    rank = np.empty_like(order)
    rank[order] = np.arange(len(t))
    return int(rank[pos].max())


def oracle_sets(d, p):
    """Fixed prefix sets around the digits (first digit at d), p prefix tokens."""
    return {
        "sink+cue..digits+tail7": np.r_[0, d - 3:d + 5, p - 7:p],
        "sink+is..period+tail7": np.r_[0, d - 2:d + 6, p - 7:p],
        "sink+cue..period (no tail)": np.r_[0, d - 3:d + 6],
        "cue..period+tail7 (no sink)": np.r_[d - 3:d + 6, p - 7:p],
        "sink+digits": np.r_[0, d:d + 5],
        "sink0-7+cue..digits": np.r_[0:8, d - 3:d + 5],
    }


def fixed(prefix, w):
    def sel(cap, r):
        s = np.unique(np.concatenate([prefix, np.arange(cap.n - w, cap.n)])).astype(np.int64)
        return [[s.copy() for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]
    return sel


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="laprox-span-w8,span-w8,laprox-k1-fwdpost-w8")
    ap.add_argument("--ratio", type=float, default=0.025)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=CONTEXT_TOKENS)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--only", default="")
    ap.add_argument("--oracle", action="store_true")
    args = ap.parse_args(argv)
    model = Model(verbose=False)
    tok = model.tokenizer
    prompts = make_prompts(tok, args.prompts, args.tokens, args.seed_base)
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        prompts = [p for p in prompts if p.index in keep]
    for p in prompts:
        cap, _ = captures.load_or_compute(model, p, "aware")
        ids = [int(t) for t in cap.a["prefill_ids"]]
        pos = needle_positions(tok, ids, p.key)
        print(f"\nprompt {p.index} depth {p.depth:.2f} n {cap.n} digits at {pos[:1]}..")
        if args.oracle:
            sets = oracle_sets(pos[0], cap.n - W)
            res = evaluate_selections(model, cap, [(k, fixed(v, W)) for k, v in sets.items()], [args.ratio], p.key)
            for name, _, e, _ in res:
                print(f"  {name:30s} {len(sets[name]):3d} tokens {'ok' if e['correct'] else 'x '} {e['answer'][:10]!r}")
            continue
        for name in args.methods.split(","):
            m = explore.get(name)
            kept = m.select(cap, args.ratio, m.window)
            pref = [k[k < cap.n - m.window] for row in kept for k in row]
            union = np.unique(np.concatenate(pref))
            all5 = np.mean([np.isin(pos, k).all() for k in pref])
            dig = int(np.isin(pos, union).sum())
            line = (f"  {name:24s} w {m.window:2d} per-head {np.mean([len(k) for k in pref]):5.1f} "
                    f"union {len(union):4d} digits in union {dig}/5 heads with all 5 {all5:.2f}")
            if len(union) <= 40:
                line += "\n    kept: " + " ".join(f"{i}:{tok.decode([ids[i]])!r}" for i in union)
            print(line, flush=True)
        s = methods.library_scores(cap, "laprox-span", W)
        t = (s / s.reshape(s.shape[0], -1).sum(axis=1)[:, None, None]).sum(axis=(0, 1))
        print(f"  worst digit rank (of {len(t)}): pool 8/0.9 sink lends {worst_rank(forward_pool(t, 8, 0.9), pos)}, "
              f"pool 9/1.0 sink lends nothing {worst_rank(forward_pool(t, 9, 1.0, 1), pos)}")


if __name__ == "__main__":
    main()
