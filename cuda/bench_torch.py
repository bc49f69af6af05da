"""PyTorch implementation of the benchmark in cuda/bench.cu (same math, same shapes):
Llama-3-8B-shaped cache (L=32, Hq=32, Hkv=8, d=128, bf16, w=32), LaProx scores per
layer (softmax over all visible keys in f32, L2 norm of the window's attention column,
avg-pool 7, value-output norms v G_h vᵀ, group sum), per-layer normalisation, one
global top-K over the model, compaction of K and V (kept rows first, order kept).

Also measures torch's bf16 matmul rate (8192³) and prints it as `MM_TFLOPS x`, which
cuda/check.sh passes to the CUDA benchmark as a second ceiling. Each stage the CUDA
benchmark times is timed here too (`TORCH_STAGE n= name= ms=` lines, the bench's stage
names): cuda/check.sh prints the ratio of the two. The uniqueness scorer (design §3b: 4th
largest min(cos k, cos v) over the other tokens, cutoff 0.5, power 8, backward lending) runs
on layer 0 only and at N <= 32k, as in the bench.
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


def window_l2(q, k, w, grp):
    # q [Hq, w, d], k [Hkv, N, d] bf16 -> the window's attention column L2 norms [Hq, P]
    hq, _, d = q.shape
    n = k.shape[1]
    p = n - w
    kk = k.repeat_interleave(grp, 0)  # [Hq, N, d]
    z = torch.matmul(q.float(), kk.float().transpose(1, 2)) / math.sqrt(d)  # [Hq, w, N]
    j = torch.arange(w, device=q.device)[:, None]
    i = torch.arange(n, device=q.device)[None, :]
    z = z.masked_fill(i > p + j, float("-inf"))
    a = torch.softmax(z, dim=-1)[:, :, :p]
    return a.pow(2).sum(1).sqrt()


def value_norms(v, g_mat, p, grp):
    # v [Hkv, N, d], g_mat [Hq, d, d] bf16 -> sqrt(v G_h vᵀ) [Hq, P]
    vp = v[:, :p].repeat_interleave(grp, 0)  # [Hq, P, d]
    x = torch.bmm(vp, g_mat)  # bf16 tensor cores
    return (x.float() * vp.float()).sum(-1).clamp_min(0).sqrt()


def combine(l2, vo, grp):
    pooled = F.avg_pool1d(l2[:, None, :], 7, 1, 3)[:, 0, :]
    return (pooled * vo).view(-1, grp, l2.shape[1]).sum(1)  # [Hkv, P]


def laprox_layer(q, k, v, g_mat, w, grp):
    # q [Hq, w, d], k/v [Hkv, N, d] bf16, g_mat [Hq, d, d] bf16 -> [Hkv, P] f32
    p = k.shape[1] - w
    return combine(window_l2(q, k, w, grp), value_norms(v, g_mat, p, grp), grp)


def uniqueness(k, v, p, chunk=2048):
    # k/v [Hkv, N, d] -> [Hkv, P]: r = 4th largest min(cos k, cos v) over j != i,
    # u = max(0, 1 - r)^24 (0 where r >= 0.5), out[i] = max_{j<=10, i+j<P} c_j u[i+j],
    # c_j = 1 for j <= 6, 0.729^(j-6) beyond
    hkv, n, _ = k.shape
    ku = F.normalize(k.float(), dim=-1)
    vu = F.normalize(v.float(), dim=-1)
    r = torch.empty(hkv, n, device=k.device)
    for h in range(hkv):
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            s = torch.minimum(ku[h, c0:c1] @ ku[h].T, vu[h, c0:c1] @ vu[h].T)
            s[torch.arange(c1 - c0, device=k.device), torch.arange(c0, c1, device=k.device)] = -1.0
            r[h, c0:c1] = torch.topk(s, 4, dim=-1).values[:, 3]
    u = torch.where(r >= 0.5, torch.zeros_like(r), (1.0 - r).clamp_min(0.0).pow(24))[:, :p]
    out = u.clone()
    for j in range(1, 11):
        out[:, : p - j] = torch.maximum(out[:, : p - j], u[:, j:] * (0.729 ** max(j - 6, 0)))
    return out


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
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 products in f32, as the kernels
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

        # the stages of cuda/bench.cu, each over every layer (uniqueness: layer 0)
        l2 = [window_l2(Q[l], K[l], w, grp) for l in range(L)]
        vo = [value_norms(V[l], G[l], p, grp) for l in range(L)]
        scores = torch.stack([combine(l2[l], vo[l], grp) for l in range(L)])

        def select():
            sums = scores.view(L, -1).double().sum(1)
            key = (scores.double() / sums[:, None, None]).float().view(-1)
            return torch.topk(key, keep, sorted=False).indices

        top = select()

        def compact():
            mask = torch.zeros(L * hkv * p, dtype=torch.bool, device="cuda")
            mask[top] = True
            order = torch.argsort((~mask.view(L, hkv, p)).to(torch.int8), dim=-1, stable=True)
            for l in range(L):
                idx = order[l][:, :, None].expand(-1, -1, d)
                K[l, :, :p] = torch.gather(K[l, :, :p], 1, idx)
                V[l, :, :p] = torch.gather(V[l, :, :p], 1, idx)

        stages = [
            ("window", lambda: [window_l2(Q[l], K[l], w, grp) for l in range(L)]),
            ("vonorm", lambda: [value_norms(V[l], G[l], p, grp) for l in range(L)]),
            ("combine", lambda: [combine(l2[l], vo[l], grp) for l in range(L)]),
            ("select", select),
            ("compact", compact),
        ]
        if n <= 32768:
            stages.append(("uniqueness", lambda: uniqueness(K[0], V[0], p)))
        for name, fn in stages:
            sms = time_ms(fn, args.reps)
            print(f"torch N={n}: {name} {sms:.3f} ms")
            print(f"TORCH_STAGE n={n} name={name} ms={sms:.4f}")
        del l2, vo, scores
        ms = time_ms(run, args.reps)
        print(f"torch N={n}: score + global select + compact {ms:.3f} ms (median of {args.reps})")
        print(f"TORCH n={n} ms={ms:.3f}")
        print(f"TORCH_STAGE n={n} name=whole ms={ms:.4f}")
        del K, V, Q, G
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
