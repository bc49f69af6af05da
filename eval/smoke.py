"""CI smoke of the evaluation: 2 needle prompts, 2 keep ratios, the library on a real model.

    eval/setup.sh && .venv-eval/bin/python eval/smoke.py      (scripts/test.d/30-eval.sh)

Fails (exit 1) unless:
- the engine matches kvpress's tensors (when the vectors are present);
- the full cache answers both prompts, with KL 0 and layer error 0;
- conformance: the library's scores on the captured tensors equal a plain numpy float64
  recomputation of the design §3 formulas (snapkv, snapkv-kvpress, laprox k=7 and k=1, lava;
  relative 1e-4 elementwise, plus 1e-7 of the layer's largest score), the uniform
  selection equals a numpy top-K of the library's scores (ties: later position first), and
  the library's streamingllm equals the numpy one;
- every method of the table returns a valid selection of the kvpress budget (window inside
  floor(N * ratio) per head; pyramidkv within 1 %) and finite metrics through the
  compressed cache (batched decode), and the batched decode gives the sequential one's
  answers and metrics (laprox-span, streamingllm).
"""
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import check_engine  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate, evaluate_many  # noqa: E402
from needle import make_prompt  # noqa: E402

PROMPTS = (3, 6)   # of 10: needle depths 33% and 67% (the full cache misses depth 0%)
N_PROMPTS = 10
RATIOS = (0.25, 0.1)
SEQUENTIAL = ("laprox-span", "streamingllm")  # also decoded one by one: batched == sequential
RTOL = 1e-4


# ---------------------------------------------------------------- numpy references (design §2, §3)
def window_attention(q_window, keys):
    """design §2 in float64. q_window [Hq, w, hd], keys [Hkv, n, hd] -> A [Hq, w, n], causal
    inside the window, softmax over all visible keys."""
    q = q_window.astype(np.float64)
    k = keys.astype(np.float64)
    Hq, w, hd = q.shape
    Hkv, n, _ = k.shape
    g = Hq // Hkv
    z = np.einsum("hjd,hid->hji", q, np.repeat(k, g, axis=0)) / math.sqrt(hd)
    future = np.arange(n)[None, :] > (n - w + np.arange(w))[:, None]  # [w, n]
    z[:, future] = -np.inf
    z -= z.max(axis=-1, keepdims=True)
    a = np.exp(z)
    return a / a.sum(axis=-1, keepdims=True)


def pool1d(s, kernel, mode):
    """Along the last axis, stride 1, padding kernel//2: `max` pads with -inf, `avg` counts
    pads as zeros (PyTorch avg_pool1d default)."""
    if kernel <= 1:
        return s
    p = kernel // 2
    padded = np.pad(s, [(0, 0)] * (s.ndim - 1) + [(p, p)], constant_values=-np.inf if mode == "max" else 0.0)
    win = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)
    return win.max(axis=-1) if mode == "max" else win.mean(axis=-1)


def ref_snapkv(cap, l, window, kernel, pool, reduce_before_pool):
    """mean_j A[h,j,i] over prefix keys, pooled, GQA mean -> [Hkv, n - window]."""
    n, hkv = cap.n, cap.n_kv_heads
    a = window_attention(cap.window_queries(window)[l], cap.keys[l])[:, :, : n - window].mean(axis=1)
    a = a.reshape(hkv, -1, n - window)
    if reduce_before_pool:
        return pool1d(a.mean(axis=1), kernel, pool)
    return pool1d(a, kernel, pool).mean(axis=1)


def ref_lava(cap, l, window=32, kernel=7):
    """c[h] * maxpool7(mean_j A[h,j,i]), c = max prefix ||v||_1 of the group, GQA max."""
    n, hkv = cap.n, cap.n_kv_heads
    a = window_attention(cap.window_queries(window)[l], cap.keys[l])[:, :, : n - window].mean(axis=1)
    a = pool1d(a, kernel, "max").reshape(hkv, -1, n - window)
    c = np.abs(cap.values[l][:, : n - window].astype(np.float64)).sum(axis=-1).max(axis=-1)  # [Hkv]
    return (a * c[:, None, None]).max(axis=1)


