#!/usr/bin/env python3
"""Interleaved A/B of `bench_cpu` builds against the same run's single-core sgemm (issue 31).

Each round measures numpy's sgemm (1024x1024 f32, one BLAS thread, best of 7, thread CPU
time), then runs every binary in turn (`bench_cpu --load CASE --reps R --scorers ...`) on
every case. Prints, per (case, scorer, binary), the kernel build that ran, the minimum
thread CPU time over the rounds, its useful GFLOP/s (as `bench/numpy_ref.py` counts them)
as a share of the best round's sgemm, the share in each round (against that round's
sgemm), and for TOVA and KNorm the share of the rate of reading their key bytes
(`bench_cpu`'s own plain read loops, the `read` scorer, best over the rounds). Meant for a
shared, loaded machine: compare binaries only within one run, by these ratios.

  bench_cpu --reps 0 --n 4096 --dump /tmp/cases        # once
  bench/ab_cpu.py --bins before=/tmp/old_bench_cpu,after=target/release/examples/bench_cpu \\
      --cases /tmp/cases/smol-4096,/tmp/cases/llama-4096 --scorers snapkv,snapkv-w8,tova

The AVX2 path on an AVX-512 machine: set KVEVICT_NO_AVX512=1 (the binaries inherit it) and
OPENBLAS_CORETYPE=Haswell, so that the sgemm it is compared with runs AVX2 kernels too.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

# window of each preset (bench_cpu's, numpy_ref.py's CFG)
WINDOW = {"snapkv": 32, "snapkv-kvpress": 64, "lava": 32, "laprox": 32, "laprox-cached": 32,
          "criticalkv": 64, "knorm": 32, "tova": 1, "streamingllm": 32, "value-forms": 0,
          "uniqueness": 8}


def sgemm():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(7):
        c = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - c)
    return 2 * 1024**3 / best / 1e9


def meta(d):
    with open(os.path.join(d, "meta.txt")) as f:
        m = dict(line.strip().split("=") for line in f)
    return {k: int(v) if v.isdigit() else v for k, v in m.items()}


def window(name):
    b = name.replace("+lse", "")
    return 8 if "-w8" in b else WINDOW[b.replace("-w8", "")]


def flops(m, name):
    """Useful FLOPs, as bench/numpy_ref.py's `flops`."""
    hq, hkv, d, n = m["hq"], m["hkv"], m["d"], m["n"]
    w, b = window(name), name.replace("+lse", "").replace("-w8", "")
    if b == "knorm":
        return 2 * hkv * (n - w) * d
    if b == "value-forms":
        return hq * n * (2 * d * d + 2 * d)
    if b == "uniqueness":
        return hkv * n * (n - 1) * 2 * d
    if b == "streamingllm":
        return 0
    f = 2 * hq * w * n * d
    if b == "laprox":
        f += hq * (n - w) * (2 * d * d + 2 * d)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", required=True, help="label=path,label=path (bench_cpu binaries)")
    ap.add_argument("--cases", required=True, help="comma-separated dumped case directories")
    ap.add_argument("--scorers", default="snapkv,snapkv+lse,snapkv-w8,tova,knorm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10, help="runs per scorer, binary and round")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bins.split(",")]
    scorers = a.scorers
    if {"tova", "knorm"} & set(scorers.split(",")):
        scorers = "read," + scorers
    best, read, gemm = {}, {}, []
    for r in range(a.rounds):
        g = sgemm()
        gemm.append(g)
        print(f"round {r + 1}: sgemm {g:.1f} GFLOP/s, load average "
              f"{' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
        for cd in a.cases.split(","):
            m, case = meta(cd), os.path.basename(cd.rstrip("/"))
            for lab, b in bins:
                out = subprocess.run([b, "--load", cd, "--reps", str(a.reps), "--scorers", scorers],
                                     capture_output=True, text=True, check=True).stdout
                for line in out.splitlines():
                    f = line.split("\t")
                    if f[0] == "READ":
                        read[case] = max(read.get(case, 0.0), int(f[2]) / float(f[3]))
                    elif f[0] == "RESULT":
                        name, t = f[2], float(f[6])
                        e = best.setdefault((case, name, lab), [t, [], f[7] if len(f) > 7 else "?", m])
                        e[0] = min(e[0], t)
                        e[1].append(100 * flops(m, name) / t / 1e9 / g)
    top = max(gemm)
    print(f"\nsgemm per round: {' '.join(f'{x:.1f}' for x in gemm)} GFLOP/s (best {top:.1f})")
    print("| case | scorer | binary | kernel | ms | % of sgemm (best) | per round | % of read |")
    print("|---|---|---|---|---:|---:|---|---:|")
    for (case, name, lab), (t, per, kern, m) in sorted(best.items()):
        share = f"{100 * flops(m, name) / t / 1e9 / top:.0f}%" if flops(m, name) else "–"
        rd = "–"
        if name in ("tova", "knorm") and case in read:
            es = 2 if m["dtype"] == "f16" else 4
            keys = m["n"] if name == "tova" else m["n"] - window(name)
            rd = f"{100 * m['hkv'] * keys * m['d'] * es / t / read[case]:.0f}%"
        rounds = " ".join(f"{x:.0f}" for x in per) if flops(m, name) else "–"
        print(f"| {case} | {name} | {lab} | {kern} | {t * 1e3:.3f} | {share} | {rounds} | {rd} |")


if __name__ == "__main__":
    main()
