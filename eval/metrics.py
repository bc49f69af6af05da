"""Metrics of one selection on one prompt, against the full cache.

- correct: greedy decode through the compressed cache; the first digit run of the answer is
  the pass key (exact match).
- kl: KL(full || compressed) of the first answer token's distribution (nats).
- layer_err: per layer, the attention output through Wo of the eval tokens (the tokens fed
  after the prefill: suffix + full-cache answer) with the kept prefix vs the full prefix,
  relative Frobenius error. Each layer alone: the eval tokens' queries, keys and values are
  the full-cache ones, so errors do not compound; reported as the mean over layers.

`evaluate` runs one selection through the engine's KVCache; `evaluate_many` runs B
selections of one capture as one batch (Model.generate_masked, same numbers up to float
rounding, several times faster).
"""
import numpy as np

from engine import KVCache, attention
from needle import answer_correct


def kl_divergence(logp_ref, logp):
    p = np.exp(logp_ref.astype(np.float64))
    return float(np.sum(p * (logp_ref.astype(np.float64) - logp.astype(np.float64))))


def keep_mask(kept, n, n_heads):
    """kept[kv_head] positions -> bool mask [Hkv, n]."""
    m = np.zeros((n_heads, n), dtype=bool)
    for h in range(n_heads):
        m[h, np.asarray(kept[h], dtype=np.int64)] = True
    return m


def layer_errors(cap, kept):
    """Relative error of each layer's attention output (through Wo) over the eval tokens, [L]."""
    n = cap.n
    k_all, v_all, q_eval = cap.keys_all, cap.values_all, cap.q_eval
    E = q_eval.shape[2]
    errs = np.empty(cap.n_layers)
    for l in range(cap.n_layers):
        full = np.ones((cap.n_kv_heads, n + E), dtype=bool)
        comp = full.copy()
        comp[:, :n] = keep_mask(kept[l], n, cap.n_kv_heads)
        o_full = attention(q_eval[l], k_all[l], v_all[l], full, E) @ cap.wo[l]
        o_comp = attention(q_eval[l], k_all[l], v_all[l], comp, E) @ cap.wo[l]
        errs[l] = np.linalg.norm(o_comp - o_full) / np.linalg.norm(o_full)
    return errs


def evaluate(model, cap, kept, key):
    """All metrics of one selection. Returns a dict (answer text included)."""
    cache = KVCache.from_arrays(cap.keys, cap.values, kept)
    n_new = len(cap.answer_ids)
    answer, first_logp, _ = model.generate(cap.suffix_ids, cache, n_new)
    text = model.tokenizer.decode(answer)
    kept_count = sum(len(kept[l][h]) for l in range(cap.n_layers) for h in range(cap.n_kv_heads))
    errs = layer_errors(cap, kept)
    return {
        "answer": text,
        "correct": answer_correct(text, key),
        "kl": kl_divergence(cap.first_logp, first_logp),
        "layer_err": float(errs.mean()),
        "kept_frac": kept_count / (cap.n_layers * cap.n_kv_heads * cap.n),
    }


def keep_masks(cap, kepts):
    """kept lists of B selections -> bool masks [B, L, Hkv, n]."""
    m = np.zeros((len(kepts), cap.n_layers, cap.n_kv_heads, cap.n), dtype=bool)
    for b, kept in enumerate(kepts):
        for l in range(cap.n_layers):
            for h in range(cap.n_kv_heads):
                m[b, l, h, np.asarray(kept[l][h], dtype=np.int64)] = True
    return m


def layer_errors_many(cap, masks):
    """layer_errors for B selections at once: [B, L]."""
    n = cap.n
    k_all, v_all, q_eval = cap.keys_all, cap.values_all, cap.q_eval
    Hq, E, hd = q_eval.shape[1:]
    Hkv = cap.n_kv_heads
    g = Hq // Hkv
    B = masks.shape[0]
    S = n + E
    scale = np.float32(1.0 / np.sqrt(hd))
    causal = np.where(np.arange(S)[None, :] > (n + np.arange(E))[:, None], np.float32(-np.inf), np.float32(0))
    errs = np.empty((B, cap.n_layers))
    for l in range(cap.n_layers):
        o_full = np.empty((E, Hkv, g, hd), np.float32)
        o_comp = np.empty((B, E, Hkv, g, hd), np.float32)
        for h in range(Hkv):
            s = (q_eval[l, h * g:(h + 1) * g].reshape(g * E, hd) @ k_all[l, h].T).reshape(g, E, S)
            s *= scale
            s += causal
            a = np.exp(s - s.max(axis=-1, keepdims=True))
            a /= a.sum(axis=-1, keepdims=True)
            o_full[:, h] = (a.reshape(g * E, S) @ v_all[l, h]).reshape(g, E, hd).transpose(1, 0, 2)
            bias = np.where(masks[:, l, h], np.float32(0), np.float32(-np.inf))  # [B, n]
            c = np.broadcast_to(s, (B, g, E, S)).copy()
            c[..., :n] += bias[:, None, None, :]
            c -= c.max(axis=-1, keepdims=True)
            np.exp(c, out=c)
            c /= c.sum(axis=-1, keepdims=True)
            o_comp[:, :, h] = (c.reshape(B * g * E, S) @ v_all[l, h]).reshape(B, g, E, hd).transpose(0, 2, 1, 3)
        wo = cap.wo[l]
        f = o_full.reshape(E, Hq * hd) @ wo
        c = (o_comp.reshape(B * E, Hq * hd) @ wo).reshape(B, E, -1)
        errs[:, l] = np.linalg.norm((c - f).reshape(B, -1), axis=1) / np.linalg.norm(f)
    return errs


def evaluate_many(model, cap, kepts, key, batch=48):
    """evaluate() of B selections of one capture, batched; returns B dicts."""
    out = []
    for i in range(0, len(kepts), batch):
        chunk = kepts[i:i + batch]
        masks = keep_masks(cap, chunk)
        answers, first_logp = model.generate_masked(cap.suffix_ids, cap.keys, cap.values, masks, len(cap.answer_ids))
        errs = layer_errors_many(cap, masks)
        total = cap.n_layers * cap.n_kv_heads * cap.n
        for b in range(len(chunk)):
            text = model.tokenizer.decode(answers[b])
            out.append({
                "answer": text,
                "correct": answer_correct(text, key),
                "kl": kl_divergence(cap.first_logp, first_logp[b]),
                "layer_err": float(errs[b].mean()),
                "kept_frac": int(masks[b].sum()) / total,
            })
    return out


def evaluate_selections(model, cap, selects, ratios, key):
    """Every (name, ratio) of `selects` ([(name, select(cap, ratio) -> kept)]) on one capture:
    identical selections are decoded once, all of them as one batch. Returns a list of
    (name, ratio, metrics, kept)."""
    import methods  # the eval's method helpers (validation, digests)
    jobs, kepts, index = [], [], {}
    for name, select in selects:
        for r in ratios:
            kept = select(cap, r)
            methods.check_kept(kept, cap)
            h = methods.kept_digest(kept)
            if h not in index:
                index[h] = len(kepts)
                kepts.append(kept)
            jobs.append((name, r, index[h]))
    evals = evaluate_many(model, cap, kepts, key)
    return [(name, r, evals[j], kepts[j]) for name, r, j in jobs]


def emit_table(lines, path):
    """A study's table: printed, and appended to `path`."""
    text = "\n".join(lines)
    print(text)
    with open(path, "a") as f:
        f.write(text + "\n")
