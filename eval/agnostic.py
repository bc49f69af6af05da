"""Question-agnostic signals (issue 11, design §3b): score the context's keys with queries that
do not contain the question, then select with the library.

Each *signal* is a stream of queries run after (or over) the context with the full cache, and
the per-key attention statistics they produce, per layer and query head, over the N context
keys: max, mean and L2 norm of the attention column (the library's query-stream statistics).

- `recon`: KVzip's reconstruction: "Repeat the previous context:" then the context again,
  fed after the context (about one extra prefill).
- `prefill`: every context position's own query over its causal prefix (H2O-style
  accumulation; needs the prefill's queries, no extra pass for an engine that keeps them).
- `probe`: a short generic request after the context ("what is important?"), no question.

Statistics are computed once per prompt and cached in eval/out/cache/agnostic/.

    python eval/agnostic.py --signals recon,prefill,probe --ratios 0.1,0.05 --prompts 10
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import captures  # noqa: E402
import methods  # noqa: E402
import tasks  # noqa: E402
from engine import CACHE_DIR, OUT_DIR, KVCache, Model  # noqa: E402
from metrics import emit_table, evaluate_selections  # noqa: E402
from needle import CONTEXT_TOKENS, answer_correct  # noqa: E402

RECON_PROMPT = "\n\nRepeat the previous context exactly.\n"
PROBE_PROMPT = "\n\nWhat are the most important details in the text above?\n"
STATS_VERSION = 2


def column_stats(q, k, first_pos, n_ctx, diag=False):
    """q [Hq, T, hd] queries at positions first_pos.., k [Hkv, S, hd] keys at 0..S-1 (causal).
    Returns max, sum and sum of squares of the softmax attention over keys 0..n_ctx-1,
    each [Hq, n_ctx] (float64 accumulators), and with `diag` (q = the context repeated) the
    attention of query j (reading token j) to key j + 1, the token it must copy next."""
    hq, t, hd = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    scale = np.float32(1.0 / np.sqrt(hd))
    mx = np.zeros((hq, n_ctx))
    sm = np.zeros((hq, n_ctx))
    sq = np.zeros((hq, n_ctx))
    dg = np.zeros((hq, n_ctx)) if diag else None
    chunk = 256
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        pos = first_pos + np.arange(c0, c1)
        s_len = int(pos[-1]) + 1
        for h in range(hq):
            z = (q[h, c0:c1] @ k[h // g, :s_len].T) * scale
            z = np.where(np.arange(s_len)[None, :] <= pos[:, None], z, -np.inf)
            z = z - z.max(axis=1, keepdims=True)
            a = np.exp(z)
            a /= a.sum(axis=1, keepdims=True)
            m = min(s_len, n_ctx)
            a = a[:, :m].astype(np.float64)
            mx[h, :m] = np.maximum(mx[h, :m], a.max(axis=0))
            sm[h, :m] += a.sum(axis=0)
            sq[h, :m] += (a * a).sum(axis=0)
            if diag:
                j = np.arange(c0, c1)
                ok = j + 1 < n_ctx
                dg[h, j[ok] + 1] = a[np.arange(c1 - c0)[ok], j[ok] + 1]
    return mx, sm, sq, dg


def signal_stats(model, cap, signal):
    """{'max','sum','sq'} each [L, Hq, N] float32 (plus 'diag' for recon: the attention that
    the repeat's query predicting original token i pays to token i), and the extra tokens'
    count. recon statistics use the repeated context's queries only (not the instruction's)."""
    ids = [int(t) for t in cap.a["prefill_ids"]]
    n = len(ids)
    h = hashlib.sha1(np.asarray(ids, np.int64).tobytes())
    h.update(f"{signal}:{STATS_VERSION}:{RECON_PROMPT}:{PROBE_PROMPT}".encode())
    path = os.path.join(CACHE_DIR, "agnostic", f"{signal}-{h.hexdigest()[:16]}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    t0 = time.time()
    skip = 0
    if signal == "prefill":
        cache = KVCache(model.n_layers)
        _, q = model.forward(ids, cache, capture_q=n)
        first = 0
        extra = 0
    else:
        instr = model.tokenizer.encode(RECON_PROMPT if signal == "recon" else PROBE_PROMPT)
        extra_ids = instr + ids if signal == "recon" else instr
        skip = len(instr) if signal == "recon" else 0
        cache = KVCache.from_arrays(cap.keys, cap.values)
        _, q = model.forward(extra_ids, cache, capture_q=len(extra_ids))
        first = n
        extra = len(extra_ids)
    keys = cache.k
    t_fwd = time.time() - t0
    L, hq = model.n_layers, model.n_heads
    names = ("max", "sum", "sq", "diag") if signal == "recon" else ("max", "sum", "sq")
    out = {k: np.zeros((L, hq, n), np.float32) for k in names}
    for l in range(L):
        mx, sm, sq, dg = column_stats(q[l][:, skip:], keys[l], first + skip, n, diag=signal == "recon")
        out["max"][l], out["sum"][l], out["sq"][l] = mx, sm, sq
        if dg is not None:
            out["diag"][l] = dg
    out["extra_tokens"] = np.asarray(extra)
    out["t_forward"] = np.asarray(t_fwd)
    out["t_stats"] = np.asarray(time.time() - t0 - t_fwd)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, **out)
    return out


def unit_keys_values(cap):
    """The captured keys and values as f32 unit vectors, [L, Hkv, N, d] each."""
    K = cap.keys.astype(np.float32)
    V = cap.values.astype(np.float32)
    return K / np.linalg.norm(K, axis=3, keepdims=True), V / np.linalg.norm(V, axis=3, keepdims=True)


def redundancy(cap, mode="min", stride=1, kth=1, horizon=0):
    """[L, Hkv, N]: for each key, the largest similarity to another cached token, where the
    similarity of i and j is min(cos(k_i, k_j), cos(v_i, v_j)) ("min") or the key cosine
    alone ("k"); candidates j are every `stride`-th position. 1 - redundancy is the score:
    a token with a near-duplicate key AND value elsewhere can go, attention to it would
    find the twin and read nearly the same value. `horizon` > 0: twins only among the
    tokens at most `horizon` positions away (linear cost in N)."""
    memo = methods._SCORES.setdefault(cap, {})
    key = ("redundancy", mode, stride, kth, horizon)
    if key not in memo:
        kn, vn = unit_keys_values(cap)
        L, H, n, _ = kn.shape
        cand = np.arange(0, n, stride)
        out = np.empty((L, H, n), np.float32)
        for l in range(L):
            for h in range(H):
                c = kn[l, h] @ kn[l, h, cand].T
                if mode.startswith("min"):
                    c = np.minimum(c, vn[l, h] @ vn[l, h, cand].T)
                if mode[3:]:  # minK: a twin must follow twins of the K-1 previous tokens too
                    assert stride == 1
                    c0 = c.copy()
                    for t in range(1, int(mode[3:])):
                        c[t:, t:] = np.minimum(c[t:, t:], c0[:-t, :-t])
                c[cand, np.arange(len(cand))] = -1.0
                if horizon:
                    c[np.abs(np.arange(n)[:, None] - cand[None, :]) > horizon] = -1.0
                # the kth most similar other token: redundant only with >= kth twins
                out[l, h] = c.max(axis=1) if kth == 1 else -np.partition(-c, kth - 1, axis=1)[:, kth - 1]
        memo[key] = out
    return memo[key]


def make_redundancy(mode="min", stride=1, post_pool=("forward", 8, 0.9), granularity="token", allocator="global",
                    power=1.0, back=0, decay=0.9, kth=1, clamp=False, sink=None, horizon=0, libsel=False, cutoff=None):
    """libsel: the library's uniqueness selection (laprox-span's: forward 9 / 1.0, the sink
    lending nothing) instead of the post_pool / granularity / allocator given."""
    def select(cap, keep_ratio, window):
        red = redundancy(cap, mode, stride, kth, horizon)
        s = np.clip(1.0 - red, 0, 1 if clamp else None) ** power
        if cutoff is not None:  # redundant at or past the cutoff: no score at all
            s[red >= cutoff] = 0.0
        if sink == "zero":
            s[:, :, 0] = 0
        elif sink == "cap":
            s[:, :, 0] = np.minimum(s[:, :, 0], s[:, :, 1:].max(axis=2))
        s0 = s.copy()
        for j in range(1, back + 1):  # a unique token lends score to the j tokens before it
            s[:, :, :-j] = np.maximum(s[:, :, :-j], decay ** j * s0[:, :, j:])
        s = s[:, :, : cap.n - window]
        b = methods.head_budget(cap.n, keep_ratio, window) - window
        if libsel:
            return methods.library_select(cap, np.ascontiguousarray(s, np.float32), b, window, "uniqueness")
        return methods.library_select(cap, np.ascontiguousarray(s, np.float32), b, window, "laprox",
                                      allocator=allocator, granularity=granularity, post_pool=post_pool)
    return select


def surprisal(model, cap):
    """[N] -log p(token_i | tokens < i) from the full prefill (token 0: the largest of the
    rest). Needs the prefill's logits at every position (one LM-head product per token)."""
    ids = [int(t) for t in cap.a["prefill_ids"]]
    h = hashlib.sha1(np.asarray(ids, np.int64).tobytes())
    path = os.path.join(CACHE_DIR, "agnostic", f"surprisal-{h.hexdigest()[:16]}.npy")
    if not os.path.exists(path):
        logits, _ = model.forward(ids, KVCache(model.n_layers), all_logits=True)
        z = logits[:-1].astype(np.float64)
        m = z.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
        s = lse - z[np.arange(len(ids) - 1), ids[1:]]
        s = np.concatenate([[s.max()], s]).astype(np.float32)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, s)
    return np.load(path)


