"""Does LaProx need the Gram's low half on 16-bit tensor cores? (issue 13)

The CUDA value term for f16/bf16 values computes v G vᵀ on tensor cores with G split into
hi = round(G) and lo = round(G - hi) in the values' dtype: two MMAs, an f32-accurate G.
With hi alone the tensor-core work halves, and G carries 8 (bf16) or 11 (f16) bits. This
measures what that does to the eval's selections: the host library's LaProx with the Gram
rounded as the device would see it (hi, or hi + lo summed in f32), everything else
unchanged (values in f32, so only G's rounding differs), against the exact f32 Gram.

    PYTHONPATH=python KVEVICT_LIB=$PWD/target/release/libkvevict.so \\
        python eval/gram_lo.py --prompts 6 --variants laprox-span-w8,laprox --ratios 0.1,0.05

Prints, per variant, Gram mode and ratio: the share of kept (layer, head, position) entries
that differ from the f32 Gram's selection, how many selections are identical, and the
exact-match count of the decoded answers.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import methods  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
from needle import CONTEXT_TOKENS, make_prompts  # noqa: E402


def bf16(x):
    """Round-to-nearest-even to bf16, back in f32 (what __float2bfloat16 does)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).reshape(x.shape)


def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


MODES = {
    "f32": lambda g: g,
    "bf16-hi": bf16,
    "bf16-hi+lo": lambda g: bf16(g) + bf16(g - bf16(g)),
    "f16-hi": f16,
    "f16-hi+lo": lambda g: f16(g) + f16(g - f16(g)),
}


def forms_for(kve, cap, cross, mode):
    out = []
    for l in range(cap.n_layers):
        g = kve.gram_cache.get(cap.wo, l, cap.n_heads, cap.n_kv_heads, cross)
        out.append(kve.compute_value_forms(cap.values[l], MODES[mode](np.asarray(g, np.float32)), cross,
                                           hq=cap.n_heads))
    return out


def kept_entries(kept):
    return {(l, h, int(i)) for l, row in enumerate(kept) for h, k in enumerate(row) for i in k}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="laprox-span-w8,laprox")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--ratios", default="0.1,0.05")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--setting", default="aware", choices=["aware", "agnostic"])
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    modes = [m for m in args.modes.split(",") if m]
    ratios = [float(r) for r in args.ratios.split(",")]
    kve = methods.kvevict()
    model = Model()
    prompts = make_prompts(model.tokenizer, args.prompts, CONTEXT_TOKENS)
    res = {}  # (name, mode, ratio) -> [(differing share, identical, correct)]
    t0 = time.time()
    for p in prompts:
        cap, _ = captures.load_or_compute(model, p, args.setting)
        selects = []
        for name in names:
            m = methods.get(name)
            base = {}
            for mode in modes:
                memo = methods._SCORES.setdefault(cap, {})
                for k in [k for k in memo if k != "value_links"]:
                    del memo[k]  # scores and value forms of the previous mode
                for cross in (False, True):
                    memo[("value_forms", cross)] = forms_for(kve, cap, cross, mode)
                kept = {r: m.select(cap, r, m.window) for r in ratios}
                if mode == "f32":
                    base = {r: kept_entries(k) for r, k in kept.items()}
                for r in ratios:
                    e = kept_entries(kept[r])
                    diff = len(e ^ base[r]) / 2 / max(len(base[r]), 1)
                    res.setdefault((name, mode, r), []).append([diff, e == base[r], None])
                selects.append((f"{name}|{mode}", (lambda kk: lambda c, r: kk[r])(kept)))
        for label, r, ev, _ in evaluate_selections(model, cap, selects, ratios, p.key):
            name, mode = label.split("|")
            res[(name, mode, r)][-1][2] = ev["correct"]
        methods._SCORES.pop(cap, None)
        print(f"prompt {p.index} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    print(f"\n{len(prompts)} prompts, setting {args.setting}\n")
    print("| variant | Gram | ratio | kept entries differing from f32 | identical selections | correct |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        for mode in modes:
            for r in ratios:
                g = res[(name, mode, r)]
                print(f"| {name} | {mode} | {r:g} | {100 * np.mean([x[0] for x in g]):.3f} % "
                      f"(max {100 * max(x[0] for x in g):.3f} %) | {sum(x[1] for x in g)}/{len(g)} | "
                      f"{sum(bool(x[2]) for x in g)}/{len(g)} |")


if __name__ == "__main__":
    main()
