"""Needle-in-a-haystack evaluation of KV-cache eviction methods on SmolLM2-135M.

    eval/setup.sh && .venv-eval/bin/python eval/run.py --prompts 10 --ratios 0.5,0.25,0.1,0.05

Writes into --out (default eval/out/): results.csv (one row per setting, method, ratio,
prompt), results.md (summary tables) and accuracy.png (accuracy vs keep ratio, one line per
method, one panel per setting). Full-cache captures are cached per prompt in
eval/out/cache/captures/, so every method and ratio reuses one prefill.
"""
import argparse
import csv
import os
import sys
import time

# One BLAS thread: the decode's small matmuls run several times slower with two threads on
# a shared 2-core machine, and the prefill gains little. Override with OPENBLAS_NUM_THREADS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import methods  # noqa: E402
from engine import OUT_DIR, Model  # noqa: E402
from metrics import evaluate  # noqa: E402
from needle import CONTEXT_TOKENS, make_prompts  # noqa: E402

FIELDS = ["setting", "method", "keep_ratio", "prompt", "depth", "key", "n", "answer", "correct",
          "kl", "layer_err", "kept_frac"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=10, help="number of needle prompts (depths spread 0..100%%)")
    ap.add_argument("--ratios", default="0.5,0.25,0.1,0.05", help="keep ratios, comma separated")
    default_methods = [n for n, m in methods.METHODS.items() if not m.library]
    ap.add_argument("--methods", default=",".join(default_methods),
                    help=f"comma separated, from: {', '.join(methods.METHODS)}")
    ap.add_argument("--setting", default="aware", choices=["aware", "agnostic", "both"])
    ap.add_argument("--tail", type=int, default=1, help="aware setting: prompt tokens fed after compression")
    ap.add_argument("--tokens", type=int, default=CONTEXT_TOKENS, help="prompt length in tokens")
    ap.add_argument("--out", default=OUT_DIR, help="output folder")
    return ap.parse_args(argv)


def run(args):
    ratios = [float(r) for r in args.ratios.split(",") if r]
    names = [m for m in args.methods.split(",") if m]
    for name in names:
        methods.get(name)
    settings = ["aware", "agnostic"] if args.setting == "both" else [args.setting]
    model = Model()
    prompts = make_prompts(model.tokenizer, args.prompts, args.tokens)
    rows = []
    skipped = set()
    for setting in settings:
        for i, p in enumerate(prompts):
            t0 = time.time()
            cap, cached = captures.load_or_compute(model, p, setting, args.tail)
            t_cap = time.time() - t0
            marks = []
            for name in names:
                m = methods.get(name)
                for ratio in ([1.0] if name == "full" else ratios):
                    try:
                        kept = m.select(cap, ratio, m.window)
                    except NotImplementedError as e:
                        if name not in skipped:
                            log(f"skip {name}: {e}")
                            skipped.add(name)
                        break
                    methods.check_kept(kept, cap)
                    r = evaluate(model, cap, kept, p.key)
                    rows.append({"setting": setting, "method": name, "keep_ratio": ratio, "prompt": p.index,
                                 "depth": round(p.depth, 4), "key": p.key, "n": cap.n, **r})
                    marks.append(f"{name}@{ratio:g}:{'ok' if r['correct'] else 'x'}")
            log(f"[{setting}] prompt {i + 1}/{len(prompts)} depth {p.depth:.2f} key {p.key} n={cap.n} "
                f"capture {'cached' if cached else f'{t_cap:.1f}s'} total {time.time() - t0:.1f}s | " + " ".join(marks))
    return rows, settings, names, ratios


def summarize(rows, settings, names):
    """[(setting, method, ratio, n, correct, acc, acc_on_full_ok, kl, layer_err, kept_frac)]"""
    out = []
    for s in settings:
        full_ok = {r["prompt"] for r in rows if r["setting"] == s and r["method"] == "full" and r["correct"]}
        for name in names:
            rs = [r for r in rows if r["setting"] == s and r["method"] == name]
            for ratio in sorted({r["keep_ratio"] for r in rs}, reverse=True):
                g = [r for r in rs if r["keep_ratio"] == ratio]
                ok = sum(r["correct"] for r in g)
                on_full = [r["correct"] for r in g if r["prompt"] in full_ok]
                out.append({
                    "setting": s, "method": name, "keep_ratio": ratio, "n": len(g), "correct": ok,
                    "acc": ok / len(g),
                    "acc_full_ok": (sum(on_full) / len(on_full)) if on_full else float("nan"),
                    "kl": float(np.mean([r["kl"] for r in g])),
                    "layer_err": float(np.mean([r["layer_err"] for r in g])),
                    "kept_frac": float(np.mean([r["kept_frac"] for r in g])),
                })
    return out


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]) for k in FIELDS})


def write_markdown(summary, args, path):
    lines = ["# Needle-in-a-haystack: KV-cache eviction on SmolLM2-135M-Instruct (Q4_1, numpy engine)", "",
             f"{args.prompts} prompts of ~{args.tokens} tokens, needle depths 0-100%. Keep ratio counts the "
             "observation window inside the budget (kvpress accounting). `acc|full` = accuracy on the prompts "
             "the full cache answers. KL: first answer token, full || compressed (nats). Layer err: relative "
             "error of each layer's attention output through Wo for the tokens after the prefill, mean over layers.",
             ""]
    for s in dict.fromkeys(r["setting"] for r in summary):
        desc = (f"question inside the window (prefill = prompt minus its last {args.tail} token(s))"
                if s == "aware" else "context compressed before the question is seen")
        lines += [f"## Setting: {s} ({desc})", "",
                  "| method | keep ratio | correct | acc | acc\\|full | KL | layer err | kept frac |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in summary:
            if r["setting"] != s:
                continue
            note = " (TEMPORARY numpy)" if methods.METHODS[r["method"]].temporary else ""
            lines.append(f"| {r['method']}{note} | {r['keep_ratio']:g} | {r['correct']}/{r['n']} | {r['acc']:.2f} | "
                         f"{r['acc_full_ok']:.2f} | {r['kl']:.3f} | {r['layer_err']:.3f} | {r['kept_frac']:.3f} |")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in summary))
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.5), squeeze=False)
    for ax, s in zip(axes[0], settings):
        for name in dict.fromkeys(r["method"] for r in summary):
            rs = sorted((r for r in summary if r["setting"] == s and r["method"] == name), key=lambda r: r["keep_ratio"])
            if name == "full":
                ax.axhline(rs[0]["acc"], color="k", ls="--", lw=1, label="full cache")
            else:
                ax.plot([r["keep_ratio"] for r in rs], [r["acc"] for r in rs], marker="o", label=name)
        ax.set_xscale("log")
        ticks = sorted({r["keep_ratio"] for r in summary if r["method"] != "full"})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("keep ratio (window included)")
        ax.set_ylabel("needle accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"SmolLM2-135M, question-{s}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    rows, settings, names, ratios = run(args)
    os.makedirs(args.out, exist_ok=True)
    summary = summarize(rows, settings, names)
    write_csv(rows, os.path.join(args.out, "results.csv"))
    write_markdown(summary, args, os.path.join(args.out, "results.md"))
    write_plot(summary, os.path.join(args.out, "accuracy.png"))
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())
    log(f"done in {time.time() - t0:.0f}s: {args.out}/results.md, results.csv, accuracy.png")


if __name__ == "__main__":
    main()