def lend_back_and_select(cap, s, keep_ratio, window, back, decay, granularity, post_pool):
    """Token scores `s` [L, Hkv, N] (changed in place), each lending decay^j of itself to the
    j <= `back` tokens before, selected globally over the prefix by the library."""
    s0 = s.copy()
    for j in range(1, back + 1):
        s[:, :, :-j] = np.maximum(s[:, :, :-j], decay ** j * s0[:, :, j:])
    s = s[:, :, : cap.n - window]
    b = methods.head_budget(cap.n, keep_ratio, window) - window
    return methods.library_select(cap, np.ascontiguousarray(s, np.float32), b, window, "laprox",
                                  allocator="global", granularity=granularity, post_pool=post_pool)


def make_surprisal(power=1.0, post_pool=("forward", 8, 0.9), mix=None, back=0, decay=0.9):
    """Prefill surprisal as every (layer, head)'s score, ** power; `mix` = w: times the
    uniqueness score (1 - redundancy)^8 ** w."""
    def select(cap, keep_ratio, window):
        s = np.broadcast_to(surprisal(MODEL[0], cap).astype(np.float64) ** power,
                            (cap.n_layers, cap.n_kv_heads, cap.n)).copy()
        if mix is not None:
            s = s * (np.maximum(1.0 - redundancy(cap, "min", 1), 0).astype(np.float64) ** 8) ** mix
        return lend_back_and_select(cap, s, keep_ratio, window, back, decay, "token", post_pool)
    return select


