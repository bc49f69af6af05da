#!/usr/bin/env python3
"""numpy reference for the CPU benchmark (issue 2), run by scripts/bench_cpu.sh.

Reads the cases that `bench_cpu --dump DIR --reps 0` wrote, and per round and case runs
`bench_cpu --load` (our times and scores) and then the same scores with numpy, the direct
way — per KV group one BLAS matmul Q·Kᵀ over all N keys, the full softmax of every window
row over its [N] logits (max, exp, sum, divide), column sums/norms, pooling, GQA
reduction. Checks the scores against ours, measures the single-core sgemm rate, and
prints a markdown table of the minima over the rounds.

BLAS runs single-threaded (OPENBLAS/OMP/MKL_NUM_THREADS=1 set before numpy loads); numpy's
elementwise ufuncs are single-threaded anyway. Times are the minimum over --reps runs.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

F32 = np.float32


# ---------------------------------------------------------------------------------------
# inputs


def load_case(d):
    meta = {}
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            k, v = line.strip().split("=")
            meta[k] = v
    hq, hkv, dk, n, wq = (int(meta[k]) for k in ("hq", "hkv", "d", "n", "wq"))
    dt = np.float16 if meta["dtype"] == "f16" else np.float32
    g = hq // hkv

    def rd(name, dtype, shape):
        return np.fromfile(os.path.join(d, name), dtype=dtype).reshape(shape)

    return dict(
        name=os.path.basename(d),
        shape=meta["shape"],
        dtype=meta["dtype"],
        hq=hq,
        hkv=hkv,
        g=g,
        dk=dk,
        n=n,
        wq=wq,
        q=rd("q.bin", dt, (hq, wq, dk)),
        k=rd("k.bin", dt, (hkv, n, dk)),
        v=rd("v.bin", dt, (hkv, n, dk)),
        gram=rd("gram.bin", F32, (hkv, g, dk, dk)),
        forms=rd("forms.bin", F32, (hkv, g, n)),
        l1=rd("l1.bin", F32, (hkv, n)),
        dir=d,
    )


# ---------------------------------------------------------------------------------------
# the math (design §2–§3), numpy style


def window_attention(c, kh, w):
    """A[g, w, N]: softmax over all visible keys of the group's w window rows. With the
    rows' log-sum-exp given (`c["lse"][w]`, `+lse` scorers) only the prefix columns,
    A[g, w, P] = exp(z - lse)."""
    g, dk, n = c["g"], c["dk"], c["n"]
    p = n - w
    q = c["q"][kh * g:(kh + 1) * g, c["wq"] - w:, :].astype(F32).reshape(g * w, dk)
    q *= F32(1.0 / np.sqrt(dk))
    lse = c.get("lse", {}).get(w)
    if lse is not None:
        z = (q @ c["k"][kh, :p].astype(F32).T).reshape(g, w, p)
        z -= lse[kh * g:(kh + 1) * g, :, None]
        np.exp(z, out=z)
        return z
    k = c["k"][kh].astype(F32)
    z = (q @ k.T).reshape(g, w, n)
    # causal inside the window: query j sees keys i <= p + j
    z[:, :, p:][:, np.triu(np.ones((w, w), dtype=bool), 1)] = -np.inf
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def row_lse(c, w):
    """[Hq, w]: the window rows' log-sum-exp (what flash attention's softmax_lse gives)."""
    hq, g, dk, n = c["hq"], c["g"], c["dk"], c["n"]
    p = n - w
    out = np.empty((hq, w), np.float64)
    for kh in range(c["hkv"]):
        q = c["q"][kh * g:(kh + 1) * g, c["wq"] - w:, :].astype(np.float64).reshape(g * w, dk)
        z = (q @ c["k"][kh].astype(np.float64).T / np.sqrt(dk)).reshape(g, w, n)
        z[:, :, p:][:, np.triu(np.ones((w, w), dtype=bool), 1)] = -np.inf
        m = z.max(axis=-1, keepdims=True)
        out[kh * g:(kh + 1) * g] = (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[..., 0]
    return out.astype(F32)


def pool(x, kind, k):
    """1-D pooling along the last axis, stride 1, padding k//2 (avg: pads count as 0)."""
    if k == 1:
        return x
    h = k // 2
    p = x.shape[-1]
    pad = [(0, 0)] * (x.ndim - 1) + [(h, h)]
    if kind == "max":
        xp = np.pad(x, pad, constant_values=-np.inf)
        out = xp[..., 0:p].copy()
        for s in range(1, k):
            np.maximum(out, xp[..., s:s + p], out=out)
        return out
    xp = np.pad(x, pad)
    out = xp[..., 0:p].copy()
    for s in range(1, k):
        out += xp[..., s:s + p]
    return out * F32(1.0 / k)


