"""Question-aware LaProx-span with its scores raised to a power before the selection (the
layer-sum normalisation and the token-granularity sum then weigh each head's peaks more):
the library's `kve_score_params.power` (the laprox-span preset's default is 3; power 1 is
the preset as it was before 2026-12-02). Prints one row per power: correct at each ratio,
of the prompts the full cache answers.

    python eval/span_power.py TASK PROMPTS RATIOS [SEED_BASE [TOKENS [POWERS]]]
    python eval/span_power.py needle-prose 20 0.1,0.05,0.025 0 1000 1,2,3
    python eval/span_power.py needle 16 0.1,0.05,0.025 1000 2000 1,3

Results: README "Question-aware at 2.5 % on prose".
"""
import os
import sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
W = 8  # LaProx-span's window, kept inside the budget


def span(power):
    """LaProx-span (w = 8), the library's scores at `power`, the library's selection."""
    def sel(cap, r):
        b = methods.head_budget(cap.n, r, W) - W
        s = methods.library_scores(cap, "laprox-span", W, power=power)
        return methods.library_select(cap, s, b, W, "laprox-span")
    return sel


def main():
    model = Model(verbose=False)
    task, n, ratios = sys.argv[1], int(sys.argv[2]), [float(r) for r in sys.argv[3].split(",")]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ntok = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
    powers = [int(x) for x in (sys.argv[6] if len(sys.argv) > 6 else "1,2,3").split(",")]
    V = [(f"power {p:g}", span(p)) for p in powers]
    tot, full = {}, 0
    for p, cap in captures.answered(model, task, n, ntok, seed, "aware"):
        full += 1
        for name, r, e, _ in evaluate_selections(model, cap, V, ratios, p.key):
            tot[(name, r)] = tot.get((name, r), 0) + e["correct"]
    print(f"{task} seed {seed} tokens {ntok}, question-aware: of {full} the full cache answers")
    for name, _ in V:
        print(f"| laprox-span, {name} | " + " | ".join(f"{tot.get((name, r), 0)}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