MODEL = []


def with_separators(inner, seps=(".",)):
    """`inner`'s selection with the sentence separators of the context kept too (SepLLM's
    observation: separator tokens hold their segment's summary), inside the same budget
    (the latest separators when they alone exceed it)."""
    def select(cap, keep_ratio, window):
        tok = MODEL[0].tokenizer
        ids = cap.a["prefill_ids"][: cap.n - window]
        sep = np.array([i for i, t in enumerate(ids) if tok.decode([int(t)]).strip() in seps], np.int64)
        total = methods.head_budget(cap.n, keep_ratio, window)
        sep = sep[len(sep) - min(len(sep), max(total - window, 0)):]
        r = max(total - len(sep), window + 1) / cap.n
        return methods._union(inner(cap, r, window), sep)
    return select


def twin_count(cap, beta):
    """[L, Hkv, N]: a soft count of each token's twins, sum over j != i of
    exp(beta (sim_ij - 1)) with sim = min(cos k, cos v): an exact twin counts 1, a far one 0."""
    memo = methods._SCORES.setdefault(cap, {})
    key = ("twin_count", beta)
    if key not in memo:
        kn, vn = unit_keys_values(cap)
        L, H, n, _ = kn.shape
        out = np.empty((L, H, n), np.float32)
        for l in range(L):
            for h in range(H):
                c = np.minimum(kn[l, h] @ kn[l, h].T, vn[l, h] @ vn[l, h].T)
                np.fill_diagonal(c, -np.inf)
                out[l, h] = np.exp(beta * (c - 1.0)).sum(axis=1)
        memo[key] = out
    return memo[key]