# scorer name -> (window, pool kind, kernel)
CFG = {
    "snapkv": (32, "max", 7),
    "snapkv-kvpress": (64, "avg", 5),
    "lava": (32, "max", 7),
    "laprox": (32, "avg", 7),
    "laprox-cached": (32, "avg", 7),
    "criticalkv": (64, "avg", 5),
    "knorm": (32, None, 1),
    "tova": (1, None, 1),
    "streamingllm": (32, None, 1),
    "value-forms": (0, None, 1),
    "uniqueness": (8, None, 1),
}


def snap_mean(c, kh, w, kind, k):
    p = c["n"] - w
    a = window_attention(c, kh, w)[:, :, :p].mean(axis=1)  # [g, p]
    return pool(a, kind, k)


def base_name(name):
    """`<scorer>+lse`: the scorer with the window rows' LSE given (c["lse"]); `-w8`: with
    an 8-token window."""
    name = name[:-4] if name.endswith("+lse") else name
    return name[:-3] if name.endswith("-w8") else name


def cfg_of(name):
    """(window, pool kind, kernel) of a bench scorer name."""
    w, kind, k = CFG[base_name(name)]
    return (8 if "-w8" in name else w), kind, k


def score(c, name):
    hkv, g, n = c["hkv"], c["g"], c["n"]
    w, kind, k = cfg_of(name)
    name = base_name(name)
    p = n - w
    out = np.zeros((hkv, p), dtype=F32)
    if name in ("snapkv", "snapkv-kvpress"):
        for kh in range(hkv):
            out[kh] = snap_mean(c, kh, w, kind, k).mean(axis=0)
    elif name == "criticalkv":
        first = p // 20
        for kh in range(hkv):
            s = snap_mean(c, kh, w, kind, k).mean(axis=0)
            forced = np.argpartition(-s, first)[:first] if first > 0 else []
            o = (s + F32(1e-4)) * c["l1"][kh, :p]
            o[forced] = np.finfo(F32).max
            out[kh] = o
    elif name == "lava":
        for kh in range(hkv):
            cmax = np.abs(c["v"][kh, :p].astype(F32)).sum(axis=-1).max()
            out[kh] = snap_mean(c, kh, w, kind, k).max(axis=0) * cmax
    elif name in ("laprox", "laprox-cached"):
        for kh in range(hkv):
            a = window_attention(c, kh, w)[:, :, :p]
            att = pool(np.sqrt(np.einsum("gjp,gjp->gp", a, a)), kind, k)  # [g, p]
            if name == "laprox":
                v = c["v"][kh, :p].astype(F32)
                f = np.stack([np.einsum("pd,pd->p", v @ c["gram"][kh, b], v) for b in range(g)])
            else:
                f = c["forms"][kh, :, :p]
            out[kh] = (att * np.sqrt(np.maximum(f, 0))).sum(axis=0)
    elif name == "tova":
        acc = np.zeros(p, dtype=F32)
        for kh in range(hkv):
            acc += window_attention(c, kh, 1)[:, 0, :p].sum(axis=0)
        out[:] = acc / F32(c["hq"])
    elif name == "knorm":
        for kh in range(hkv):
            kk = c["k"][kh, :p].astype(F32)
            out[kh] = -np.sqrt(np.einsum("pd,pd->p", kk, kk))
    elif name == "streamingllm":
        out[:, :4] = 1.0
    elif name == "uniqueness":
        # design §3b: per KV head, the 4th largest over j != i of min(cos k, cos v) over all N
        # tokens (-1 where fewer), (1 - r)^24 clipped at 0 and 0 from r >= 0.5 on, then each prefix token lends
        # its whole score to the 6 before it and 0.729^(j-6) of it to the j-th before, j <= 10
        for kh in range(hkv):
            k = c["k"][kh].astype(F32)
            v = c["v"][kh].astype(F32)
            for x in (k, v):
                nrm = np.sqrt(np.einsum("nd,nd->n", x, x))
                x /= np.where(nrm > 0, nrm, 1)[:, None]
            r = np.empty(n, F32)
            blk = 1024  # row blocks: never an [N, N] matrix
            for r0 in range(0, n, blk):
                r1 = min(n, r0 + blk)
                m = np.minimum(k[r0:r1] @ k.T, v[r0:r1] @ v.T)
                m[np.arange(r1 - r0), np.arange(r0, r1)] = -np.inf
                m = np.concatenate([m, np.full((r1 - r0, 4), F32(-1))], axis=1)
                r[r0:r1] = -np.partition(-m, 3, axis=1)[:, 3]
            u = np.where(r >= F32(0.5), F32(0), np.maximum(F32(1) - r, 0) ** 24)[:p]  # lending stays inside the prefix
            s, f = u.copy(), F32(1)
            for j in range(1, 11):
                if j > 6:
                    f = F32(f * F32(0.729))
                if p > j:
                    s[:-j] = np.maximum(s[:-j], f * u[j:])
            out[kh] = s
    elif name == "value-forms":
        # LaProx's value forms v·G_a·vᵀ for every token: [Hkv][g][N], one GEMM per block
        out = np.empty((hkv, g, n), dtype=F32)
        for kh in range(hkv):
            v = c["v"][kh].astype(F32)
            for b in range(g):
                out[kh, b] = np.einsum("nd,nd->n", v @ c["gram"][kh, b], v)
        return out.reshape(hkv, g * n)
    else:
        raise ValueError(name)
    return out


