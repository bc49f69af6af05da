"""Full-cache prefill captures of one prompt, computed once and cached as .npz.

A prompt is split into the part that is prefilled and then compressed (`prefill_ids`, N
tokens; the observation window is its last w tokens) and the part fed afterwards through the
compressed cache (`suffix_ids`):

- `aware` (question inside the window, the papers' setting): prefill = the whole prompt but
  its last `tail` tokens, suffix = those `tail` tokens (default 1). With tail = 0 the first
  answer token would come from the uncompressed prefill and never see the compression.
- `agnostic`: prefill = the context only (window = its last w tokens), suffix = the question.

With the full cache we then greedily decode `n_answer` tokens and keep, for every token fed
after the prefill ("eval tokens": suffix + answer but the last), its post-RoPE queries and its
K/V, which the layer attention-output metric needs.

Arrays (f32 unless said): `q_window [L,Hq,Wc,hd]` (last Wc = 64 prefill positions),
`keys`/`values` `[L,Hkv,N+E,hd]`, `q_eval [L,Hq,E,hd]`, `first_logp [V]` (full-cache
log-probs of the first answer token), int arrays `prefill_ids`, `suffix_ids`, `answer_ids`.
"""
import hashlib
import os

import numpy as np

from engine import CACHE_DIR, KVCache

CAPTURE_VERSION = 1
WINDOW_CAPTURE = 64  # largest observation window a method may ask for (snapkv-kvpress: 64)
N_ANSWER = 8


def _array(name):
    """A read-only attribute: the capture's array `name`, as stored."""
    return property(lambda self: self.a[name])


class Captures:
    """What a selection method may read. Shapes use L layers, Hq/Hkv heads, hd head dim.

    n            prefill length N (cache length before compression, window included)
    keys         [L, Hkv, N, hd]  post-RoPE keys of the prefill
    values       [L, Hkv, N, hd]
    wo           [L, Hq*hd, D]    output projection, design x·Wo layout
    window_queries(w) -> [L, Hq, w, hd]  post-RoPE queries of positions N-w .. N-1
    """

    def __init__(self, arrays, wo, meta):
        self.a = arrays
        self.meta = meta
        self.wo = wo
        self.n = int(len(arrays["prefill_ids"]))
        L, Hkv, _, hd = arrays["keys"].shape
        self.n_layers, self.n_kv_heads, self.head_dim = L, Hkv, hd
        self.n_heads = arrays["q_window"].shape[1]
        self.keys = arrays["keys"][:, :, : self.n]
        self.values = arrays["values"][:, :, : self.n]

    def window_queries(self, w):
        wc = self.a["q_window"].shape[2]
        if not 0 < w <= wc:
            raise ValueError(f"window {w} not in 1..{wc} (captured)")
        return self.a["q_window"][:, :, wc - w:]

    # evaluation side (not for methods)
    @property
    def suffix_ids(self):
        return [int(t) for t in self.a["suffix_ids"]]

    @property
    def answer_ids(self):
        return [int(t) for t in self.a["answer_ids"]]

    first_logp = _array("first_logp")
    q_eval = _array("q_eval")
    keys_all = _array("keys")
    values_all = _array("values")


def split_prompt(prompt, setting, tail=1):
    if setting == "aware":
        if tail < 1:
            raise ValueError("tail must be >= 1: the answer must be computed through the compressed cache")
        ids = prompt.ids
        return ids[: len(ids) - tail], ids[len(ids) - tail:]
    if setting == "agnostic":
        return list(prompt.context_ids), list(prompt.question_ids)
    raise ValueError(f"unknown setting {setting!r}")


def _cache_file(prefill_ids, suffix_ids, setting):
    h = hashlib.sha1(np.asarray(prefill_ids + [-1] + suffix_ids, dtype=np.int64).tobytes())
    h.update(f"v{CAPTURE_VERSION}:{setting}:{WINDOW_CAPTURE}:{N_ANSWER}".encode())
    return os.path.join(CACHE_DIR, "captures", f"{setting}-{h.hexdigest()[:16]}.npz")


def compute(model, prefill_ids, suffix_ids):
    cache = KVCache(model.n_layers)
    _, q_window = model.forward(prefill_ids, cache, capture_q=min(WINDOW_CAPTURE, len(prefill_ids)))
    answer, first_logp, q_eval = model.generate(suffix_ids, cache, N_ANSWER, capture_q=True)
    # the last generated token was never fed, so K/V cover prefill + eval tokens exactly
    return {
        "prefill_ids": np.asarray(prefill_ids, np.int64),
        "suffix_ids": np.asarray(suffix_ids, np.int64),
        "answer_ids": np.asarray(answer, np.int64),
        "first_logp": first_logp.astype(np.float32),
        "q_window": q_window,
        "keys": np.stack(cache.k),
        "values": np.stack(cache.v),
        "q_eval": q_eval,
    }


def load_or_compute(model, prompt, setting, tail=1):
    """Captures of `prompt` in `setting`; the second element says whether it was cached."""
    prefill_ids, suffix_ids = split_prompt(prompt, setting, tail)
    path = _cache_file(prefill_ids, suffix_ids, setting)
    cached = os.path.exists(path)
    if cached:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
    else:
        arrays = compute(model, prefill_ids, suffix_ids)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path[:-4] + ".tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    wo = model.wo_stack()
    meta = {"setting": setting, "tail": tail, "prompt": prompt.index, "depth": prompt.depth, "key": prompt.key}
    return Captures(arrays, wo, meta), cached


def answered(model, task, n_prompts, n_tokens, seed_base, setting):
    """(prompt, captures) of `task`'s prompts that the full cache answers, in `setting`."""
    import tasks  # here: tasks builds prompts, captures only stores their tensors
    from needle import answer_correct
    for group in tasks.make_task(task, model.tokenizer, n_prompts, n_tokens, seed_base=seed_base):
        for p in group:
            cap, _ = load_or_compute(model, p, setting)
            if answer_correct(model.tokenizer.decode(cap.answer_ids), p.key):
                yield p, cap
