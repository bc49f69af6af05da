"""The C API's functions over numpy arrays (one Python function per C entry point group)."""
import ctypes

import numpy as np

from ._core import (KvevictError, STATUS_CODES, ScoreParams, SelectParams, call, floats,
                    make_tensor, ptr)
from ._lib import kve_histogram, kve_layer_inputs, kve_model_scores, kve_search, lib

_u64 = ctypes.c_uint64


def _out_u64(name, *args):
    v = _u64()
    call(name, *args, ctypes.byref(v))
    return int(v.value)


def _workspace(nbytes, given=None):
    if given is not None:
        given = np.asarray(given)
        if given.dtype != np.uint8 or given.ndim != 1 or not given.flags.c_contiguous:
            raise ValueError("workspace must be a 1-D C-contiguous uint8 array")
        if given.size >= nbytes:
            return given
    return np.empty(max(int(nbytes), 1), np.uint8)


def _shape_error(function, detail):
    raise KvevictError(STATUS_CODES["KVE_ERR_SHAPE_MISMATCH"], function, detail)


def _as_score_params(params):
    if isinstance(params, ScoreParams):
        return params
    if isinstance(params, str):
        return ScoreParams.preset(params)
    raise TypeError(f"expected ScoreParams or a preset name, got {type(params).__name__}")


# ------------------------------------------------------------------------------ scoring
def score_workspace_size(params, hq, hkv, n, dk, dv=None):
    """Workspace bytes :func:`score_layer` needs (``kve_score_workspace_size``)."""
    params = _as_score_params(params)
    return _out_u64("kve_score_workspace_size", params._ref, hq, hkv, n, dk, dk if dv is None else dv)


def score_output_len(params, hkv, n):
    """Floats :func:`score_layer` writes: ``hkv * (n - min(window, n))``."""
    params = _as_score_params(params)
    return _out_u64("kve_score_output_len", params._ref, hkv, n)


def prefix_len(n, window):
    """Prefix tokens ``P = n - min(window, n)`` (the scored ones)."""
    return int(n) - min(int(window), int(n))


def score_layer(params, queries=None, keys=None, values=None, gram=None, value_forms=None,
                value_l1=None, row_lse=None, *, dtype=None, out=None, workspace=None):
    """Score one layer (``kve_score_layer``): returns float32 ``[Hkv, P]``, ``P = N - min(window, N)``.

    - ``queries`` ``[Hq, wq, dk]`` post-RoPE queries of the last ``wq >= min(window, N)``
      positions (the last ``window`` rows are used); not read by knorm / streamingllm.
    - ``keys`` ``[Hkv, N, dk]`` (required), ``values`` ``[Hkv, N, dv]`` (lava, laprox).
    - ``gram``: from :func:`compute_gram` (laprox with values), or ``value_forms`` from
      :func:`compute_value_forms` instead of values + gram; ``value_l1`` ``[Hkv, N]`` from
      :func:`compute_value_l1` (criticalkv).
    - ``row_lse`` (optional, scorers that read queries): ``[Hq, w]`` float32, ``w =
      min(window, N)``, the natural-log log-sum-exp of each window row's logits
      ``q·k/sqrt(dk)`` over the keys it sees (flash attention's ``softmax_lse``, or
      :func:`window_row_lse`); K is then read once instead of twice. Exactly ``Hq*w``
      values, all finite, else :class:`KvevictError`.

    Tensors may be any strided numpy views (e.g. llama.cpp's token-major K, transposed V);
    float32 / float16 / bfloat16 (``ml_dtypes.bfloat16``, or uint16 bits with
    ``dtype="bfloat16"`` or :func:`kvevict.bfloat16`); other float dtypes are converted to
    float32. ``params``: a :class:`ScoreParams` or a preset name. ``out`` (float32, C-
    contiguous, ``>= Hkv*P`` elements) and ``workspace`` (uint8) may be given for reuse.
    """
    params = _as_score_params(params)
    inp = kve_layer_inputs()
    call("kve_layer_inputs_init", ctypes.byref(inp), ctypes.sizeof(inp))
    keep = []
    hq = hkv = n = dk = dv = None
    if keys is not None:
        k = make_tensor(keys, "keys", dtype)
        keep.append(k)
        inp.keys = k.c
        hkv, n, dk = k.array.shape
        hq, dv = hkv, dk
    if queries is not None:
        q = make_tensor(queries, "queries", dtype)
        keep.append(q)
        inp.queries = q.c
        hq = q.array.shape[0]
    if values is not None:
        v = make_tensor(values, "values", dtype)
        keep.append(v)
        inp.values = v.c
        dv = v.array.shape[2]
    for name, arr in (("gram", gram), ("value_forms", value_forms), ("value_l1", value_l1),
                      ("row_lse", row_lse)):
        if arr is not None:
            a = floats(arr, name)
            if a.size == 0 and name == "row_lse":
                # given but empty (rejected by the library), not absent (NULL, 0)
                a = np.zeros(1, np.float32)
                keep.append(a)
                setattr(inp, name, ptr(a))
                continue
            keep.append(a)
            setattr(inp, name, ptr(a))
            setattr(inp, name + "_len", a.size)
    if keys is None:
        # let the library report it (KVE_ERR_NULL_POINTER), with no shape to size buffers
        call("kve_score_layer", params._ref, ctypes.byref(inp), None, 0, None, 0, detail="keys missing")
    total = score_output_len(params, hkv, n)
    p = prefix_len(n, params.window)
    ws = _workspace(score_workspace_size(params, hq, hkv, n, dk, dv), workspace)
    if out is None:
        out = np.empty((hkv, p), np.float32)
    elif out.dtype != np.float32 or not out.flags.c_contiguous or out.size < total:
        raise ValueError(f"out must be C-contiguous float32 with >= {total} elements")
    call("kve_score_layer", params._ref, ctypes.byref(inp), ptr(out), out.size, ptr(ws), ws.size)
    return out if out.shape == (hkv, p) else out.reshape(-1)[:total].reshape(hkv, p)