def flops(c, name):
    """Useful FLOPs (see the table notes): Q·Kᵀ once, plus the value quadratic forms."""
    hq, hkv, dk, n = c["hq"], c["hkv"], c["dk"], c["n"]
    w = cfg_of(name)[0]
    name = base_name(name)
    p = n - w
    if name in ("knorm",):
        return 2 * hkv * p * dk, 0
    if name == "streamingllm":
        return 0, 0
    if name == "value-forms":
        return hq * n * (2 * dk * dk + 2 * dk), 0
    if name == "uniqueness":
        # one key and one value dot product per unordered pair of tokens (dv = dk here)
        return hkv * n * (n - 1) * 2 * dk, 0
    f = 2 * hq * w * n * dk
    if name == "laprox":
        f += hq * p * (2 * dk * dk + 2 * dk)
    return f, hq * w * n


# ---------------------------------------------------------------------------------------


def timed(fn, reps):
    """(min wall s, min thread-CPU s, result)."""
    best, cbest, out = float("inf"), float("inf"), None
    for _ in range(reps):
        c = time.thread_time()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        cbest = min(cbest, time.thread_time() - c)
    return best, cbest, out


def sgemm_rate(reps=7):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024), dtype=F32)
    b = rng.standard_normal((1024, 1024), dtype=F32)
    a @ b
    t, ct, _ = timed(lambda: a @ b, reps)
    return 2 * 1024**3 / t / 1e9, 2 * 1024**3 / ct / 1e9