def ref_laprox(cap, l, window=32, kernel=7):
    """sum over the group of avgpool_k(||A[h,:,i]||_2) * ||V[h/g,i] Wo_h||_2 (V·Wo formed
    explicitly, no Gram) -> [Hkv, n - window]."""
    n, hkv, hq, hd = cap.n, cap.n_kv_heads, cap.n_heads, cap.head_dim
    g = hq // hkv
    att = np.linalg.norm(window_attention(cap.window_queries(window)[l], cap.keys[l])[:, :, : n - window], axis=1)
    att = pool1d(att, kernel, "avg")  # [Hq, P]
    wo = cap.wo[l].astype(np.float64)
    out = np.zeros((hkv, n - window))
    for h in range(hq):
        vo = cap.values[l][h // g, : n - window].astype(np.float64) @ wo[h * hd:(h + 1) * hd]  # [P, D]
        out[h // g] += att[h] * np.linalg.norm(vo, axis=1)
    return out


REFERENCES = {  # name: (library preset, score fields, window, reference(cap, l))
    "snapkv": ("snapkv", {}, 32, lambda c, l: ref_snapkv(c, l, 32, 7, "max", False)),
    "snapkv-kvpress": ("snapkv-kvpress", {}, 64, lambda c, l: ref_snapkv(c, l, 64, 5, "avg", False)),
    "lava": ("lava", {}, 32, lambda c, l: ref_lava(c, l)),
    "laprox": ("laprox", {}, 32, lambda c, l: ref_laprox(c, l, 32, 7)),
    "laprox-k1": ("laprox", {"kernel": 1}, 32, lambda c, l: ref_laprox(c, l, 32, 1)),
}


def score_error(lib, ref):
    """max |lib - ref| / (|ref| + 1e-7 max|ref|), elementwise."""
    return float(np.max(np.abs(lib - ref) / (np.abs(ref) + 1e-7 * np.abs(ref).max())))


def main():
    t0 = time.time()
    failures = []

    def expect(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}", flush=True)
        if not cond:
            failures.append(what)

    kve = methods.kvevict()
    print(f"kvevict {kve.version()} from {kve.library_path()}")
    model = Model()
    folder = check_engine.find_vectors()
    if folder:
        print(f"engine vs kvpress ({folder}):")
        expect(check_engine.check(model, folder, log=lambda s: print("    " + s)), "engine matches kvpress tensors")
    else:
        print("engine vs kvpress: vectors not found, skipped")

    for i in PROMPTS:
        p = make_prompt(model.tokenizer, i, N_PROMPTS)
        cap, _ = captures.load_or_compute(model, p, "aware")
        print(f"prompt {i} (depth {p.depth:.2f}, key {p.key}, n={cap.n}):", flush=True)

        r = evaluate(model, cap, methods.select_full(cap, 1.0, 32), p.key)
        expect(r["correct"], f"full cache answers {p.key} (got {r['answer']!r})")
        expect(abs(r["kl"]) < 1e-5 and r["layer_err"] < 1e-6, f"full KL {r['kl']:.1e}, layer err {r['layer_err']:.1e} ~ 0")

        # conformance: library scores vs numpy on the captured tensors
        for name, (preset, fields, w, ref) in REFERENCES.items():
            lib = methods.library_scores(cap, preset, w, **fields)
            err = max(score_error(lib[l].astype(np.float64), ref(cap, l)) for l in range(cap.n_layers))
            expect(err <= RTOL, f"{name} scores == numpy, all {cap.n_layers} layers (max rel err {err:.1e})")
        for ratio in RATIOS:
            lib = methods.library_scores(cap, "snapkv", 32)
            kept = methods.get("snapkv").select(cap, ratio, 32)
            want = methods.uniform_topk(lib, cap, ratio, 32)
            same = all(np.array_equal(kept[l][h], want[l][h]) for l in range(cap.n_layers) for h in range(cap.n_kv_heads))
            expect(same, f"snapkv@{ratio:g} selection == numpy top-K of the library's scores")
            m = methods.get("streamingllm")
            kept = m.select(cap, ratio, m.window)
            want = methods.select_streamingllm_np(cap, ratio, m.window)
            same = all(np.array_equal(kept[l][h], want[l][h]) for l in range(cap.n_layers) for h in range(cap.n_kv_heads))
            expect(same, f"streamingllm@{ratio:g} == numpy (4 sinks + recent)")

        # every method: valid selection of the budget, finite metrics (one batched decode)
        tags, kepts = [], []
        for name, m in methods.METHODS.items():
            if name == "full":
                continue
            for ratio in RATIOS:
                kept = m.select(cap, ratio, m.window)
                total = methods.check_kept(kept, cap)
                want = methods.total_budget(cap, ratio, m.window)
                tol = 0.01 * want if name == "pyramidkv" else 0
                tag = f"{name}@{ratio:g}"
                expect(abs(total - want) <= tol, f"{tag} keeps {total} positions (budget {want})")
                tags.append((name, ratio, tag))
                kepts.append(kept)
        t1 = time.time()
        results = evaluate_many(model, cap, kepts, p.key)
        print(f"  {len(kepts)} selections decoded in {time.time() - t1:.1f}s (batched)")
        for (name, ratio, tag), kept, r in zip(tags, kepts, results):
            expect(math.isfinite(r["kl"]) and math.isfinite(r["layer_err"]),
                   f"{tag} KL {r['kl']:.3f}, layer err {r['layer_err']:.3f}, "
                   f"{'right' if r['correct'] else 'wrong'} answer {r['answer']!r}")
            if name in SEQUENTIAL:
                s = evaluate(model, cap, kept, p.key)
                expect(s["answer"] == r["answer"] and abs(s["kl"] - r["kl"]) <= 1e-4 + 1e-4 * abs(s["kl"])
                       and abs(s["layer_err"] - r["layer_err"]) <= 1e-5,
                       f"{tag} batched == sequential decode (KL {s['kl']:.6f} vs {r['kl']:.6f})")
    print(f"smoke: {'FAILED: ' + '; '.join(failures) if failures else 'passed'} ({time.time() - t0:.0f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