def make_soft(beta=20.0, power=1.0, back=1, decay=0.9, post_pool=("forward", 8, 0.9), granularity="token"):
    """Uniqueness from the soft twin count: (1 + count)^-power; a token with one twin scores
    1/2, with five 1/6 (KVzip's reconstruction attention splits over twins the same way)."""
    def select(cap, keep_ratio, window):
        s = (1.0 + twin_count(cap, beta)) ** -power
        return lend_back_and_select(cap, s, keep_ratio, window, back, decay, granularity, post_pool)
    return select


def make_combo(weight=1.0, stat="max", value=True):
    """uniqueness + weight x reconstruction (max attention x ||v Wo||), each normalised by its
    layer sum, then laprox-span's selection."""
    def select(cap, keep_ratio, window):
        u = np.maximum(1.0 - redundancy(cap, "min", 1), 0).astype(np.float64) ** 8
        u[:, :, :-1] = np.maximum(u[:, :, :-1], 0.9 * u[:, :, 1:])
        r = head_scores(cap, STATS[(id(cap), "recon")], stat, "sum", value).astype(np.float64)
        norm = lambda x: x / np.maximum(x.sum(axis=(1, 2), keepdims=True), 1e-30)
        s = (norm(u) + weight * norm(r))[:, :, : cap.n - window]
        b = methods.head_budget(cap.n, keep_ratio, window) - window
        return methods.library_select(cap, np.ascontiguousarray(s, np.float32), b, window, "laprox",
                                      allocator="global", granularity="token", post_pool=("forward", 8, 0.9))
    return select


def value_norms(cap):
    """||v_i Wo_h||_2 per layer, query head, token: [L, Hq, N] (the library's value forms)."""
    kve = methods.kvevict()
    memo = methods._SCORES.setdefault(cap, {})
    if "vnorm" not in memo:
        vs = []
        for l in range(cap.n_layers):
            g = kve.gram_cache.get(cap.wo, l, cap.n_heads, cap.n_kv_heads, False)
            f = kve.compute_value_forms(cap.values[l], g, False, hq=cap.n_heads)
            vs.append(np.sqrt(np.maximum(np.asarray(f, np.float64).reshape(cap.n_heads, cap.n), 0)))
        memo["vnorm"] = np.stack(vs).astype(np.float32)
    return memo["vnorm"]


def head_scores(cap, st, stat, gqa, value):
    """Per-query-head statistic -> [L, Hkv, N] scores."""
    if stat == "max":
        s = st["max"].astype(np.float64)
    elif stat == "mean":
        s = st["sum"].astype(np.float64)
    elif stat == "diag":
        s = st["diag"].astype(np.float64)
    elif stat == "peak":  # max relative to the column's total: one query needs it
        s = st["max"].astype(np.float64) ** 2 / np.maximum(st["sum"].astype(np.float64), 1e-30)
    elif stat == "l2":
        s = np.sqrt(st["sq"].astype(np.float64))
    else:
        raise ValueError(stat)
    if value:
        s = s * value_norms(cap)
    L, hq, n = s.shape
    g = hq // cap.n_kv_heads
    s = s.reshape(L, cap.n_kv_heads, g, n)
    s = s.max(axis=2) if gqa == "max" else s.sum(axis=2)
    return s.astype(np.float32)


def make_method(signal, stat="max", gqa="max", value=False, granularity="token", post_pool=("forward", 8, 0.9),
                allocator="global", sinks=0):
    """A methods-style select() from a signal's statistics through the library's selection."""
    def select(cap, keep_ratio, window):
        st = STATS[(id(cap), signal)]
        s = head_scores(cap, st, stat, gqa, value)[:, :, : cap.n - window].copy()
        b = methods.head_budget(cap.n, keep_ratio, window) - window
        reserved = np.arange(min(sinks, cap.n - window))
        if sinks:
            s[:, :, reserved] = 0
            b -= len(reserved)
        kept = methods.library_select(cap, s, b, window, "laprox", allocator=allocator, granularity=granularity,
                                      post_pool=post_pool)
        return methods._union(kept, reserved) if sinks else kept
    return select


STATS = {}

SPAN = ("forward", 8, 0.9)
NOPOOL = ("none", 1, 1.0)


