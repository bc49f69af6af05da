"""Needle-in-a-haystack evaluation of KV-cache eviction methods on SmolLM2-135M.

    eval/setup.sh && .venv-eval/bin/python eval/run.py --prompts 20 --setting both

Writes into --out (default eval/out/): results.csv (one row per setting, method, ratio,
prompt), results.md (tables: accuracy, KL, layer error per method and ratio) and
accuracy.png (accuracy vs keep ratio, one panel per setting and granularity). Full-cache
captures are cached per prompt in eval/out/cache/captures/, so every method and ratio
reuses one prefill. Long studies can be split (by --setting, --methods) into processes
writing their own --csv, then merged with --report a.csv,b.csv (no computation).
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
from metrics import evaluate_many  # noqa: E402
from needle import CONTEXT_TOKENS, make_prompts  # noqa: E402

FIELDS = ["setting", "method", "keep_ratio", "prompt", "depth", "key", "n", "answer", "correct",
          "kl", "layer_err", "kept_frac"]
RATIOS = "0.5,0.25,0.1,0.05"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20, help="number of needle prompts (depths spread 0..100%%)")
    ap.add_argument("--pick", default="", help="comma separated prompt indices of the --prompts (default all)")
    ap.add_argument("--ratios", default=RATIOS, help="keep ratios, comma separated")
    ap.add_argument("--methods", default=",".join(methods.METHODS),
                    help=f"comma separated (default all), from: {', '.join(methods.METHODS)}")
    ap.add_argument("--setting", default="both", choices=["aware", "agnostic", "both"])
    ap.add_argument("--tail", type=int, default=1, help="aware setting: prompt tokens fed after compression")
    ap.add_argument("--tokens", type=int, default=CONTEXT_TOKENS, help="prompt length in tokens")
    ap.add_argument("--out", default=OUT_DIR, help="output folder")
    ap.add_argument("--csv", default=None, help="rows file (default <out>/results.csv)")
    ap.add_argument("--report", default=None,
                    help="comma separated results CSVs: merge them and write results.md / .csv / .png, no computation")
    ap.add_argument("--command", default=None, help="command line recorded in results.md (default: this one)")
    return ap.parse_args(argv)


def run(args):
    ratios = [float(r) for r in args.ratios.split(",") if r]
    names = [m for m in args.methods.split(",") if m]
    for name in names:
        methods.get(name)
    settings = ["aware", "agnostic"] if args.setting == "both" else [args.setting]
    model = Model()
    prompts = make_prompts(model.tokenizer, args.prompts, args.tokens)
    if args.pick:
        prompts = [prompts[int(i)] for i in args.pick.split(",") if i]
    rows = []
    for setting in settings:
        for i, p in enumerate(prompts):
            t0 = time.time()
            cap, cached = captures.load_or_compute(model, p, setting, args.tail)
            t_cap = time.time() - t0
            jobs, kepts, index = [], [], {}
            for name in names:
                m = methods.get(name)
                for ratio in ([1.0] if name == "full" else ratios):
                    kept = m.select(cap, ratio, m.window)
                    methods.check_kept(kept, cap)
                    h = methods.kept_digest(kept)
                    if h not in index:  # identical selections are decoded once
                        index[h] = len(kepts)
                        kepts.append(kept)
                    jobs.append((name, ratio, index[h]))
            results = evaluate_many(model, cap, kepts, p.key)
            marks = []
            for name, ratio, j in jobs:
                r = results[j]
                rows.append({"setting": setting, "method": name, "keep_ratio": ratio, "prompt": p.index,
                             "depth": round(p.depth, 4), "key": p.key, "n": cap.n, **r})
                marks.append(f"{name}@{ratio:g}:{'ok' if r['correct'] else 'x'}")
            log(f"[{setting}] prompt {i + 1}/{len(prompts)} depth {p.depth:.2f} key {p.key} n={cap.n} "
                f"capture {'cached' if cached else f'{t_cap:.1f}s'} total {time.time() - t0:.1f}s | " + " ".join(marks))
    return rows


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["keep_ratio"], r["depth"] = float(r["keep_ratio"]), float(r["depth"])
        r["prompt"], r["n"] = int(r["prompt"]), int(r["n"])
        r["correct"] = r["correct"] in ("True", "1", "true")
        r["kl"], r["layer_err"], r["kept_frac"] = float(r["kl"]), float(r["layer_err"]), float(r["kept_frac"])
    return rows


def summarize(rows):
    """[{setting, method, keep_ratio, n, correct, acc, n_full_ok, correct_full_ok, acc_full_ok, kl,
    layer_err, kept_frac}] in the order settings and methods first appear."""
    out = []
    for s in dict.fromkeys(r["setting"] for r in rows):
        full_ok = {r["prompt"] for r in rows if r["setting"] == s and r["method"] == "full" and r["correct"]}
        for name in dict.fromkeys(r["method"] for r in rows if r["setting"] == s):
            rs = [r for r in rows if r["setting"] == s and r["method"] == name]
            for ratio in sorted({r["keep_ratio"] for r in rs}, reverse=True):
                g = [r for r in rs if r["keep_ratio"] == ratio]
                ok = sum(r["correct"] for r in g)
                on_full = [r["correct"] for r in g if r["prompt"] in full_ok]
                out.append({
                    "setting": s, "method": name, "keep_ratio": ratio, "n": len(g), "correct": ok,
                    "acc": ok / len(g), "n_full_ok": len(on_full), "correct_full_ok": sum(on_full),
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


SETTING_TEXT = {
    "aware": "question-aware: the question is in the observation window (prefill = the prompt but its last "
             "token, which is fed through the compressed cache)",
    "agnostic": "question-agnostic: the context is compressed (window = its last tokens) before the question is fed",
}


def write_markdown(summary, rows, command, path):
    n_prompts = len({r["prompt"] for r in rows})
    tokens = int(np.mean([r["n"] for r in rows]))
    lines = ["# Needle-in-a-haystack: KV-cache eviction on SmolLM2-135M-Instruct (Q4_1, numpy engine)", "",
             f"Made by `{command}`.", "",
             f"{n_prompts} prompts of ~{tokens} prefill tokens, needle depths 0-100 %. **Budgets as kvpress counts them:** "
             "keep ratio r keeps floor(N·r) positions per (layer, KV head) with the observation window w inside "
             "that total, so the per-head average prefix budget is floor(N·r) − w tokens (at r = 0.05 and "
             "w = 32 that is ~17 prefix tokens). Ragged allocators keep that many on average; token-granularity "
             "methods (`@token`, laprox-span) keep one set of that size for every head. A window larger than the "
             "budget (snapkv-kvpress / criticalkv w = 64 at 5 %) is kept whole: see `kept`.", "",
             "Cells of the accuracy table: exact-match correct / prompts (accuracy on the prompts the full cache "
             "answers). KL: of the first answer token, full ‖ compressed (nats), mean over prompts. Layer err: "
             "relative error of each layer's attention output through Wo for the tokens fed after the prefill "
             "(each layer alone, full-cache inputs), mean over layers and prompts.", ""]
    for s in dict.fromkeys(r["setting"] for r in summary):
        sm = [r for r in summary if r["setting"] == s]
        ratios = sorted({r["keep_ratio"] for r in sm if r["method"] != "full"}, reverse=True)
        names = list(dict.fromkeys(r["method"] for r in sm))
        cell = {(r["method"], r["keep_ratio"]): r for r in sm}
        full = cell.get(("full", 1.0))
        lines += [f"## {SETTING_TEXT.get(s, s)}", ""]
        if full:
            lines += [f"Full cache: {full['correct']}/{full['n']} correct.", ""]
        for title, fmt in (("Accuracy", lambda r: f"{r['correct']}/{r['n']} ({r['acc_full_ok']:.2f})"),
                           ("KL of the first answer token (nats)", lambda r: f"{r['kl']:.3f}"),
                           ("Layer attention-output error (relative)", lambda r: f"{r['layer_err']:.3f}")):
            lines += [f"### {s}: {title}", "",
                      "| method | " + " | ".join(f"{x:g}" for x in ratios) + " |",
                      "|---|" + "---:|" * len(ratios)]
            for name in names:
                if name == "full":
                    continue
                cells = [fmt(cell[(name, x)]) if (name, x) in cell else "" for x in ratios]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            lines.append("")
        odd = [(n, x, cell[(n, x)]["kept_frac"]) for n in names for x in ratios
               if (n, x) in cell and abs(cell[(n, x)]["kept_frac"] - x) > 0.01]
        if odd:
            lines += ["Kept fraction off the ratio: " + ", ".join(f"{n}@{x:g} keeps {k:.3f}" for n, x, k in odd), ""]
    notes = [(n, m.note) for n, m in methods.METHODS.items() if n in {r["method"] for r in summary} and m.note]
    if notes:
        lines += ["## Methods", "", "| method | what | window |", "|---|---|---:|"]
        lines += [f"| {n} | {t} | {methods.METHODS[n].window} |" for n, t in notes]
        lines += ["", "`<name>@token`: the same scores at the library's token granularity (one kept set for "
                  "every layer and head, the llama.cpp mode: per layer divided by the layer sum, summed over "
                  "layers and heads, one top-K).", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def token_granularity(name):
    return name.endswith("@token") or name.startswith("laprox-span")


def write_plot(summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in summary))
    groups = [("per (layer, KV head)", lambda n: not token_granularity(n)),
              ("one token set for the model (token granularity)", lambda n: token_granularity(n) or n == "streamingllm")]
    fig, axes = plt.subplots(len(settings), 2, figsize=(14, 6.2 * len(settings)), squeeze=False)
    base_names = list(dict.fromkeys(r["method"].split("@")[0] for r in summary if r["method"] != "full"))
    cmap = plt.get_cmap("tab10")
    others = [n for n in base_names if not (n.startswith("laprox") or n.startswith("lava"))]
    ours = [n for n in base_names if n not in others]
    style = {n: dict(color=cmap(i % 10), ls=("-", "--", ":")[(i // 10) % 3], lw=1.1) for i, n in enumerate(others)}
    style.update({n: dict(color=plt.get_cmap("Dark2")(i % 8), ls=("-", "-.")[(i // 8) % 2], lw=2.2)
                  for i, n in enumerate(ours)})
    if methods.BEST_PRESET in style:
        style[methods.BEST_PRESET] = dict(color="k", ls="-", lw=3.0)
    for row, s in zip(axes, settings):
        for ax, (gtitle, keep) in zip(row, groups):
            for name in dict.fromkeys(r["method"] for r in summary if r["setting"] == s):
                rs = sorted((r for r in summary if r["setting"] == s and r["method"] == name), key=lambda r: r["keep_ratio"])
                if name == "full":
                    ax.axhline(rs[0]["acc"], color="grey", ls="--", lw=1, label="full cache")
                elif keep(name):
                    ax.plot([r["keep_ratio"] for r in rs], [r["acc"] for r in rs], marker="o", ms=3,
                            label=name, **style[name.split("@")[0]])
            ax.set_xscale("log")
            ticks = sorted({r["keep_ratio"] for r in summary if r["method"] != "full"})
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("keep ratio (observation window inside the budget)")
            ax.set_ylabel("needle exact match")
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"SmolLM2-135M, question-{s}: {gtitle}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    command = args.command or "python eval/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.report:
        rows = [r for p in args.report.split(",") if p for r in read_csv(p)]
        # one row per (setting, method, ratio, prompt): a later file wins
        rows = list({(r["setting"], r["method"], r["keep_ratio"], r["prompt"]): r for r in rows}.values())
    else:
        rows = run(args)
    write_csv(rows, args.csv or os.path.join(args.out, "results.csv"))
    if args.csv and not args.report:
        log(f"done in {time.time() - t0:.0f}s: {args.csv}")
        return
    summary = summarize(rows)
    write_markdown(summary, rows, command, os.path.join(args.out, "results.md"))
    write_plot(summary, os.path.join(args.out, "accuracy.png"))
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())
    log(f"done in {time.time() - t0:.0f}s: {args.out}/results.md, results.csv, accuracy.png")


if __name__ == "__main__":
    main()