def window_row_lse(queries, keys, window, *, dtype=None):
    """The window rows' log-sum-exp (``kve_window_row_lse``), the ``row_lse`` input of
    :func:`score_layer`: float32 ``[Hq, w]``, ``w = min(window, N)``,
    ``lse[h, j] = ln Σ_{i <= N-w+j} exp(q[h, wq-w+j]·k[h//g, i] / sqrt(dk))``.
    ``queries`` ``[Hq, wq, dk]``, ``keys`` ``[Hkv, N, dk]`` as in :func:`score_layer`;
    ``window`` an int or a :class:`ScoreParams` / preset name (its window)."""
    if not isinstance(window, int):
        window = _as_score_params(window).window
    q = make_tensor(queries, "queries", dtype)
    k = make_tensor(keys, "keys", dtype)
    hq, _, _ = q.array.shape
    hkv, n, dk = k.array.shape
    w = min(int(window), int(n))
    ws = _workspace(_out_u64("kve_window_row_lse_workspace_size", hq, hkv, n, dk, int(window)))
    out = np.empty((hq, w), np.float32)
    call("kve_window_row_lse", ctypes.byref(q.c), ctypes.byref(k.c), int(window), ptr(out),
         out.size, ptr(ws), ws.size)
    return out


# ---------------------------------------------------------------------- gram and values
def _cross_flag(cross):
    return 1 if cross else 0


