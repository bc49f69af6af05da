"""Does one 10 % kept set exist that answers every question of a multi-key context? An oracle
that knows the questions: for each of a context's questions, question-aware LaProx-span (the
library's preset, the question in its window) picks an equal share of the budget among the
context's positions (the largest share whose union fits the budget); the union of those picks, plus the context's last 8 positions (the
agnostic window), is then decoded with each question as an agnostic selection would be.
`union+fill` tops the union up to the budget with the library's `uniqueness` ranking.

`--full-layers 0-9,10-19`: where does the model bind a label to its code? Rows that keep the
whole cache in those layers and, in the others, either the code sentences + 4 sinks + the
window (`code`) or `uniqueness`'s selection at the ratio.

It bounds what a question-agnostic method could reach by choosing better tokens: if this
union answers most questions, the multi-key misses are the selection's, not the model's.

    python eval/multikey_union.py --prompts 8 --ratios 0.1,0.05
    python eval/multikey_union.py --prompts 8 --ratios 0.1 --seed-base 1000
    python eval/multikey_union.py --prompts 8 --ratios 0.1 --full-layers 0-3,0-9,10-19,20-29
"""
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import captures  # noqa: E402
import methods  # noqa: E402
import tasks  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
from multikey_oracle import code_spans, multikey_args  # noqa: E402
from needle import answer_correct  # noqa: E402

W = 8


def aware_pick(aware, n_ctx, budget):
    """The context positions (< n_ctx - W) question-aware laprox-span keeps with `budget`
    prefix slots (token granularity: every head keeps the same list)."""
    s = methods.library_scores(aware, "laprox-span", W)
    kept = methods.library_select(aware, s, budget, W, "laprox-span")[0][0]
    return kept[kept < n_ctx - W]


def main():
    args, ratios = multikey_args(__doc__, "0.1,0.05", "--full-layers", "layer ranges A-B kept whole, e.g. 0-9,10-19")
    spans = [range(int(x.split("-")[0]), int(x.split("-")[1]) + 1) for x in args.full_layers.split(",") if x]
    model = Model(verbose=False)
    tok = model.tokenizer
    tot, full, sizes = {}, 0, {}
    for group in tasks.make_task("multikey", tok, args.prompts, seed_base=args.seed_base):
        ag = [captures.load_or_compute(model, p, "agnostic")[0] for p in group]
        aw = [captures.load_or_compute(model, p, "aware")[0] for p in group]
        n = ag[0].n
        picks = {}
        for r in ratios:
            prefix = methods.head_budget(n, r, W) - W
            # the largest equal share whose union still fits the budget
            lo, hi = prefix // len(group), prefix
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if len(np.unique(np.concatenate([aware_pick(a, n, mid) for a in aw]))) <= prefix:
                    lo = mid
                else:
                    hi = mid - 1
            u = np.unique(np.concatenate([aware_pick(a, n, lo) for a in aw]))
            rank = methods.library_scores(ag[0], "uniqueness", W)
            in_u = set(u.tolist())
            rest = [i for i in np.argsort(-rank.astype(np.float64).sum(axis=(0, 1)), kind="stable") if i not in in_u]
            picks[("uniqueness", r)] = methods.library_select(ag[0], rank, prefix, W, "uniqueness")[0][0]
            filled = np.unique(np.concatenate([u, np.asarray(rest[: max(prefix - len(u), 0)], np.int64)]))
            picks[("union", r)] = methods.add_window(u, n, W)
            picks[("union+fill", r)] = methods.add_window(filled, n, W)
            sizes.setdefault(r, []).append(len(u) / n)

        pieces = [tok.decode([int(t)]) for t in ag[0].a["prefill_ids"]]
        code = set(range(n - W, n)) | set(range(4))
        for sp in code_spans(pieces):
            code |= set(sp)
        for r in ratios:
            picks[("code", r)] = np.array(sorted(code), np.int64)

        def sel(name, whole=()):
            def f(cap, r):
                k, allk = picks[(name, r)], np.arange(cap.n, dtype=np.int64)
                return [[allk if l in whole else k for _ in range(cap.n_kv_heads)] for l in range(cap.n_layers)]
            return f
        V = [("union", sel("union")), ("union+fill", sel("union+fill"))]
        for sp in spans:
            for base in ("code", "uniqueness"):
                V.append((f"{base}, whole cache in layers {sp.start}-{sp.stop - 1}", sel(base, sp)))

        for p, cap in zip(group, ag):
            if not answer_correct(tok.decode(cap.answer_ids), p.key):
                continue
            full += 1
            for name, r, e, _ in evaluate_selections(model, cap, V, ratios, p.key):
                tot[(name, r)] = tot.get((name, r), 0) + e["correct"]
    print(f"multikey seed {args.seed_base}: of {full} the full cache answers (agnostic)")
    print("| oracle | " + " | ".join(f"{r:g}" for r in ratios) + " |")
    for name, _ in V:
        print(f"| {name} | " + " | ".join(f"{tot.get((name, r), 0)}/{full}" for r in ratios) + " |")
    print("| union size (prefix, mean) | " + " | ".join(f"{np.mean(sizes[r]):.1%}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