def read_rate(c, reps):
    """Bytes/s of reading the layer's key buffer once, in its dtype, with numpy: the fastest
    of a few one-pass reductions over its raw bytes (no conversion). The bound of KNorm and
    TOVA is the faster of this and `bench_cpu`'s own read loops (`READ` lines: AVX-512 /
    AVX2 OR-sweeps, which read faster than numpy here)."""
    k = c["k"]
    best = min(
        timed(lambda: k.view(np.uint8).max(), reps)[1],
        timed(lambda: np.add.reduce(k.view(np.uint64), axis=None), reps)[1],
    )
    return k.nbytes / best


def sgemv_rate(c, reps):
    """FLOP/s of TOVA's Q·Kᵀ as numpy does it, on f32 keys: one sgemv (1 BLAS thread) per
    query head, its KV head's [N, dk] keys times its last query (2·Hq·N·dk FLOPs)."""
    k32 = c["k"].astype(F32)
    q = c["q"][:, -1, :].astype(F32)
    g = c["g"]

    def run():
        for h in range(c["hq"]):
            k32[h // g] @ q[h]

    run()
    return 2 * c["hq"] * c["n"] * c["dk"] / timed(run, reps)[1]


def bound_shares(c, name, t, bounds):
    """The row's share of its memory bound (TOVA, KNorm): the sgemv rate (TOVA) and the
    read rate of the keys it reads (both), as text; '–' for other rows."""
    rd, gv = bounds
    es = c["k"].itemsize
    if name == "tova":
        gf = 2 * c["hq"] * c["n"] * c["dk"] / t
        return f"sgemv {100 * gf / gv:.0f}% · read {100 * c['k'].nbytes / t / rd:.0f}%"
    if name == "knorm":
        p = c["n"] - cfg_of(name)[0]
        return f"read {100 * c['hkv'] * p * c['dk'] * es / t / rd:.0f}%"
    return "–"


def rel_diff(ours, ref):
    big = np.finfo(F32).max
    worst = 0.0
    for h in range(ref.shape[0]):
        o, r = ours[h], ref[h]
        keep = (o < big) & (r < big)
        if (o == big).sum() != (r == big).sum():
            return float("inf")
        scale = np.abs(r[keep]).max() if keep.any() else 1.0
        if scale == 0:
            scale = 1.0
        worst = max(worst, float(np.abs(o[keep].astype(np.float64) - r[keep]).max() / scale))
    return worst


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def case_order(name):
    shape, n = name.rsplit("-", 1)
    return (shape != "smol", int(n))


def run_rust(binary, case_dir, reps, scorers):
    """Our times per scorer, and the bytes/s of `bench_cpu`'s read of the key buffer (None
    when not run: it runs, first, with TOVA or KNorm)."""
    cmd = [binary, "--load", case_dir, "--reps", str(reps)]
    if scorers:
        if {"tova", "knorm"} & set(scorers.split(",")):
            scorers = "read," + scorers
        cmd += ["--scorers", scorers]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res, read = {}, None
    for line in out.splitlines():
        if line.startswith("RESULT\t"):
            f = line.split("\t")
            _, case, name, w, tmin, _tmed, cmin = f[:7]
            # the kernel build that ran (AVX-512, AVX2, NEON, portable); older binaries: "?"
            res[name] = (int(w), float(tmin), float(cmin), f[7] if len(f) > 7 else "?")
        elif line.startswith("READ\t"):
            _, case, nbytes, cmin, kind = line.split("\t")
            read = (int(nbytes) / float(cmin), kind)
    return res, read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", help="directory of cases dumped by bench_cpu --dump")
    ap.add_argument("--rust", required=True, help="the bench_cpu binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="Rust runs per scorer per round")
    ap.add_argument("--np-reps", type=int, default=3, help="numpy runs per scorer per round")
    ap.add_argument("--scorers", default="", help="comma-separated subset")
    args = ap.parse_args()

    cases = sorted(
        (d for d in os.listdir(args.dir) if os.path.exists(os.path.join(args.dir, d, "meta.txt"))),
        key=case_order,
    )
    best = {}  # (case, scorer) -> dict of minima
    errs = {}
    bounds = {}  # case -> (read bytes/s, sgemv FLOP/s), best round
    gemm, gemm_wall = 0.0, 0.0
    for r in range(args.rounds):
        gw, gc = sgemm_rate()
        gemm, gemm_wall = max(gemm, gc), max(gemm_wall, gw)
        print(f"round {r + 1}/{args.rounds}: sgemm {gc:.1f} GFLOP/s (thread CPU), {gw:.1f} (wall)",
              flush=True)
        for case in cases:
            cdir = os.path.join(args.dir, case)
            rust, rrd = run_rust(args.rust, cdir, args.reps, args.scorers)
            c = load_case(cdir)
            if {"tova", "knorm"} & set(rust):
                nrd, gv = read_rate(c, max(5, args.np_reps)), sgemv_rate(c, max(5, args.np_reps))
                # the bound: the faster reader (ours: plain vector loops; numpy's reductions)
                rd = max(nrd, rrd[0] if rrd else 0.0)
                ob = bounds.get(case, (0.0, 0.0))
                bounds[case] = (max(ob[0], rd), max(ob[1], gv))
                ours = f"{rrd[0] / 1e9:.1f} GB/s ({rrd[1]})" if rrd else "not run"
                print(f"  {case:<12} bounds: read of the keys {rd / 1e9:.1f} GB/s (numpy "
                      f"{nrd / 1e9:.1f}, bench_cpu's loops {ours}), sgemv {gv / 1e9:.1f} GFLOP/s",
                      flush=True)
            for name, (w, tmin, cmin, kern) in rust.items():
                # `+lse` rows: numpy gets the rows' LSE too, made here, outside the timing
                cc = dict(c, lse={w: row_lse(c, w)}) if name.endswith("+lse") else c
                t_np, c_np, ref = timed(lambda: score(cc, name), args.np_reps)
                if r == 0:
                    ours = np.fromfile(os.path.join(cdir, f"scores_{name}.bin"), dtype=F32)
                    errs[(case, name)] = rel_diff(ours.reshape(c["hkv"], -1), ref)
                b = best.setdefault((case, name), dict(w=w, c=c, rw=1e9, rc=1e9, nw=1e9, nc=1e9,
                                                       k=kern))
                b.update(rw=min(b["rw"], tmin), rc=min(b["rc"], cmin),
                         nw=min(b["nw"], t_np), nc=min(b["nc"], c_np), c=c)
                print(
                    f"  {case:<12} {name:<15} w={w:<3} [{kern}] rust cpu {cmin * 1e3:9.2f} ms (wall {tmin * 1e3:9.2f})"
                    f"  numpy cpu {c_np * 1e3:9.2f} ms (wall {t_np * 1e3:9.2f})"
                    f"  x{c_np / cmin:6.2f}  max rel diff {errs[(case, name)]:.1e}",
                    flush=True,
                )
            del c

    print()
    print(f"CPU: {cpu_name()}, one thread. Shared machine: every time is the minimum thread CPU "
          f"time over {args.rounds} rounds × the runs per round, Rust and numpy alternating case "
          f"by case; wall-clock minimum beside. Single-core sgemm (numpy matmul 1024x1024 f32, "
          f"1 BLAS thread, best round): **{gemm:.1f} GFLOP/s**.")
    for case in sorted(bounds, key=case_order):
        rd, gv = bounds[case]
        print(f"Bounds, {case} (best round): read of the key buffer {rd / 1e9:.1f} GB/s, "
              f"TOVA-shaped sgemv {gv / 1e9:.1f} GFLOP/s.")
    print()
    print("| model shape | N | scorer | kernel | w | time (ms) | wall (ms) | Mtok/s | GFLOP/s "
          "| % of sgemm | % of bound | Gexp/s | numpy (ms) | vs numpy | max rel diff |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (case, name), b in sorted(best.items(), key=lambda kv: (case_order(kv[0][0]),)):
        c, t = b["c"], b["rc"]
        f, nexp = flops(c, name)
        shape = "SmolLM2 f32" if c["shape"] == "smol" else "Llama-3-8B f16"
        gf = f / t / 1e9
        gfs = f"{gf:.1f}" if f else "–"
        pct = f"{100 * gf / gemm:.0f}%" if f else "–"
        gexp = f"{nexp / t / 1e9:.2f}" if nexp else "–"
        bnd = bound_shares(c, name, t, bounds[case]) if case in bounds else "–"
        print(f"| {shape} | {c['n'] // 1024}k | {name} | {b['k']} | {b['w']} | {t * 1e3:.2f} | {b['rw'] * 1e3:.2f} "
              f"| {c['n'] / t / 1e6:.2f} | {gfs} | {pct} | {bnd} | {gexp} | {b['nc'] * 1e3:.2f} "
              f"| {b['nc'] / t:.2f}× | {errs[(case, name)]:.0e} |")
    print()
    print("kernel: the kernel build the scorer ran on (AVX-512, AVX2, NEON or portable; "
          "`KVEVICT_NO_AVX512=1` / `KVEVICT_PORTABLE=1` choose the others). "
          "time: thread CPU time of one `score_layer` call (one layer, one thread); numpy: the "
          "same for the numpy version. Mtok/s: N / time. GFLOP/s counts useful work only: "
          "2·Hq·w·N·dk for one Q·Kᵀ (the core computes it once when a KV group's g·w·N·4 bytes "
          "of logits fit 16 MiB, else twice: row max/denominator, then column statistics), plus 2·dv²+2·dv per query head and prefix token for LaProx's "
          "value forms v·G·vᵀ when computed in the timed region (`laprox`; `laprox-cached` "
          "reads cached forms; the core does about half those multiply-adds, using G's "
          "symmetry). `value-forms`: `compute_value_forms` over all N tokens of the layer "
          "(the cache an engine fills as tokens arrive), counted the same way. `uniqueness`: "
          "N·(N−1)·(dk+dv) per KV head, one key and one value dot product per unordered pair "
          "of tokens (the core skips value dots it can prove useless; numpy computes both "
          "full N×N products), N <= 8192 only. `+lse` rows: the scorer given the window rows' log-sum-exp (flash "
          "attention's softmax_lse; here computed outside the timed region, by "
          "`window_row_lse` for Rust and by numpy for numpy, each side given its own): "
          "one Q·Kᵀ over the prefix keys only, A = exp(z − lse), no row max/denominator, "
          "on both sides; GFLOP/s still counts 2·Hq·w·N·dk. Softmax exps (Hq·w·N; the core computes two per logit without the LSE, one with it) are counted in Gexp/s, not in "
          "GFLOP/s; KNorm counts 2·dk per key. % of bound (TOVA and KNorm, which read every key "
          "once for about 2 FLOPs per element, so memory, not the sgemm rate, bounds them): "
          "the row's share of the rate of reading the key bytes it reads, in their dtype "
          "(the faster of bench_cpu's plain AVX-512/AVX2 read loops and numpy's one-pass "
          "reductions over the raw key buffer, same run), and for TOVA "
          "of numpy's sgemv rate on the same keys as f32 (one sgemv per query head, its KV "
          "head's keys times its last query: the same useful FLOPs). vs numpy: numpy time / our time. max rel diff: "
          "largest |ours − numpy| over the prefix, relative to the KV head's largest |score|.")


if __name__ == "__main__":
    main()
