"""What `uniqueness` keeps at a tiny budget, token by token, with the answer (misses first).

    python eval/oneshot_diag.py TASK PROMPTS RATIO [SEED_BASE [TOKENS [VARIANT]]]
"""
import os
import sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import captures  # noqa: E402
import uniqueness_pools as up  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402


def main():
    model = Model(verbose=False)
    up.MODEL.append(model)
    task, n, r = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ntok = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    vname = sys.argv[6] if len(sys.argv) > 6 else "fwd9(default)"
    V = up.variants()
    sel = V[vname]
    tok = model.tokenizer
    for p, cap in captures.answered(model, task, n, ntok, seed, "agnostic"):
        res = evaluate_selections(model, cap, [(vname, sel)], [r], p.key)
        _, _, e, kept = res[0]
        ids = [int(t) for t in cap.a["prefill_ids"]]
        k0 = np.asarray(kept[0][0])
        same = all(np.array_equal(np.asarray(kept[l][h]), k0) for l in range(cap.n_layers) for h in range(cap.n_kv_heads))
        # group kept positions into runs
        runs, cur = [], [int(k0[0])]
        for q in k0[1:]:
            if q == cur[-1] + 1:
                cur.append(int(q))
            else:
                runs.append(cur); cur = [int(q)]
        runs.append(cur)
        txt = " | ".join(f"{c[0]}:{tok.decode([ids[i] for i in c])!r}" for c in runs)
        print(f"#{p.index} n={cap.n} key={p.key} {'OK' if e['correct'] else 'MISS'} kept={len(k0)} same={same} ans={e['answer']!r}")
        print("   ", txt, flush=True)


if __name__ == "__main__":
    main()
