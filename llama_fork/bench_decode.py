#!/usr/bin/env python3
"""Decode speed of the fork's cache: full vs holes vs compacted, interleaved (issue 12).

Each round runs `llama-kvevict-needle --bench N` once per mode, in an order rotated every round
(full, holes, compacted; then holes, compacted, full; ...), so a change of the machine's load hits
every mode alike. Modes (same needle prompt, same keep ratio):
  full       no eviction: the whole prompt in the cache
  holes      as many cells removed with llama_memory_seq_rm (the span stays: n_kv as full)
  compacted  llama_kv_evict (laprox-span): the kept cells moved to the front, n_kv shrunk
Reports per (prompt, flash attention) the median wall tokens/s and CPU ms per token of each mode, the
median over rounds of the per-round ratios (of tokens/s, and of CPU time: steadier on a shared
machine), and n_kv during the benchmark. Timings are printed, never asserted. --raw FILE appends
every run's RESULT row (JSON lines). --state-dir DIR prefills each (prompt, flash) once, saving the
sequence (--state-file), and every run then loads it (--load-state) instead of prefilling (long
prompts on a slow machine); the restored sequence has no window queries, so the compacted and holes
runs then evict with streamingllm (the same number of cells kept, so the same n_kv: decode speed
does not depend on which cells are kept).

  python3 llama_fork/bench_decode.py --bin BUILD/bin --model SmolLM2-135M-Instruct.Q4_1.gguf \
      [--rounds 5] [--ctx-tokens 1000,4000] [--flash off,on] [--bench 128] [--keep 0.1] [-tb 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ["full", "holes", "compacted"]


def run(args, ctx_tokens, flash, mode, extra=()):
    cmd = [os.path.join(args.bin, "llama-kvevict-needle"), "-m", args.model, "--needle", "0.5", "--seed", "5",
           "--ctx-tokens", str(ctx_tokens), "--bench", str(args.bench), "-t", "1", "-tb", str(args.tb),
           "--flash-attn", flash]
    if mode == "full":
        cmd += ["--kv-evict", "full"]
    else:
        method = "streamingllm" if args.state_dir else "laprox-span"
        cmd += ["--kv-evict", method, "--kv-keep", str(args.keep)] + (["--holes"] if mode == "holes" else [])
    if args.state_dir and mode != "prefill":
        cmd += ["--load-state", state_file(args, ctx_tokens, flash) + ".full"]
    cmd += list(extra)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    if len(row) != 1:
        sys.exit(f"no RESULT line from {' '.join(cmd)}")
    return row[0]


def state_file(args, ctx_tokens, flash):
    return os.path.join(args.state_dir, f"needle-{ctx_tokens}-flash-{flash}.state")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ctx-tokens", default="1000,4000")
    ap.add_argument("--flash", default="off,on")
    ap.add_argument("--bench", type=int, default=128)
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("-tb", dest="tb", type=int, default=2, help="prefill threads (decode runs on one)")
    ap.add_argument("--modes", default=",".join(MODES), help="a subset of " + ",".join(MODES))
    ap.add_argument("--raw", help="append every RESULT row here")
    ap.add_argument("--state-dir", help="prefill once per (prompt, flash), then load the saved sequence")
    args = ap.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    load0 = os.getloadavg()
    t0 = time.time()
    lines = []
    for ctx_tokens in [int(x) for x in args.ctx_tokens.split(",")]:
        for flash in args.flash.split(","):
            res = {m: [] for m in modes}
            if args.state_dir:
                run(args, ctx_tokens, flash, "prefill", ["--state-file", state_file(args, ctx_tokens, flash)])
            for r in range(args.rounds):
                k = r % len(modes)
                for m in modes[k:] + modes[:k]:
                    res[m].append(run(args, ctx_tokens, flash, m))
                    if args.raw:
                        with open(args.raw, "a") as f:
                            f.write(json.dumps(dict(res[m][-1], mode=m, round=r + 1)) + "\n")
                print(f"# {ctx_tokens} flash {flash} round {r + 1}: " +
                      ", ".join(f"{m} {res[m][-1]['tok_s']:.1f} tok/s {res[m][-1]['cpu_ms_per_tok']:.2f} ms CPU" for m in modes),
                      flush=True)
            tok = {m: f"{statistics.median(x['tok_s'] for x in res[m]):.1f} / "
                      f"{statistics.median(x['cpu_ms_per_tok'] for x in res[m]):.2f} ms" if m in res else "-" for m in MODES}

            def ratio(a, b):
                if a not in res or b not in res:
                    return "-"
                wall = statistics.median(x["tok_s"] / y["tok_s"] for x, y in zip(res[a], res[b]))
                cpu = statistics.median(y["cpu_ms_per_tok"] / x["cpu_ms_per_tok"] for x, y in zip(res[a], res[b]))
                return f"{wall:.2f}x / {cpu:.2f}x"
            first = res[modes[0]][0]
            span = f" ({res['holes'][0]['n_kv_end']})" if "holes" in res else ""
            c = res.get("compacted", [None])[0]
            comp = f" ({c['cells_after']} cells, n_kv {c['n_kv_after']} -> {c['n_kv_end']})" if c else ""
            lines.append(
                f"| {first['prompt']} | {flash} | {tok['full']} | {tok['holes']}{span} | {tok['compacted']}{comp} "
                f"| {ratio('compacted', 'full')} | {ratio('compacted', 'holes')} | {ratio('holes', 'full')} |")
    load1 = os.getloadavg()
    print(f"\n{args.rounds} rounds per row, modes interleaved (order rotated each round), {args.bench} decode tokens "
          f"at -t 1, keep {args.keep}; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; "
          f"{time.time() - t0:.0f} s; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("Each cell: median wall tokens/s / median CPU ms per token; ratios: median of the per-round "
          "speed-ups, wall / CPU.")
    print("| prompt | flash | full | holes (n_kv) | compacted (cells, n_kv) "
          "| compacted vs full | compacted vs holes | holes vs full |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