def variants():
    v = {}
    for sig in ("recon", "prefill", "probe"):
        for stat in ("max", "mean", "l2", "diag", "peak"):
            v[f"{sig}-{stat}"] = (sig, make_method(sig, stat))
            v[f"{sig}-{stat}-v"] = (sig, make_method(sig, stat, gqa="sum", value=True))
            v[f"{sig}-{stat}-nopool"] = (sig, make_method(sig, stat, post_pool=NOPOOL))
            v[f"{sig}-{stat}-head"] = (sig, make_method(sig, stat, granularity="head", post_pool=SPAN))
            v[f"{sig}-{stat}-headkv"] = (sig, make_method(sig, stat, granularity="head", post_pool=NOPOOL,
                                                          allocator="uniform"))
    v["uniq"] = (None, make_redundancy())
    v["uniq-k"] = (None, make_redundancy("k"))
    v["uniq-nopool"] = (None, make_redundancy(post_pool=NOPOOL))
    v["uniq-f16"] = (None, make_redundancy(post_pool=("forward", 16, 0.9)))
    v["uniq-s4"] = (None, make_redundancy(stride=4))
    v["uniq-s16"] = (None, make_redundancy(stride=16))
    v["uniq-head"] = (None, make_redundancy(granularity="head"))
    for pw in (2, 4, 8, 16):
        v[f"uniq-p{pw}"] = (None, make_redundancy(power=float(pw)))
        v[f"uniq-p{pw}-s4"] = (None, make_redundancy(stride=4, power=float(pw)))
        v[f"uniq-p{pw}-head"] = (None, make_redundancy(granularity="head", power=float(pw)))
        v[f"uniq-p{pw}-nopool"] = (None, make_redundancy(post_pool=NOPOOL, power=float(pw)))
        for b in (1, 2, 4):
            v[f"uniq-p{pw}-b{b}"] = (None, make_redundancy(power=float(pw), back=b))
            for kk in (2, 3, 4, 6):
                v[f"uniq{kk}-p{pw}-b{b}"] = (None, make_redundancy(f"min{kk}", power=float(pw), back=b))
    for kth in (1, 2, 3, 4, 6):
        v[f"uniq-k{kth}"] = (None, make_redundancy(power=8.0, back=1, kth=kth))
        v[f"uniq-k{kth}-head"] = (None, make_redundancy(power=8.0, back=1, kth=kth, granularity="head"))
        v[f"uniq-k{kth}-f16"] = (None, make_redundancy(power=8.0, back=1, kth=kth, post_pool=("forward", 16, 0.9)))
        v[f"uniq-k{kth}-b4"] = (None, make_redundancy(power=8.0, back=4, kth=kth))
        v[f"uniq-k{kth}-b4-s0"] = (None, make_redundancy(power=8.0, back=4, kth=kth, sink="zero"))
        v[f"uniq-k{kth}-b4-scap"] = (None, make_redundancy(power=8.0, back=4, kth=kth, sink="cap"))
        v[f"uniq-k{kth}-b4-c"] = (None, make_redundancy(power=8.0, back=4, kth=kth, clamp=True))
        v[f"uniq-k{kth}-b1-c"] = (None, make_redundancy(power=8.0, back=1, kth=kth, clamp=True))
        for cut in (0.4, 0.5, 0.6, 0.7):
            v[f"uniq-k{kth}-lib-t{int(cut * 100)}"] = (None, make_redundancy(power=8.0, back=4, kth=kth, clamp=True,
                                                                              libsel=True, cutoff=cut))
        for hz in (0, 128, 256, 384, 512, 768, 1024):  # twins only within hz positions: linear cost
            v[f"uniq-k{kth}-lib-h{hz}"] = (None, make_redundancy(power=8.0, back=4, kth=kth, clamp=True, horizon=hz,
                                                                libsel=True))
            v[f"uniq-k{kth}-b4-c-h{hz}"] = (None, make_redundancy(power=8.0, back=4, kth=kth, clamp=True, horizon=hz))
        for b in (2, 3, 4):
            for f in (0, 2, 4, 6):
                v[f"uniq-k{kth}-b{b}-f{f}"] = (None, make_redundancy(power=8.0, back=b, kth=kth,
                                                                  post_pool=("forward", f, 0.9) if f else NOPOOL))
    for pw in (1, 2, 4):
        v[f"surp-p{pw}"] = (None, make_surprisal(float(pw)))
        v[f"surp-p{pw}-f16"] = (None, make_surprisal(float(pw), post_pool=("forward", 16, 0.9)))
        v[f"surp-p{pw}-nopool"] = (None, make_surprisal(float(pw), post_pool=NOPOOL))
        for mx in (0.25, 0.5, 1.0):
            v[f"surp-p{pw}-u{mx:g}"] = (None, make_surprisal(float(pw), mix=mx))
    for beta in (5, 10, 20, 40):
        for pw in (1, 2, 4, 8):
            v[f"soft-b{beta}-p{pw}"] = (None, make_soft(float(beta), float(pw)))
    for wgt in (0.5, 1.0, 2.0):
        v[f"combo-{wgt:g}"] = ("recon", make_combo(wgt))
    v["lib-uniqueness"] = (None, methods.METHODS["uniqueness"].select) if "uniqueness" in methods.METHODS else None
    # the same with the selection's value links (continuation through runs of similar values)
    v["lib-uniqueness-runs"] = (None, methods.METHODS["uniqueness-runs"].select)
    for base in ("uniq-k3", "uniq-k4", "lib-uniqueness", "recon-max-v", "surp-p4"):
        if v.get(base) is not None:
            v[base + "+sep"] = (v[base][0], with_separators(v[base][1]))
            v[base + "+sep.!?"] = (v[base][0], with_separators(v[base][1], (".", "!", "?", ",")))
    return {k: x for k, x in v.items() if x is not None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="recon-max,recon-max-v,recon-max-nopool,recon-max-headkv")
    ap.add_argument("--ratios", default="0.1,0.05")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=CONTEXT_TOKENS)
    ap.add_argument("--only", default="")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seed-base", type=int, default=0, help="> 0: a held-out split (other filler and keys)")
    ap.add_argument("--task", default="needle", choices=["needle", "needle-prose", "multikey", "vartrack"],
                    help="multikey: 3 labelled codes in one context, each asked after one compression")
    ap.add_argument("--out", default=os.path.join(OUT_DIR, "agnostic.md"))
    args = ap.parse_args(argv)
    table = variants()
    names = [x for x in args.variants.split(",") if x]
    for x in names:
        if x not in table:  # a method of eval/methods.py at its own window
            m = methods.get(x)
            table[x] = (None, (lambda m: lambda cap, r, _w: m.select(cap, r, m.window))(m))
    ratios = [float(r) for r in args.ratios.split(",")]
    model = Model()
    MODEL.append(model)
    prompts = [p for group in tasks.make_task(args.task, model.tokenizer, args.prompts, args.tokens, args.seed_base)
               for p in group]
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        prompts = [p for p in prompts if p.index in keep]
    res, full_ok, cost = {}, set(), {}
    t0 = time.time()
    for p in prompts:
        cap, _ = captures.load_or_compute(model, p, "agnostic")
        if answer_correct(model.tokenizer.decode(cap.answer_ids), p.key):
            full_ok.add(p.index)
        for sig in {table[x][0] for x in names} - {None}:
            st = signal_stats(model, cap, sig)
            STATS[(id(cap), sig)] = st
            cost.setdefault(sig, []).append((int(st["extra_tokens"]) / cap.n, float(st["t_forward"])))
        marks = []
        selects = [(x, (lambda f: lambda c, r: f(c, r, args.window))(table[x][1])) for x in names]
        for x, r, e, _ in evaluate_selections(model, cap, selects, ratios, p.key):
            res.setdefault((x, r), []).append((p.index, e["correct"], e["kl"]))
            marks.append(f"{x}@{r:g}:{'ok' if e['correct'] else 'x'}")
        print(f"prompt {p.index} depth {p.depth:.2f} full {'ok' if p.index in full_ok else 'x'} "
              f"({time.time() - t0:.0f}s) " + " ".join(marks), file=sys.stderr, flush=True)
    lines = [f"\n## agnostic {args.task}, {len(prompts)} prompts x {args.tokens} tokens, seed base {args.seed_base}, w={args.window} "
             f"(full cache answers {len(full_ok)})\n", "| variant | ratio | correct | on full-ok | KL |",
             "|---|---:|---:|---:|---:|"]
    for x in names:
        for r in ratios:
            g = res[(x, r)]
            lines.append(f"| {x} | {r:g} | {sum(c for _, c, _ in g)}/{len(g)} | "
                         f"{sum(c for i, c, _ in g if i in full_ok)}/{len(full_ok)} | {np.mean([k for *_, k in g]):.3f} |")
    for sig, c in cost.items():
        lines.append(f"\n{sig}: extra tokens {np.mean([a for a, _ in c]):.2f} x N, numpy forward {np.mean([b for _, b in c]):.1f} s")
    emit_table(lines, args.out)


if __name__ == "__main__":
    main()
