"""The results driver behind scripts/results.sh: every regenerated table and plot of
docs/results/, each a named step, each output stamped with the command, the commit, the
library's version, the date, the CPU and the load.

    scripts/results.sh                      # every step, full size -> docs/results/generated/, docs/results/accuracy.png
    scripts/results.sh --quick              # CI size (2 prompts, 2 ratios, 4 methods) -> eval/out/results-quick/
    scripts/results.sh --only needle-aware,plot

Steps (in order): `needle-aware` and `needle-agnostic` (eval/run.py's study in one setting:
`generated/NAME.md` tables and `generated/NAME.csv` rows), `plot` (`accuracy.png` drawn from
those two CSVs, never from numbers typed in). The results of docs/results/ that no step
regenerates yet are listed by the driver (`PENDING`) and in `generated/README.md`, without
output. The method list is eval/methods.py's entries for the library's presets
(kvevict.PRESET_NAMES) plus the baselines of `BASELINES`; a preset without an entry fails the
run, so a new preset shows up in the tables on the next run.
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

EVAL = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(EVAL)
sys.path.insert(0, EVAL)

import methods  # noqa: E402
import run as study  # noqa: E402

RATIOS = "0.5,0.25,0.1,0.05,0.025"
# besides the library's presets: the full cache, the floor and the preset of eval/demo.py
BASELINES = ["full", "random", "laprox-span-w8"]
# library presets that the prefill study does not run, and why
DECODE_ONLY = {"tova-decay": "its prefill scores are TOVA's; the decay acts only at decode time under a cell budget",
               "h2o": "its prefill scores are unpooled SnapKV's; the memory acts only at decode time under a cell budget"}
HIGHLIGHT = ("laprox-span", "laprox-span-w8", "uniqueness")  # drawn thick and labelled
# eval/smoke.py's two prompts (depths 33 and 67 %, answered by the full cache; their
# question-aware captures are cached by the smoke test that runs before)
QUICK = dict(prompts=10, pick="3,6", ratios="0.1,0.025", methods="full,streamingllm,laprox-span,uniqueness")
SETTINGS = {"needle-aware": "aware", "needle-agnostic": "agnostic"}
STEPS = list(SETTINGS) + ["plot"]
# results of docs/results/ with no step yet (made by hand from a script's printout)
PENDING = {
    "explore": "LaProx-span variants, value links, power (eval/explore.py, eval/span_power.py) -> needle.md",
    "agnostic-tasks": "prose, multi-key, oracles (eval/agnostic.py, uniqueness_pools.py, multikey_*.py) -> agnostic.md",
    "gemma3": "Gemma 3 through llama.cpp (eval/llama_multikey.py) -> agnostic.md, llama-cpp.md",
    "fork-decode": "the fork's decode speed, memory, decode-time eviction (llama_fork/bench_decode.py) -> llama-cpp.md, decode.md",
    "cpu": "CPU speed tables (scripts/bench_cpu.sh; raw outputs already in cpu/) -> cpu.md",
}
STAMP_RE = re.compile(r"^> \*\*Generated\*\* (.*)$", re.M)


def log(msg):
    print(f"results: {msg}", file=sys.stderr, flush=True)


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()


def commit(outputs):
    """HEAD, plus `-dirty` when a tracked file other than the driver's outputs differs;
    `unknown (no git: ...)` outside a usable git checkout (an exported tree, no git)."""
    excl = [f":(exclude){os.path.relpath(p, ROOT)}" for p in outputs if os.path.abspath(p).startswith(ROOT + os.sep)]
    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excl)
    except (OSError, subprocess.CalledProcessError) as e:
        why = (getattr(e, "stderr", "") or str(e)).strip().splitlines()
        return f"unknown (no git: {why[0] if why else e})"
    return head + ("-dirty" if dirty else "")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load():
    return os.getloadavg()[0]


class Stamp:
    """What every output of one run says about how it was made."""

    def __init__(self, command, outputs):
        import kvevict
        self.command = command
        self.commit = commit(outputs)
        self.version = kvevict.version()
        self.cpu = f"{cpu_model()}, {os.cpu_count()} cores"

    def line(self, load0, load1, seconds, when):
        return (f"by `{self.command}` · commit `{self.commit}` · kvevict {self.version} · "
                f"{when:%Y-%m-%d %H:%M} UTC · {self.cpu} · load {load0:.1f} → {load1:.1f} · {seconds:.0f} s")


def method_list():
    """BASELINES + every library preset that eval/methods.py has an entry for (one that has
    none stops the run: add it to methods.METHODS)."""
    import kvevict
    missing = [p for p in kvevict.PRESET_NAMES if p not in methods.METHODS and p not in DECODE_ONLY]
    if missing:
        raise SystemExit(f"results: library presets without an eval/methods.py entry: {', '.join(missing)}")
    names = BASELINES + [p for p in kvevict.PRESET_NAMES if p not in BASELINES and p not in DECODE_ONLY]
    return ",".join(names)


def step_needle(name, ctx):
    """eval/run.py's study in one setting -> NAME.csv, NAME.md."""
    setting = SETTINGS[name]
    args = study.parse_args(["--setting", setting, "--prompts", str(ctx.prompts), "--pick", ctx.pick,
                             "--ratios", ctx.ratios, "--methods", ctx.methods])
    rows = study.run(args)
    csv_path = os.path.join(ctx.gen, f"{name}.csv")
    study.write_csv(rows, csv_path)
    md_tmp = os.path.join(ctx.gen, f".{name}.md.tmp")
    study.write_markdown(study.summarize(study.read_csv(csv_path)), rows, ctx.stamp.command, md_tmp)
    body = open(md_tmp).read()
    os.remove(md_tmp)
    title, _, rest = body.partition("\n")
    skipped = "".join(f" `{p}` is not run: {why}." for p, why in DECODE_ONLY.items())
    return title, (f"Rows: [`{name}.csv`]({name}.csv) (one per method, keep ratio and prompt). Methods: "
                   f"eval/results.py's baselines and every library preset.{skipped}\n" + rest)


