"""PyTorch implementation of the benchmark in cuda/bench.cu (same math, same shapes):
Llama-3-8B-shaped cache (L=32, Hq=32, Hkv=8, d=128, bf16, w=32), LaProx scores per
layer (softmax over all visible keys in f32, L2 norm of the window's attention column,
avg-pool 7, value-output norms v G_h vᵀ, group sum), per-layer normalisation, one
global top-K over the model, compaction of K and V (kept rows first, order kept).

Also measures torch's bf16 matmul rate (8192³) and prints it as `MM_TFLOPS x`, which
cuda/check.sh passes to the CUDA benchmark as a second ceiling.
Prints "torch not available" and exits 0 when torch or a GPU is missing.
"""
import argparse
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception:  # noqa: BLE001
    print("torch not available")
    sys.exit(0)


def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def time_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return med(out)


def matmul_rate():
    n = 8192
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    ms = time_ms(lambda: a @ b, 8)
    return 2 * n**3 / (ms * 1e-3)


def laprox_layer(q, k, v, g_mat, w, grp):
    # q [Hq, w, d], k/v [Hkv, N, d] bf16, g_mat [Hq, d, d] bf16 -> [Hkv, P] f32
    hq, _, d = q.shape
    n = k.shape[1]
    p = n - w
    kk = k.repeat_interleave(grp, 0)  # [Hq, N, d]
    z = torch.matmul(q.float(), kk.float().transpose(1, 2)) / math.sqrt(d)  # [Hq, w, N]
    j = torch.arange(w, device=q.device)[:, None]
    i = torch.arange(n, device=q.device)[None, :]
    z = z.masked_fill(i > p + j, float("-inf"))
    a = torch.softmax(z, dim=-1)[:, :, :p]
    l2 = a.pow(2).sum(1).sqrt()  # [Hq, P]
    pooled = F.avg_pool1d(l2[:, None, :], 7, 1, 3)[:, 0, :]
    vp = v[:, :p].repeat_interleave(grp, 0)  # [Hq, P, d]
    x = torch.bmm(vp, g_mat)  # bf16 tensor cores
    vo = (x.float() * vp.float()).sum(-1).clamp_min(0).sqrt()  # [Hq, P]
    return (pooled * vo).view(-1, grp, p).sum(1)  # [Hkv, P]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="32768,131072")
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mm-only", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch not available (no CUDA device)")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    rate = matmul_rate()
    print(f"MM_TFLOPS {rate / 1e12:.1f}")
    if args.mm_only:
        return
    L, hq, hkv, d, w = 32, 32, 8, 128, 32
    grp = hq // hkv
    for n in [int(x) for x in args.n.split(",")]:
        p = n - w
        gen = torch.Generator(device="cuda").manual_seed(n)
        K = (torch.rand(L, hkv, n, d, device="cuda", generator=gen) * 4 - 2).bfloat16()
        V = (torch.rand(L, hkv, n, d, device="cuda", generator=gen) * 2 - 1).bfloat16()
        Q = (torch.rand(L, hq, w, d, device="cuda", generator=gen) * 4 - 2).bfloat16()
        G = ((torch.rand(L, hq, d, d, device="cuda", generator=gen) * 2 - 1) * 0.05
             + torch.eye(d, device="cuda")).bfloat16()  # Gram-like: v G vᵀ > 0
        keep = int(args.keep * p) * L * hkv

        def run():
            scores = torch.empty(L, hkv, p, device="cuda")
            for l in range(L):
                scores[l] = laprox_layer(Q[l], K[l], V[l], G[l], w, grp)
            sums = scores.view(L, -1).double().sum(1)
            key = (scores.double() / sums[:, None, None]).float().view(-1)
            top = torch.topk(key, keep, sorted=False).indices
            mask = torch.zeros(L * hkv * p, dtype=torch.bool, device="cuda")
            mask[top] = True
            mask = mask.view(L, hkv, p)
            order = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)  # kept first
            for l in range(L):
                idx = order[l][:, :, None].expand(-1, -1, d)
                K[l, :, :p] = torch.gather(K[l, :, :p], 1, idx)
                V[l, :, :p] = torch.gather(V[l, :, :p], 1, idx)
            return mask

        ms = time_ms(run, args.reps)
        print(f"torch N={n}: score + global select + compact {ms:.3f} ms (median of {args.reps})")
        print(f"TORCH n={n} ms={ms:.3f}")
        del K, V, Q, G
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
