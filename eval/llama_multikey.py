"""The multi-key task (eval/tasks.py `multikey`: one context, three labelled codes, each asked
after) run through llama.cpp itself: the unpatched example `c_examples/llama_cpp`
(`kvevict_llama -f CONTEXT -q QUESTION --agnostic`), on any GGUF the vendored llama.cpp
loads — e.g. Gemma 3 270M, which the numpy engine of eval/ cannot run. One process per
question: the context is prefilled, compressed once without the question by each method,
then the question is fed and 8 tokens decoded greedily. A method is correct when the first
run of digits of its answer starts with the code; the count is over the questions the full
cache answers.

    python eval/llama_multikey.py --example BUILD/kvevict_llama --model MODEL.gguf \\
        --prompts 8 --keep 0.1,0.05 --methods uniqueness,laprox-span,snapkv [--seed-base 1000]

The contexts are built with SmolLM2's tokenizer (about 1000 of its tokens); another model's
tokenizer counts them a little differently (Gemma 3: 985 tokens for the first context).
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
from engine import Model  # noqa: E402


def correct(answer, key):
    m = re.search(r"\d+", answer)
    return bool(m) and m.group(0)[: len(key)] == key


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", required=True, help="the built c_examples/llama_cpp binary")
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--prompts", type=int, default=8, help="contexts (3 questions each)")
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--keep", default="0.1,0.05")
    ap.add_argument("--methods", default="uniqueness,laprox-span,snapkv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-v", action="store_true", help="print every answer")
    args = ap.parse_args()
    tok = Model(verbose=False).tokenizer
    keeps = args.keep.split(",")
    methods = args.methods.split(",")
    right = collections.Counter()
    cost = collections.defaultdict(list)
    full = 0
    with tempfile.TemporaryDirectory() as tmp:
        for gi, group in enumerate(tasks.make_task("multikey", tok, args.prompts, seed_base=args.seed_base)):
            path = os.path.join(tmp, f"context{gi}.txt")
            with open(path, "w") as f:
                f.write(group[0].context)
            for p in group:
                answered = None
                for keep in keeps:
                    cmd = [args.example, "-m", args.model, "--method", ",".join(["full"] + methods), "--agnostic",
                           "--keep", keep, "-f", path, "-q", p.question, "-n", "8", "-t", str(args.threads)]
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    if out.returncode:
                        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
                    res = {r["method"]: r for r in (json.loads(line[7:]) for line in out.stdout.splitlines()
                                                    if line.startswith("RESULT "))}
                    if answered is None:
                        answered = correct(res["full"]["answer"], p.key)
                        full += answered
                    if not answered:
                        break
                    for m in methods:
                        ok = correct(res[m]["answer"], p.key)
                        right[(m, keep)] += ok
                        cost[m].append(res[m]["kvevict_ms"] / res[m]["prefill_ms"])
                        if args.v:
                            print(f"context {gi} {p.key} keep {keep} {m}: {res[m]['answer']!r} {'ok' if ok else 'WRONG'}")
                if args.v and not answered:
                    print(f"context {gi} {p.key}: the full cache answered {res['full']['answer']!r}")
    print(f"{os.path.basename(args.model)}, multi-key, seed base {args.seed_base}, question-agnostic: "
          f"correct of the {full} questions the full cache answers")
    print("| method | " + " | ".join(f"keep {k}" for k in keeps) + " | kvevict, % of the prefill |")
    print("|---|" + "---:|" * (len(keeps) + 1))
    for m in methods:
        share = 100 * sum(cost[m]) / max(len(cost[m]), 1)
        print(f"| {m} | " + " | ".join(f"{right[(m, k)]}/{full}" for k in keeps) + f" | {share:.1f} % |")


if __name__ == "__main__":
    main()