def step_plot(name, ctx):
    """accuracy.png from the needle-aware and needle-agnostic CSVs."""
    summaries = {}
    for step, setting in SETTINGS.items():
        path = os.path.join(ctx.gen, f"{step}.csv")
        if not os.path.exists(path):
            raise SystemExit(f"results: plot: {path} missing (run --only {step} first)")
        summaries[setting] = (study.summarize(study.read_csv(path)), stamp_of(os.path.join(ctx.gen, f"{step}.md")))
    png = os.path.join(ctx.out, "accuracy.png")
    write_plot(summaries, png)
    rel = os.path.relpath(png, ctx.gen)
    lines = [f"![accuracy]({rel})", "",
             "Prompts answered, of those the full cache answers, against the keep ratio; from "
             f"[`needle-aware.csv`](needle-aware.csv) and [`needle-agnostic.csv`](needle-agnostic.csv)."]
    return "# Needle accuracy against the keep ratio (the plot)", "\n".join(lines) + "\n"


def stamp_of(md_path):
    m = STAMP_RE.search(open(md_path).read()) if os.path.exists(md_path) else None
    return m.group(1) if m else "?"


def write_plot(summaries, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"aware": "question-aware (question in the observation window)",
              "agnostic": "question-agnostic (context compressed before the question)"}
    fig, axes = plt.subplots(1, len(summaries), figsize=(13, 5.6), squeeze=False, sharey=True)
    names = list(dict.fromkeys(r["method"] for s, _ in summaries.values() for r in s if r["method"] != "full"))
    base = [n for n in names if n not in HIGHLIGHT]
    cmap = plt.get_cmap("tab20")
    style = {n: dict(color=cmap(i % 20), lw=1.0, alpha=0.8, marker=".", ms=4) for i, n in enumerate(base)}
    strong = {"laprox-span": "#d62728", "laprox-span-w8": "#8c1010", "uniqueness": "#1f3fbf"}
    style.update({n: dict(color=strong[n], lw=3.2, marker="o", ms=6, zorder=5) for n in HIGHLIGHT})
    stamps = []
    for ax, (setting, (summary, stamp)) in zip(axes[0], summaries.items()):
        ratios = sorted({r["keep_ratio"] for r in summary if r["method"] != "full"})
        full = [r for r in summary if r["method"] == "full"]
        for name in dict.fromkeys(r["method"] for r in summary):
            if name == "full":
                continue
            rs = sorted((r for r in summary if r["method"] == name), key=lambda r: r["keep_ratio"])
            xs, ys = [r["keep_ratio"] for r in rs], [r["acc_full_ok"] for r in rs]
            ax.plot(xs, ys, label=name, **style[name])
            if name in HIGHLIGHT:  # labelled at the smallest ratio (the right end)
                dy = {"laprox-span": 8, "laprox-span-w8": 18, "uniqueness": -14}[name]
                ax.annotate(name, (xs[0], ys[0]), xytext=(-4, dy), textcoords="offset points", ha="right",
                            fontsize=9, fontweight="bold", color=style[name]["color"])
        ax.set_xscale("log")
        ax.set_xticks(ratios, [f"{100 * t:g} %" for t in ratios])
        ax.minorticks_off()
        ax.set_xlim(max(ratios) * 1.3, min(ratios) / 1.3)  # 50 % on the left, 2.5 % on the right
        ax.set_ylim(-0.08, 1.12)
        ax.set_xlabel("keep ratio (observation window inside the budget)")
        n_ok = full[0]["correct"] if full else "?"
        n = full[0]["n"] if full else "?"
        ax.set_title(f"{titles[setting]}\n{n} needle prompts, the full cache answers {n_ok}", fontsize=10)
        ax.grid(alpha=0.3)
        stamps.append(f"{setting}: {stamp}")
    axes[0][0].set_ylabel("answered / answered by the full cache")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.115), ncol=8, fontsize=8, frameon=False)
    fig.suptitle("kvevict on SmolLM2-135M-Instruct (numpy engine): needle in a haystack", fontsize=12)
    caption = "\n".join(s.replace("`", "") for s in stamps)
    fig.text(0.01, 0.005, caption, fontsize=6.5, color="0.3", va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


STEP_FN = {"needle-aware": step_needle, "needle-agnostic": step_needle, "plot": step_plot}


def write_index(ctx):
    lines = ["# Generated results", "",
             "Written by `scripts/results.sh` (eval/results.py): do not edit; rerun the driver. "
             "Each file's first lines say how it was made.", "",
             "| step | file | made |", "|---|---|---|"]
    for name in STEPS:
        md = os.path.join(ctx.gen, f"{name}.md")
        made = stamp_of(md) if os.path.exists(md) else "not yet run"
        lines.append(f"| `{name}` | [{name}.md]({name}.md) | {made} |" if os.path.exists(md)
                     else f"| `{name}` | | {made} |")
    lines += ["", "Not yet regenerated (tables written by hand from the scripts' output):", ""]
    lines += [f"- `{n}`: {t}" for n, t in PENDING.items()]
    with open(os.path.join(ctx.gen, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def verify(ctx, steps):
    """The outputs are whole: every step's stamp names this run's commit, every CSV holds one
    row per (method, ratio, prompt), the plot is a PNG. Raises SystemExit otherwise."""
    import csv
    bad = []
    n_methods = len([m for m in ctx.methods.split(",") if m])
    n_ratios = len([r for r in ctx.ratios.split(",") if r])
    full = 1 if "full" in ctx.methods.split(",") else 0
    for name in steps:
        md = os.path.join(ctx.gen, f"{name}.md")
        if not stamp_of(md).startswith(f"by `{ctx.stamp.command}` · commit `{ctx.stamp.commit}`"):
            bad.append(f"{md}: stamp {stamp_of(md)!r}")
        if name in SETTINGS:
            with open(os.path.join(ctx.gen, f"{name}.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            n_prompts = len([i for i in ctx.pick.split(",") if i]) or ctx.prompts
            want = n_prompts * ((n_methods - full) * n_ratios + full)
            if len(rows) != want or {r["setting"] for r in rows} != {SETTINGS[name]}:
                bad.append(f"{name}.csv: {len(rows)} rows, want {want} of setting {SETTINGS[name]}")
        if name == "plot":
            with open(os.path.join(ctx.out, "accuracy.png"), "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    bad.append("accuracy.png: not a PNG")
    if bad:
        raise SystemExit("results: incomplete outputs:\n  " + "\n  ".join(bad))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI size: eval/smoke.py's 2 prompts, 2 ratios, 4 methods")
    ap.add_argument("--only", default="", help=f"comma separated steps, from: {', '.join(STEPS)}")
    ap.add_argument("--out", default=None,
                    help="output folder (default docs/results, --quick: eval/out/results-quick); tables in <out>/generated")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--pick", default="", help="prompt indices of the --prompts (default all)")
    ap.add_argument("--ratios", default=RATIOS)
    ap.add_argument("--methods", default=None, help="default: BASELINES + the library's presets")
    ap.add_argument("--command", default=None, help="the command stamped (scripts/results.sh passes its own)")
    ctx = ap.parse_args(argv)
    if ctx.quick:
        ctx.prompts, ctx.pick, ctx.ratios = QUICK["prompts"], QUICK["pick"], QUICK["ratios"]
        ctx.methods = ctx.methods or QUICK["methods"]
        ctx.out = ctx.out or os.path.join(EVAL, "out", "results-quick")
    ctx.out = os.path.abspath(ctx.out or os.path.join(ROOT, "docs", "results"))
    ctx.gen = os.path.join(ctx.out, "generated")
    ctx.methods = ctx.methods or method_list()
    steps = [s for s in ctx.only.split(",") if s] or STEPS
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise SystemExit(f"results: unknown step(s) {', '.join(unknown)}; steps: {', '.join(STEPS)}; "
                         f"not yet regenerated: {', '.join(PENDING)}")
    os.makedirs(ctx.gen, exist_ok=True)
    command = ctx.command or "python eval/results.py " + " ".join(sys.argv[1:] if argv is None else argv)
    ctx.stamp = Stamp(command, [ctx.gen, os.path.join(ctx.out, "accuracy.png")])
    log(f"commit {ctx.stamp.commit}, kvevict {ctx.stamp.version}; steps {', '.join(steps)}; "
        f"{ctx.prompts} prompts, ratios {ctx.ratios}; methods {ctx.methods}")
    for name in steps:
        t0, l0 = time.time(), load()
        title, body = STEP_FN[name](name, ctx)
        line = ctx.stamp.line(l0, load(), time.time() - t0, datetime.datetime.now(datetime.timezone.utc))
        with open(os.path.join(ctx.gen, f"{name}.md"), "w") as f:
            f.write(f"{title}\n\n<!-- written by scripts/results.sh: do not edit -->\n> **Generated** {line}\n\n{body}")
        log(f"{name}: {line}")
    write_index(ctx)
    verify(ctx, steps)
    for n, t in PENDING.items():
        log(f"not yet regenerated: {n}: {t}")


if __name__ == "__main__":
    main()
