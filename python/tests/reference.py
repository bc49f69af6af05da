"""Plain numpy (float64) recomputation of design §2–§4 formulas, for the binding's tests."""
import math

import numpy as np


def window_attention(q, k, w):
    """design §2: q [Hq, >=w, d] (last w rows used), k [Hkv, N, d] -> A [Hq, w, N] (f64)."""
    q = np.asarray(q, np.float64)[:, -w:]
    k = np.asarray(k, np.float64)
    hq, _, d = q.shape
    hkv, n, _ = k.shape
    g = hq // hkv
    kk = np.repeat(k, g, axis=0)  # query head h reads KV head h // g
    z = np.einsum("hjd,hid->hji", q, kk) / math.sqrt(d)
    future = np.arange(n)[None, :] > (n - w + np.arange(w))[:, None]
    z[:, future] = -np.inf
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def pool(s, kind, k, decay=0.9):
    """Pool along the last axis (design §3)."""
    if kind == "none" or k <= 1:
        return s
    if kind == "forward":
        out = np.full_like(s, -np.inf)
        for j in range(k):
            shifted = np.full_like(s, -np.inf)
            shifted[..., j:] = s[..., : s.shape[-1] - j] * decay**j
            out = np.maximum(out, shifted)
        return out
    p = k // 2
    pad = -np.inf if kind == "max" else 0.0
    padded = np.pad(s, [(0, 0)] * (s.ndim - 1) + [(p, p)], constant_values=pad)
    win = np.lib.stride_tricks.sliding_window_view(padded, k, axis=-1)
    return win.max(axis=-1) if kind == "max" else win.mean(axis=-1)


def _groups(x, hkv):
    return x.reshape(hkv, -1, x.shape[-1])


def snapkv(q, k, w, kernel=7, kind="max", gqa="mean"):
    hkv, n, _ = k.shape
    a = window_attention(q, k, w)[:, :, : n - w].mean(axis=1)  # [Hq, P]
    a = _groups(pool(a, kind, kernel), hkv)
    return {"mean": np.mean, "max": np.max, "sum": np.sum}[gqa](a, axis=1)


def lava(q, k, v, w, kernel=7):
    hkv, n, _ = k.shape
    p = n - w
    a = pool(window_attention(q, k, w)[:, :, :p].mean(axis=1), "max", kernel)  # [Hq, P]
    c = np.abs(np.asarray(v, np.float64)[:, :p]).sum(axis=-1).max(axis=1)  # [Hkv]
    a = _groups(a, hkv) * c[:, None, None]
    return a.max(axis=1)


def laprox_sum(q, k, v, wo, w, kernel=7, kind="avg", placement="attention"):
    """LaProx, GQA sum: wo [Hq, dv, D]."""
    hkv, n, _ = k.shape
    p = n - w
    hq = wo.shape[0]
    g = hq // hkv
    a = window_attention(q, k, w)[:, :, :p]
    att = np.sqrt((a * a).sum(axis=1))  # [Hq, P]
    vv = np.repeat(np.asarray(v, np.float64)[:, :p], g, axis=0)  # [Hq, P, dv]
    vo = np.linalg.norm(np.einsum("hpd,hdD->hpD", vv, np.asarray(wo, np.float64)), axis=-1)
    if placement == "attention":
        s = pool(att, kind, kernel) * vo
    else:
        s = pool(att * vo, kind, kernel)
    return _groups(s, hkv).sum(axis=1)


def knorm(k, w):
    hkv, n, _ = k.shape
    return -np.linalg.norm(np.asarray(k, np.float64)[:, : n - w], axis=-1)


def uniqueness(k, v, w):
    """(1 - r)^24 with r the 4th largest min(cos k, cos v) over the other tokens (-1 where
    fewer exist), 0 where r >= 0.5, then the score lent whole to the 6 tokens before and
    0.729^(j - 6) of it to the j-th before, j <= 10."""
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    hkv, n, _ = k.shape
    p = n - min(w, n)
    out = np.zeros((hkv, p))
    for h in range(hkv):
        kn = k[h] / np.maximum(np.linalg.norm(k[h], axis=1, keepdims=True), 1e-300)
        vn = v[h] / np.maximum(np.linalg.norm(v[h], axis=1, keepdims=True), 1e-300)
        c = np.minimum(kn @ kn.T, vn @ vn.T)
        np.fill_diagonal(c, -np.inf)
        c = np.concatenate([c, np.full((n, 4), -1.0)], axis=1)  # pads rows with < 4 others
        r = -np.partition(-c, 3, axis=1)[:, 3]
        u = np.where(r[:p] >= 0.5, 0.0, np.maximum(1.0 - r[:p], 0.0) ** 24)  # cutoff 0.5
        s = u.copy()
        for j in range(1, min(11, p)):
            s[:-j] = np.maximum(s[:-j], float(np.float32(0.729)) ** max(j - 6, 0) * u[j:])
        out[h] = s
    return out


def tova(q, k):
    hkv, n, _ = k.shape
    a = window_attention(q, k, 1)[:, 0, : n - 1].mean(axis=0)
    return np.repeat(a[None], hkv, axis=0)


def gram(wo, hkv, cross=False):
    """[Hkv, blocks, dv, dv]: diagonal blocks then, with cross, pairs a < b in order."""
    wo = np.asarray(wo, np.float64)
    hq = wo.shape[0]
    g = hq // hkv
    out = []
    for kh in range(hkv):
        hs = wo[kh * g:(kh + 1) * g]
        blocks = [hs[a] @ hs[a].T for a in range(g)]
        if cross:
            blocks += [hs[a] @ hs[b].T for a in range(g) for b in range(a + 1, g)]
        out.append(blocks)
    return np.asarray(out)


def value_l1(v, wo, hkv):
    wo = np.asarray(wo, np.float64)
    g = wo.shape[0] // hkv
    v = np.asarray(v, np.float64)
    out = np.empty(v.shape[:2])
    for kh in range(hkv):
        terms = [np.abs(v[kh] @ wo[kh * g + a]).sum(axis=-1) for a in range(g)]
        out[kh] = np.mean(terms, axis=0)
    return out


def top_k(scores, k):
    """Positions of the k largest, ascending; ties keep the later position (design §4)."""
    k = int(min(max(k, 0), len(scores)))
    pos = np.arange(len(scores))
    order = np.lexsort((-pos, -np.asarray(scores, np.float64)))
    return np.sort(order[:k])
