"""Ceiling of token selection on the multi-key task (eval/tasks.py `multikey`): fixed kept sets
built from the answer's location, decoded through the cache like any method's selection.

- `code+sink4+fill`: the three code sentences verbatim ("The amber code is 76224."), the first
  4 tokens, the 8-token window, then random other tokens up to the ratio's budget;
- `code+sink4+dots`: the code sentences, 4 sinks, the window and every "." of the context
  (about 12 % of the cache here, over the 10 % budget);
- `code-B+A+sink4+fill` (`--margins B:A,...`): each code sentence with B tokens before and A
  after it, then as `code+sink4+fill` (over the budget when the spans alone exceed it).

    python eval/multikey_oracle.py --prompts 8 --ratios 0.1,0.25,0.5
    python eval/multikey_oracle.py --prompts 8 --ratios 0.1 --margins 8:0,16:0,32:0,0:8,8:8,16:16
"""
import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import captures  # noqa: E402
import tasks  # noqa: E402
from engine import Model  # noqa: E402
from metrics import evaluate_selections  # noqa: E402
from needle import CONTEXT_TOKENS  # noqa: E402

WINDOW = 8


def code_spans(pieces):
    """Token ranges of "The <label> code is <5 digits>." sentences."""
    return [range(i - 1, i + 10) for i in range(len(pieces) - 3)
            if pieces[i].strip() in tasks.LABELS and pieces[i + 1].strip() == "code" and pieces[i + 2].strip() == "is"]


def oracle(tok, dots, before=0, after=0):
    def select(cap, ratio):
        pieces = [tok.decode([int(t)]) for t in cap.a["prefill_ids"]]
        n = cap.n
        keep = set(range(n - WINDOW, n)) | set(range(4))
        for sp in code_spans(pieces):
            keep |= set(range(max(sp.start - before, 0), min(sp.stop + after, n)))
        if dots:
            keep |= {i for i in range(n) if pieces[i] == "."}
        else:
            rest = np.array(sorted(set(range(n)) - keep))
            extra = max(int(ratio * n) - len(keep), 0)
            keep |= set(np.random.default_rng(0).choice(rest, extra, replace=False).tolist())
        k = np.array(sorted(keep), np.int64)
        return [[k for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]
    return select


def multikey_args(doc, ratios, flag, help):
    """The multikey studies' command line: --prompts, --ratios (default `ratios`), --seed-base
    and the study's own string option `flag` (default empty). Returns (args, the ratios)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--ratios", default=ratios)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument(flag, default="", help=help)
    args = ap.parse_args()
    return args, [float(r) for r in args.ratios.split(",")]


def main():
    args, ratios = multikey_args(__doc__, "0.1,0.25,0.5", "--margins",
                                 "before:after token margins around each code sentence, e.g. 8:0,16:0,8:8")
    model = Model()
    tok = model.tokenizer
    selects = [("code+sink4+fill", oracle(tok, False)), ("code+sink4+dots", oracle(tok, True))]
    for b, a in [(int(x.split(":")[0]), int(x.split(":")[1])) for x in args.margins.split(",") if x]:
        selects.append((f"code-{b}+{a}+sink4+fill", oracle(tok, False, b, a)))
    tot, full = {}, 0
    for p, cap in captures.answered(model, "multikey", args.prompts, CONTEXT_TOKENS, args.seed_base, "agnostic"):
        full += 1
        for name, r, e, kept in evaluate_selections(model, cap, selects, ratios, p.key):
            frac = len(kept[0][0]) / cap.n
            t = tot.setdefault((name, r), [0, 0.0])
            t[0] += e["correct"]
            t[1] += frac
    print(f"| oracle | ratio | correct of the {full} the full cache answers | kept (mean) |\n|---|---:|---:|---:|")
    for (name, r), (c, f) in tot.items():
        if name.endswith("dots") and r != ratios[0]:
            continue  # the same set at every ratio
        print(f"| {name} | {r:g} | {c}/{full} | {f / full:.1%} |")


if __name__ == "__main__":
    main()