def _wo(wo, hq, dtype, function):
    wo_arr = wo.array if hasattr(wo, "array") and not isinstance(wo, np.ndarray) else np.asarray(wo)
    if wo_arr.ndim == 2:
        if hq is None:
            raise ValueError(f"{function}: a 2-D wo [Hq*dv, D] needs hq")
        rows, d = wo_arr.shape
        if rows % hq:
            _shape_error(function, f"wo rows {rows} not a multiple of hq={hq}")
        view = wo_arr.reshape(hq, rows // hq, d)  # splitting an axis never copies
        if wo is not wo_arr:  # a Tensor (bf16 bits)
            from ._core import Tensor
            return make_tensor(Tensor(view, wo.dtype), "wo")
        return make_tensor(view, "wo", dtype)
    if wo_arr.ndim == 3:
        if hq is not None and wo_arr.shape[0] != hq:
            _shape_error(function, f"wo has {wo_arr.shape[0]} heads, hq={hq}")
        return make_tensor(wo, "wo", dtype)
    raise ValueError(f"{function}: wo must be [Hq, dv, D] or [Hq*dv, D] with hq, got {wo_arr.shape}")


def gram_blocks(g, cross=False):
    """Gram blocks per KV head: ``g`` (cross False) or ``g + g(g-1)/2`` (cross True)."""
    return g + g * (g - 1) // 2 if cross else g


def gram_len(hq, hkv, dv, cross=False):
    """Floats of a Gram output (``kve_gram_len``)."""
    return _out_u64("kve_gram_len", hq, hkv, dv, _cross_flag(cross))


def compute_gram(wo, hkv, cross=False, *, hq=None, dtype=None):
    """LaProx's Gram matrices of one layer (``kve_compute_gram``), float32
    ``[Hkv, blocks, dv, dv]`` (blocks = :func:`gram_blocks`).

    ``wo``: ``[Hq, dv, D]``, or ``[Hq*dv, D]`` (the design's ``x·Wo`` layout) with ``hq``. For
    PyTorch's ``o_proj.weight`` (``[D, Hq*dv]``) pass its transpose ``w.T`` (a view).
    ``cross``: True for the exact / mean-attn LaProx GQA modes.
    """
    t = _wo(wo, hq, dtype, "compute_gram")
    hq_, dv, d = t.array.shape
    n = gram_len(hq_, hkv, dv, cross)
    out = np.empty(n, np.float32)
    ws = _workspace(_out_u64("kve_gram_workspace_size", dv, d))
    call("kve_compute_gram", ctypes.byref(t.c), hkv, _cross_flag(cross), ptr(out), out.size,
         ptr(ws), ws.size)
    return out.reshape(hkv, n // (hkv * dv * dv), dv, dv)


def _groups_from_blocks(blocks, cross):
    if not cross:
        return blocks
    g = 1
    while gram_blocks(g, True) < blocks:
        g += 1
    if gram_blocks(g, True) != blocks:
        raise ValueError(f"{blocks} Gram blocks is no g + g(g-1)/2")
    return g


def value_forms_len(hq, hkv, n, cross=False):
    """Floats of the value-form cache ``[Hkv][blocks][N]`` (``kve_value_forms_len``)."""
    return _out_u64("kve_value_forms_len", hq, hkv, n, _cross_flag(cross))


def compute_value_forms(values, gram, cross=False, *, hq=None, t0=0, t1=None, out=None, dtype=None):
    """LaProx's cached value forms ``v G vᵀ`` (``kve_compute_value_forms``): float32
    ``[Hkv, blocks, N]`` for token columns ``t0 .. t1`` (default all; other columns of a
    given ``out`` are left as they are, so an engine can fill new tokens as they come).

    ``gram`` from :func:`compute_gram` with the same ``cross``; ``hq`` is inferred from a
    4-D gram (``[Hkv, blocks, dv, dv]``) when not given.
    """
    v = make_tensor(values, "values", dtype)
    hkv, n, dv = v.array.shape
    g_arr = np.asarray(gram)
    if hq is None:
        if g_arr.ndim != 4:
            raise ValueError("compute_value_forms: pass hq, or the 4-D gram of compute_gram")
        hq = hkv * _groups_from_blocks(g_arr.shape[1], cross)
    g = floats(g_arr, "gram")
    total = value_forms_len(hq, hkv, n, cross)
    if out is None:
        out = np.zeros((hkv, total // (hkv * n), n), np.float32)
    elif out.dtype != np.float32 or not out.flags.c_contiguous or out.size < total:
        raise ValueError(f"out must be C-contiguous float32 with >= {total} elements")
    t1 = n if t1 is None else t1
    call("kve_compute_value_forms", ctypes.byref(v.c), ptr(g), g.size, hq, _cross_flag(cross),
         t0, t1, ptr(out), out.size)
    return out


def compute_value_l1(values, wo, *, hq=None, dtype=None):
    """CriticalKV's value term ``mean_{h in group} ||v_i Wo_h||_1`` (``kve_compute_value_l1``):
    float32 ``[Hkv, N]``. ``values`` ``[Hkv, N, dv]``; ``wo`` as in :func:`compute_gram`."""
    v = make_tensor(values, "values", dtype)
    t = _wo(wo, hq, dtype, "compute_value_l1")
    hkv, n, _ = v.array.shape
    _, dv, d = t.array.shape
    out = np.empty((hkv, n), np.float32)
    ws = _workspace(_out_u64("kve_value_l1_workspace_size", dv, d))
    call("kve_compute_value_l1", ctypes.byref(v.c), ctypes.byref(t.c), ptr(out), out.size,
         ptr(ws), ws.size)
    return out


# ---------------------------------------------------------------------------- selection
def _as_select_params(params):
    if isinstance(params, SelectParams):
        return params
    raise TypeError(f"expected SelectParams, got {type(params).__name__}")


def _model_scores(scores, n, window, function):
    s = np.ascontiguousarray(scores, dtype=np.float32)
    if s.ndim != 3:
        raise ValueError(f"{function}: scores must be [layers, Hkv, P], got shape {s.shape}")
    layers, hkv, p = s.shape
    if p != prefix_len(n, window):
        _shape_error(function, f"scores have P={p} per head, n={n} window={window} gives "
                               f"{prefix_len(n, window)}")
    m = kve_model_scores()
    m.scores, m.len, m.layers, m.hkv, m.n, m.window = ptr(s), s.size, layers, hkv, n, window
    return s, m


def select_output_len(params, layers, hkv, n, window):
    """``(offsets_len, indices_len)`` enough for :func:`select_model`'s outputs."""
    params = _as_select_params(params)
    a, b = _u64(), _u64()
    call("kve_select_output_len", params._ref, layers, hkv, n, window, ctypes.byref(a), ctypes.byref(b))
    return int(a.value), int(b.value)


def select_workspace_size(params, layers, hkv, n, window):
    params = _as_select_params(params)
    return _out_u64("kve_select_workspace_size", params._ref, layers, hkv, n, window)


LINK_THRESHOLD = 0.5  # LaProx-span's value-link threshold (kve_select_model_linked)


def select_model(params, scores, n, window, *, workspace=None, links=None, link_threshold=LINK_THRESHOLD):
    """Select the kept positions of every (layer, KV head) (``kve_select_model``).

    ``scores``: float32 ``[L, Hkv, P]`` (``P = n - min(window, n)``), e.g. the stacked
    outputs of :func:`score_layer`. Returns ``(offsets, indices)`` in CSR form: the kept
    positions of unit ``u = l*Hkv + kh`` are ``indices[offsets[u]:offsets[u+1]]``
    (uint64 offsets of length ``L*Hkv + 1``, uint32 indices, ascending, window included).
    :func:`kept_lists` turns them into ``kept[l][kh]`` arrays.
    ``links``: float32 ``[n]`` value-link sums over every layer (:func:`accumulate_value_links`)
    — the forward post-pool (decay 1) then carries each continuation on while the mean link
    exceeds ``link_threshold`` (``kve_select_model_linked``).
    """
    params = _as_select_params(params)
    s, m = _model_scores(scores, n, window, "select_model")
    layers, hkv, _ = s.shape
    no, ni = select_output_len(params, layers, hkv, n, window)
    offsets = np.empty(no, np.uint64)
    indices = np.empty(max(ni, 1), np.uint32)
    ws = _workspace(select_workspace_size(params, layers, hkv, n, window), workspace)
    if links is None:
        call("kve_select_model", params._ref, ctypes.byref(m), ptr(offsets), offsets.size,
             ptr(indices), ni, ptr(ws), ws.size)
    else:
        lk = np.ascontiguousarray(links, dtype=np.float32)
        call("kve_select_model_linked", params._ref, ctypes.byref(m), ptr(lk), lk.size,
             float(link_threshold), ptr(offsets), offsets.size, ptr(indices), ni, ptr(ws), ws.size)
    return offsets, indices[: int(offsets[-1])].copy()


def accumulate_value_links(values, links, *, dtype=None):
    """Add one layer's value links to ``links`` (float32 ``[N]``, zeroed before the first
    layer; ``kve_accumulate_value_links``): ``links[i] += sum_h cos(v[h,i], v[h,i-1])`` for
    ``values`` ``[Hkv, N, dv]``. Returns ``links``."""
    v = make_tensor(values, "values", dtype)
    if not (isinstance(links, np.ndarray) and links.dtype == np.float32 and links.flags.c_contiguous
            and links.flags.writeable):
        raise TypeError("accumulate_value_links: links must be a writable C-contiguous float32 array")
    ws = _workspace(_out_u64("kve_value_links_workspace_size", v.array.shape[1], v.array.shape[2]))
    call("kve_accumulate_value_links", ctypes.byref(v.c), ptr(links), links.size, ptr(ws), ws.size)
    return links


def hadamard_blocks(x, block):
    """``x <- H x`` in place on each block of ``block`` floats of ``x`` (a writable
    C-contiguous float32 array; ``kve_hadamard_blocks``): H the orthonormal Walsh-Hadamard
    matrix, the rotation a quantized llama.cpp cache stores K/V rows with. Returns ``x``."""
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous
            and x.flags.writeable):
        raise TypeError("hadamard_blocks: x must be a writable C-contiguous float32 array")
    call("kve_hadamard_blocks", ptr(x), x.size, int(block))
    return x


def query_ring_rows(counts, window, seq_of):
    """The ring row of each token of a ubatch (``kve_query_ring_rows``) for an engine's
    in-graph query ring of ``window`` rows per sequence and one scratch row: ``seq_of``
    the tokens' sequences, ``counts`` (a writable C-contiguous uint64 array, one per
    sequence) the queries written so far, advanced. Returns the rows (int64)."""
    if not (isinstance(counts, np.ndarray) and counts.dtype == np.uint64 and counts.flags.c_contiguous
            and counts.flags.writeable):
        raise TypeError("query_ring_rows: counts must be a writable C-contiguous uint64 array")
    s = np.ascontiguousarray(seq_of, dtype=np.int32)
    rows = np.empty(s.size, np.int64)
    call("kve_query_ring_rows", ptr(counts), counts.size, int(window), ptr(s), s.size, ptr(rows),
         rows.size)
    return rows


def kept_lists(offsets, indices, layers, hkv, dtype=np.int64):
    """CSR selection → ``kept[l][kh]``: a list (layers) of lists (KV heads) of ascending
    position arrays (``dtype``, default int64)."""
    offsets = np.asarray(offsets)
    if offsets.size != layers * hkv + 1:
        raise ValueError(f"offsets has {offsets.size} entries, layers*hkv+1 = {layers * hkv + 1}")
    idx = np.asarray(indices).astype(dtype, copy=False)
    o = offsets.astype(np.int64)
    return [[idx[o[l * hkv + h]: o[l * hkv + h + 1]] for h in range(hkv)] for l in range(layers)]


def evicted_positions(kept, prefix):
    """Positions ``p < prefix`` missing from an ascending kept list
    (``kve_evicted_positions``): what a llama.cpp-style engine frees, one
    ``llama_memory_seq_rm(mem, seq, p, p+1)`` each. Returns uint32, ascending."""
    k = np.ascontiguousarray(kept, dtype=np.uint32)
    out = np.empty(max(int(prefix), 1), np.uint32)
    count = _u64()
    call("kve_evicted_positions", ptr(k), k.size, prefix, ptr(out), int(prefix), ctypes.byref(count))
    return out[: count.value].copy()


# ----------------------------------------------------------------------- sharded search
class ShardedSearch:
    """Model-wide top-K split over shards of consecutive layers (design §4, "selection
    across devices"): the ``kve_search_*`` protocol. Global allocator, head or layer
    granularity. Usage::

        s = ShardedSearch(params, layers, hkv, n, window)   # links=: the linked selection
        while not s.done:
            hist = s.new_histogram()
            for first, shard in shards:          # shard: [Ls, Hkv, P] scores
                s.count(shard, first, hist)      # on each device; histograms add up
            s.step(hist)
        parts = [s.select(shard, first) for first, shard in shards]

    Or :func:`select_sharded` for the whole loop in one process. ``links``: float32 ``[n]``
    value-link sums over EVERY layer (each shard accumulates its own layers with
    :func:`accumulate_value_links`, the caller adds them up): the linked selection of
    :func:`select_model` (``kve_search_count_shard_linked`` / ``kve_select_shard_linked``).
    """

    def __init__(self, params, layers, hkv, n, window, *, links=None, link_threshold=LINK_THRESHOLD):
        self.params = _as_select_params(params)
        self.layers, self.hkv, self.n, self.window = layers, hkv, n, window
        self.links = None if links is None else np.ascontiguousarray(links, dtype=np.float32)
        self.link_threshold = float(link_threshold)
        self.state = kve_search()
        call("kve_search_init", ctypes.byref(self.state), self.params._ref, layers, hkv, n, window)

    @property
    def done(self):
        return bool(self.state.done)

    def new_histogram(self):
        h = kve_histogram()
        call("kve_histogram_clear", ctypes.byref(h))
        return h

    @staticmethod
    def merge(dst, src):
        """``dst += src`` (histograms counted on different devices / processes)."""
        call("kve_histogram_merge", ctypes.byref(dst), ctypes.byref(src))

    def _shard(self, scores, function):
        s, m = _model_scores(scores, self.n, self.window, function)
        if s.shape[1] != self.hkv:
            _shape_error(function, f"shard has {s.shape[1]} KV heads, search {self.hkv}")
        return s, m

    def _ws(self, layers):
        return _workspace(_out_u64("kve_select_shard_workspace_size", self.params._ref, layers,
                                   self.hkv, self.n, self.window))

    def count(self, scores, first_layer, hist):
        """Add a shard's candidates (``[Ls, Hkv, P]``, layers ``first_layer ..``) to ``hist``."""
        s, m = self._shard(scores, "ShardedSearch.count")
        ws = self._ws(s.shape[0])
        if self.links is None:
            call("kve_search_count_shard", self.params._ref, ctypes.byref(m), first_layer,
                 ctypes.byref(self.state), ctypes.byref(hist), ptr(ws), ws.size)
        else:
            call("kve_search_count_shard_linked", self.params._ref, ctypes.byref(m), first_layer,
                 ctypes.byref(self.state), ptr(self.links), self.links.size, self.link_threshold,
                 ctypes.byref(hist), ptr(ws), ws.size)

    def step(self, hist):
        """Fix the next digit from the merged histogram; returns :attr:`done`."""
        d = ctypes.c_int32()
        call("kve_search_step", ctypes.byref(self.state), ctypes.byref(hist), ctypes.byref(d))
        return bool(d.value)

    @property
    def threshold(self):
        """The finished search's threshold as a (normalised) score."""
        f = ctypes.c_float()
        call("kve_search_threshold", ctypes.byref(self.state), ctypes.byref(f))
        return float(f.value)

    def select(self, scores, first_layer):
        """Apply the finished search to a shard: ``(offsets, indices)`` of its units, as
        :func:`select_model` would report them (offsets count from this shard's indices)."""
        s, m = self._shard(scores, "ShardedSearch.select")
        ls = s.shape[0]
        a, b = _u64(), _u64()
        call("kve_select_shard_output_len", ls, self.hkv, self.n, ctypes.byref(a), ctypes.byref(b))
        offsets = np.empty(int(a.value), np.uint64)
        indices = np.empty(max(int(b.value), 1), np.uint32)
        ws = self._ws(ls)
        outs = (ptr(offsets), offsets.size, ptr(indices), int(b.value), ptr(ws), ws.size)
        if self.links is None:
            call("kve_select_shard", self.params._ref, ctypes.byref(m), first_layer,
                 ctypes.byref(self.state), *outs)
        else:
            call("kve_select_shard_linked", self.params._ref, ctypes.byref(m), first_layer,
                 ctypes.byref(self.state), ptr(self.links), self.links.size, self.link_threshold,
                 *outs)
        return offsets, indices[: int(offsets[-1])].copy()


def select_sharded(params, shards, n, window, *, links=None, link_threshold=LINK_THRESHOLD):
    """Run :class:`ShardedSearch` over ``shards`` (a list of ``[Ls, Hkv, P]`` score arrays,
    consecutive layers in order) and return ``(offsets, indices)`` for the whole model,
    equal to :func:`select_model`'s (with ``links``: its linked selection's)."""
    shards = [np.ascontiguousarray(s, dtype=np.float32) for s in shards]
    layers = sum(s.shape[0] for s in shards)
    hkv = shards[0].shape[1]
    firsts = np.cumsum([0] + [s.shape[0] for s in shards[:-1]])
    search = ShardedSearch(params, layers, hkv, n, window, links=links,
                           link_threshold=link_threshold)
    while not search.done:
        total = search.new_histogram()
        for f, s in zip(firsts, shards):
            h = search.new_histogram()
            search.count(s, int(f), h)
            search.merge(total, h)
        search.step(total)
    offs, idxs, base = [np.zeros(1, np.uint64)], [], 0
    for f, s in zip(firsts, shards):
        o, i = search.select(s, int(f))
        offs.append(o[1:] + np.uint64(base))
        idxs.append(i)
        base += int(o[-1])
    return np.concatenate(offs), np.concatenate(idxs) if idxs else np.empty(0, np.uint32)


# --------------------------------------------------------------------------- compaction
def _unit_offsets(offsets, first_unit, heads):
    o = np.ascontiguousarray(offsets, dtype=np.uint64)
    if first_unit < 0 or first_unit + heads + 1 > o.size:
        raise ValueError(f"offsets has {o.size} entries; units {first_unit}..{first_unit + heads} "
                         "need one more than that")
    return o[first_unit: first_unit + heads + 1]


def compact_in_place(kv, offsets, indices, *, first_unit=0, dtype=None):
    """Head-major compaction in place (``kve_compact_in_place``): for every head ``h`` of
    ``kv`` (``[H, N, d]``, any non-negative element strides, written through the view)
    the kept rows move to tokens ``0 .. count_h`` in order. The selection of head ``h`` is
    unit ``first_unit + h`` of ``(offsets, indices)`` (as from :func:`select_model`:
    layer ``l`` is ``first_unit = l*Hkv``). Returns the new lengths, uint32 ``[H]``.

    For llama.cpp-style token rows ``[N, Hkv*d]`` with a shared granularity, pass
    ``rows[None]`` (one head) and the unit of any head. ``kv`` must be a writable
    float32 / float16 / bfloat16 array (no copy is ever made).
    """
    t = make_tensor(kv, "kv", dtype, writable=True)
    h = t.array.shape[0]
    o = _unit_offsets(offsets, first_unit, h)
    i = np.ascontiguousarray(indices, dtype=np.uint32)
    lengths = np.empty(h, np.uint32)
    call("kve_compact_in_place", ctypes.byref(t.c), ptr(o), o.size, ptr(i), i.size,
         ptr(lengths), lengths.size)
    return lengths


def compact_varlen(src, offsets, indices, *, first_unit=0, dst=None, dtype=None):
    """Flattened varlen compaction (``kve_compact_varlen``): the kept rows of every head
    of ``src`` (``[H, N, d]``) head after head into ``dst`` ``[rows, d]`` (allocated, same
    dtype as ``src``, when not given), plus ``cu_seqlens`` int32 ``[H+1]`` (flash-attention
    varlen: head ``h`` owns rows ``cu_seqlens[h] .. cu_seqlens[h+1]``).
    Returns ``(dst[:cu_seqlens[-1]], cu_seqlens)``."""
    s = make_tensor(src, "src", dtype)
    h, _, d = s.array.shape
    o = _unit_offsets(offsets, first_unit, h)
    i = np.ascontiguousarray(indices, dtype=np.uint32)
    rows = int(o[-1] - o[0])
    if dst is None:
        dst = np.empty((max(rows, 1), d), s.array.dtype)
    dst_arr = dst.array if hasattr(dst, "array") and not isinstance(dst, np.ndarray) else dst
    if dst_arr.ndim != 2:
        raise ValueError(f"dst must be [rows, d], got shape {dst_arr.shape}")
    t = make_tensor(dst_arr[None], "dst", "bfloat16" if s.code == 2 else None, writable=True)
    if t.code != s.code or t.array.dtype.itemsize != s.array.dtype.itemsize:
        raise ValueError(f"dst dtype {dst_arr.dtype} differs from src's {s.array.dtype}")
    cu = np.empty(h + 1, np.int32)
    call("kve_compact_varlen", ctypes.byref(s.c), ptr(o), o.size, ptr(i), i.size, ctypes.byref(t.c),
         ptr(cu), cu.size)
    return dst_arr[: int(cu[-1])], cu
