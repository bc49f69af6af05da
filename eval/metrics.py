"""Metrics of one selection on one prompt, against the full cache.

- correct: greedy decode through the compressed cache; the first digit run of the answer is
  the pass key (exact match).
- kl: KL(full || compressed) of the first answer token's distribution (nats).
- layer_err: per layer, the attention output through Wo of the eval tokens (the tokens fed
  after the prefill: suffix + full-cache answer) with the kept prefix vs the full prefix,
  relative Frobenius error. Each layer alone: the eval tokens' queries, keys and values are
  the full-cache ones, so errors do not compound; reported as the mean over layers.
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
