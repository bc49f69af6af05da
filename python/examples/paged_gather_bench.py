"""Time of paged_gather (K and V of one layer, f16, blocks of 16) against LaProx-span's
score_layer on the gathered views, at the SmolLM2 and Llama-3-8B shapes (docs/engines.md).

    PYTHONPATH=python python3 python/examples/paged_gather_bench.py
"""
import time, numpy as np, kvevict as kve
rng = np.random.default_rng(0)
for (name, hq, hkv, d, n) in (("SmolLM2", 9, 3, 64, 4096), ("Llama-3-8B", 32, 8, 128, 8192), ("Llama-3-8B", 32, 8, 128, 32768)):
    bs = 16
    nb = n // bs + 8
    table = rng.permutation(nb)[: n // bs].astype(np.int32)
    reps = 5
    tgs = {}
    for kind, shape in (("nhd-kv-inner", (nb, 2, bs, hkv, d)), ("hnd-kv-inner", (nb, 2, hkv, bs, d))):
        pool = rng.standard_normal(shape).astype(np.float16)
        (kc, lk), (vc, lv) = (kve.pool_tensor(pool, kind, kv=0), kve.pool_tensor(pool, kind, kv=1))
        def g():
            return kve.paged_gather(kc, table, n, layout=lk), kve.paged_gather(vc, table, n, layout=lv)
        g()
        t = time.perf_counter()
        for _ in range(reps): k, v = g()
        tgs[kind] = (time.perf_counter() - t) / reps
    q = rng.standard_normal((hq, 8, d)).astype(np.float32)
    wo = (rng.standard_normal((hq, d, hq * d)) / np.sqrt(hq * d)).astype(np.float32)
    gram = kve.compute_gram(wo, hkv)
    p = kve.ScoreParams("laprox-span")
    kve.score_layer(p, q, k, v, gram=gram)
    t = time.perf_counter()
    for _ in range(reps): kve.score_layer(p, q, k, v, gram=gram)
    ts = (time.perf_counter() - t) / reps
    mb = 2 * n * hkv * d * 2 / 2**20
    for kind, tg in tgs.items():
        print(f"{name} n={n} bs={bs} f16 {kind}: gather K+V {tg*1e3:.2f} ms ({mb:.0f} MiB, "
              f"{mb/1024/tg:.1f} GiB/s read), laprox-span score_layer {ts*1e3:.2f} ms, gather/score {tg/ts:.2f}")
