"""Cheap experiments on top of the method table: variants composed from library options.

    python eval/explore.py --variants laprox-span,span-w16,span-w8 --ratios 0.1,0.05 --prompts 20

Each variant is a `methods.Method` (VARIANTS below, or any METHODS name). Prints, per
variant and ratio, the exact-match count, the count on the prompts the full cache answers,
mean KL and layer error, and the fraction of the needle's digit tokens kept (over layers
and KV heads), and appends a markdown table to eval/out/explore.md. Identical selections
are decoded once; all selections of a prompt are decoded as one batch.
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
from engine import OUT_DIR, Model  # noqa: E402
from methods import Method, library_method as L  # noqa: E402
from metrics import emit_table, evaluate_selections  # noqa: E402
from needle import CONTEXT_TOKENS, NEEDLE, answer_correct, make_prompts  # noqa: E402

SPAN_POOL = ("forward", 8, 0.9, 0)  # the laprox-span preset's post-pool before the sink rule


def span(window=32, post_pool=SPAN_POOL, **kw):
    """laprox-span with some options changed (score fields, selection, composed extras)."""
    return Method(L("laprox-span", post_pool=post_pool, **kw), window=window, library=True)


def at_window(preset, window, **kw):
    return Method(L(preset, **kw), window=window, library=True)


VARIANTS = {
    # window size (the window counts inside the budget: a smaller one leaves more prefix)
    "span-w24": span(24),
    "span-w16": span(16),
    "span-w8": span(8),
    "span-w4": span(4),
    # continuation pool
    "span-f4": span(post_pool=("forward", 4, 0.9)),
    "span-f16": span(post_pool=("forward", 16, 0.9)),
    "span-f16d95": span(post_pool=("forward", 16, 0.95)),
    "span-f12": span(post_pool=("forward", 12, 0.9)),
    "span-avg7": span(post_pool=("avg", 7, 1.0)),
    "span-max7": span(post_pool=("max", 7, 1.0)),
    "span-nopool": span(post_pool=("none", 1, 1.0)),
    # GQA mode, normalization
    "span-exact": span(laprox_gqa="exact"),
    "span-meanattn": span(laprox_gqa="mean-attn"),
    "span-nonorm": span(normalize="none"),
    # reserves
    "span-sink4": span(sinks=4),
    "span-sink1": span(sinks=1),
    "span-w16-sink4": span(16, sinks=4),
    "span-w8-sink4": span(8, sinks=4),
    "span-recent16": span(recent=16),
    "span-w8-recent8": span(8, recent=8),
    "span-w16-f16": span(16, post_pool=("forward", 16, 0.9)),
    "span-w8-f16": span(8, post_pool=("forward", 16, 0.9)),
    "span-w8-f4": span(8, post_pool=("forward", 4, 0.9)),
    "span-w8-exact": span(8, laprox_gqa="exact"),
    # question-agnostic: uniqueness with laprox-span's selection before the sink rule
    "uniqueness-pool8": at_window("uniqueness", 8, post_pool=SPAN_POOL),
    # the smallest budgets, library options (post_pool = kind, kernel, decay, sinks): the
    # preset before (span-w8), each half of the change, the kernel's neighbours
    "span-w8-sinkrule": span(8, post_pool=("forward", 8, 0.9, 1)),
    "span-w8-f9flat": span(8, post_pool=("forward", 9, 1.0, 0)),
    "span-w8-f8flat-sinkrule": span(8, post_pool=("forward", 8, 1.0, 1)),
    "span-w8-f10flat-sinkrule": span(8, post_pool=("forward", 10, 1.0, 1)),
    "span-w8-f8d95-sinkrule": span(8, post_pool=("forward", 8, 0.95, 1)),
    # a span-length-independent continuation: long kernel, decay just under 1 so that nearer
    # followers win when the budget cuts a span (flat ties go to the later positions)
    "span-w8-f16d999-sinkrule": span(8, post_pool=("forward", 16, 0.999, 1)),
    "span-w8-f32d999-sinkrule": span(8, post_pool=("forward", 32, 0.999, 1)),
    "span-w8-f64d999-sinkrule": span(8, post_pool=("forward", 64, 0.999, 1)),
    "span-w8-f32d99-sinkrule": span(8, post_pool=("forward", 32, 0.99, 1)),
    # the smallest budgets: the sink lends nothing (composed reserve) / flat continuation
    "span-w8-sink1": span(8, sinks=1),
    "span-w8-d1": span(8, post_pool=("forward", 8, 1.0)),
    "span-w8-sink1-d1": span(8, sinks=1, post_pool=("forward", 8, 1.0)),
    "span-w8-sink1-d95": span(8, sinks=1, post_pool=("forward", 8, 0.95)),
    **{f"span-w{w}-sink1-f{k}d{d}": span(w, sinks=1, post_pool=("forward", k, d / 100))
       for w in (4, 8) for k in (8, 9, 10, 12, 16) for d in (90, 95, 100)},
    # the same pipeline at other granularities (forward post-pool per unit)
    "laprox-k1-fwdpost": Method(L("laprox", kernel=1, post_pool=SPAN_POOL), library=True),
    "laprox-k1-layer-fwdpost": Method(L("laprox", kernel=1, granularity="layer", post_pool=SPAN_POOL), library=True),
    "laprox-k1-fwdpost-floor": Method(L("laprox", kernel=1, post_pool=SPAN_POOL, layer_floor=0.5), library=True),
    "laprox-fwd-floor": Method(L("laprox", pool="forward", kernel=8, decay=0.9, layer_floor=0.5), library=True),
    "laprox-fwd-floor02": Method(L("laprox", pool="forward", kernel=8, decay=0.9, layer_floor=0.2), library=True),
    "laprox-k1-w8-fwdpost-floor02": at_window("laprox", 8, kernel=1, post_pool=SPAN_POOL, layer_floor=0.2),
    "laprox-k1-w8-fwdpost": at_window("laprox", 8, kernel=1, post_pool=SPAN_POOL),
    # SnapKV / LAVa through the same token-level continuation pipeline
    "snapkv-span": Method(L("snapkv", kernel=1, pool="none", allocator="global", granularity="token",
                            post_pool=SPAN_POOL), library=True),
    "lava-span": Method(L("lava", kernel=1, pool="none", allocator="global", granularity="token",
                          post_pool=SPAN_POOL), library=True),
    "snapkv-span-w8": at_window("snapkv", 8, kernel=1, pool="none", allocator="global", granularity="token",
                                post_pool=SPAN_POOL),
    # small windows for the baselines too (is it the window or the scorer?)
    "laprox-w8": at_window("laprox", 8),
    "laprox-k1-w8": at_window("laprox", 8, kernel=1),
    "snapkv-w8": at_window("snapkv", 8),
    "ada-snapkv-w8": at_window("snapkv", 8, allocator="ada"),
    "lava-w8": at_window("lava", 8),
    "snapkv-w8@token": at_window("snapkv", 8, granularity="token"),
    "laprox-w8@token": at_window("laprox", 8, granularity="token"),
    "streamingllm-w8": at_window("streamingllm", 8),
}


def get(name):
    return VARIANTS[name] if name in VARIANTS else methods.get(name)


def digit_coverage(kept, pos):
    if not pos:
        return float("nan")
    tot = 0
    for row in kept:
        for k in row:
            tot += np.isin(pos, k).sum()
    return tot / (len(pos) * len(kept) * len(kept[0]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--ratios", default="0.1,0.05")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=CONTEXT_TOKENS, help="prompt length in tokens")
    ap.add_argument("--seed-base", type=int, default=0, help="> 0: other filler and keys (held-out)")
    ap.add_argument("--key-digits", type=int, default=5, help="digits of the pass key (format probe)")
    ap.add_argument("--needle", default=NEEDLE, help="needle sentence with {key} (format probe)")
    ap.add_argument("--only", default="", help="prompt indices to run (default all)")
    ap.add_argument("--setting", default="aware", choices=["aware", "agnostic"])
    ap.add_argument("--prose", action="store_true",
                    help="tasks.py's needle-prose: the pass key in docstring prose, not the filler grammar")
    ap.add_argument("--out", default=os.path.join(OUT_DIR, "explore.md"))
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    ratios = [float(r) for r in args.ratios.split(",")]
    for n in names:
        get(n)
    model = Model()
    if args.prose:
        import tasks
        prompts = [g[0] for g in tasks.make_task("needle-prose", model.tokenizer, args.prompts, args.tokens, args.seed_base)]
    else:
        prompts = make_prompts(model.tokenizer, args.prompts, args.tokens, args.seed_base, args.key_digits, args.needle)
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        prompts = [p for p in prompts if p.index in keep]
    res = {}  # (name, ratio) -> list of (prompt, correct, kl, err, cov)
    full_ok = set()
    t0 = time.time()
    for p in prompts:
        cap, _ = captures.load_or_compute(model, p, args.setting)
        if answer_correct(model.tokenizer.decode(cap.answer_ids), p.key):
            full_ok.add(p.index)
        ids = [int(t) for t in cap.a["prefill_ids"]]
        # the key's digits: the first run of digit tokens spelling it (one token per digit)
        nd = len(p.key)
        pos = []
        for i in range(len(ids) - nd + 1):
            if model.tokenizer.decode(ids[i:i + nd]) == p.key:
                pos = list(range(i, i + nd))
                break
        marks = []
        selects = [(name, (lambda m: lambda c, r: m.select(c, r, m.window))(get(name))) for name in names]
        for name, r, e, kept in evaluate_selections(model, cap, selects, ratios, p.key):
            res.setdefault((name, r), []).append((p.index, e["correct"], e["kl"], e["layer_err"], digit_coverage(kept, pos)))
            marks.append(f"{name}@{r:g}:{'ok' if e['correct'] else 'x'}")
        print(f"prompt {p.index} depth {p.depth:.2f} full {'ok' if p.index in full_ok else 'x'} "
              f"({time.time() - t0:.0f}s) " + " ".join(marks), file=sys.stderr, flush=True)
    lines = [f"\n## {args.setting}{' (prose)' if args.prose else ''}, {len(prompts)} prompts of {args.prompts} x {args.tokens} tokens, seed base {args.seed_base}, "
             f"needle {args.needle!r} with {args.key_digits} digits (full cache answers {len(full_ok)}), "
             f"window inside the budget\n", "| variant | ratio | correct | on full-ok | KL | layer err | needle digits kept |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        for r in ratios:
            g = res[(name, r)]
            ok = sum(c for _, c, *_ in g)
            okf = sum(c for i, c, *_ in g if i in full_ok)
            lines.append(f"| {name} | {r:g} | {ok}/{len(g)} | {okf}/{len(full_ok)} | {np.mean([x[2] for x in g]):.3f} | "
                         f"{np.mean([x[3] for x in g]):.3f} | {np.nanmean([x[4] for x in g]):.2f} |")
    emit_table(lines, args.out)


if __name__ == "__main__":
    main()
