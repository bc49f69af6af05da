"""CI smoke of the evaluation harness: 2 needle prompts, 2 keep ratios, every non-library method.

    eval/setup.sh && .venv-eval/bin/python eval/smoke.py

Fails (exit 1) unless: the engine matches kvpress's tensors (when the vectors are present),
the full cache answers both prompts with KL 0 and layer error 0, and every method returns
a valid selection whose size matches the budget and gives finite metrics.
TODO once the kvevict binding exists: library scores vs the numpy recomputation.
"""
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import check_engine  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate  # noqa: E402
from needle import make_prompt  # noqa: E402

PROMPTS = (3, 6)   # of 10: needle depths 33% and 67% (the full cache misses depth 0%)
N_PROMPTS = 10
RATIOS = (0.25, 0.1)


def main():
    t0 = time.time()
    failures = []

    def expect(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}", flush=True)
        if not cond:
            failures.append(what)

    model = Model()
    folder = check_engine.find_vectors()
    if folder:
        print(f"engine vs kvpress ({folder}):")
        expect(check_engine.check(model, folder, log=lambda s: print("    " + s)), "engine matches kvpress tensors")
    else:
        print("engine vs kvpress: vectors not found, skipped")

    names = [n for n, m in methods.METHODS.items() if not m.library]
    for i in PROMPTS:
        p = make_prompt(model.tokenizer, i, N_PROMPTS)
        cap, _ = captures.load_or_compute(model, p, "aware")
        print(f"prompt {i} (depth {p.depth:.2f}, key {p.key}, n={cap.n}):", flush=True)
        for name in names:
            m = methods.get(name)
            for ratio in ([1.0] if name == "full" else RATIOS):
                kept = m.select(cap, ratio, m.window)
                total = methods.check_kept(kept, cap)
                r = evaluate(model, cap, kept, p.key)
                tag = f"{name}@{ratio:g}"
                if name == "full":
                    expect(r["correct"], f"{tag} answers {p.key} (got {r['answer']!r})")
                    expect(abs(r["kl"]) < 1e-5 and r["layer_err"] < 1e-6, f"{tag} KL {r['kl']:.1e}, layer err {r['layer_err']:.1e} ~ 0")
                else:
                    want = methods.total_budget(cap, ratio, m.window)
                    expect(total == want, f"{tag} keeps {total} positions (budget {want})")
                    expect(math.isfinite(r["kl"]) and math.isfinite(r["layer_err"]),
                           f"{tag} metrics finite (KL {r['kl']:.3f}, layer err {r['layer_err']:.3f}, "
                           f"{'right' if r['correct'] else 'wrong'} answer {r['answer']!r})")
    print(f"smoke: {'FAILED: ' + '; '.join(failures) if failures else 'passed'} ({time.time() - t0:.0f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
