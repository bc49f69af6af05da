"""``kvevict.kvpress``: kvevict's methods as NVIDIA kvpress presses.

Two ways in, both usable wherever kvpress takes a press (``KVPressTextGenerationPipeline``,
``with press(model): ...``, kvpress's evaluation registry: ``PRESS_REGISTRY``):

- :class:`KvevictPress` (``BasePress``): the whole method as kvevict runs it. During the
  prefill each attention layer is scored by the library (its hook reads the layer's cache
  keys and values, its window queries rebuilt from the layer input and RoPE, ``o_proj``
  for LaProx) and the scores kept; when the prefill ends, the library selects the model's
  kept set at once — the method's own allocator across layers and heads (LaProx: global;
  LAVa: its entropy allocator; LaProx-span and ``uniqueness``: one token set with the
  forward post-pool) — and the cache is compressed: a layer whose heads keep the same
  tokens is cut to them (its memory is freed), a layer with ragged heads keeps its tensors
  and masks the evicted keys per head as kvpress's ``AdaKVPress`` does
  (``module.masked_key_indices``). Positions are kept (RoPE untouched). Budget as kvpress
  counts it: ``compression_ratio`` r keeps ``floor(N·(1-r))`` positions per (layer, KV
  head), the observation window inside (on average for ragged allocators).
  :class:`LaProxPress`, :class:`LAVaPress`, :class:`LaProxSpanPress`,
  :class:`UniquenessPress` fix the preset.
- :class:`KvevictScorerPress` (``ScorerPress``): the library's per-layer scores only
  (``score()``: ``[B, Hkv, N]``, the window given the top score as SnapKV does), for
  kvpress's own per-layer top-k and wrappers (``AdaKVPress(KvevictScorerPress(...))``).
- :class:`KvevictAdaKVPress` (``BasePress``, kvpress's ``AdaKVPress`` interface: ``press``,
  ``alpha_safeguard``): AdaKV's head-adaptive selection inside each layer run by the
  library (its ``ada`` allocator) over the scores of any ``ScorerPress`` — kvpress's own
  (``SnapKVPress``, ``KnormPress``, ...) or :class:`KvevictScorerPress` — the evicted keys
  masked per head as ``AdaKVPress`` masks them; ``press.kept[layer]`` the kept lists.

Question-aware (the question's queries in the observation window, eval/'s ``aware``
setting and the papers'): :func:`question_aware` runs kvpress's pipeline with the question
prefilled with the context but for its last ``tail`` tokens, so every press sees the
question's rows as its window (and keeps them: the window is always kept).

After a compression ``press.kept`` holds the kept positions (``kept[layer][kv_head]``,
ascending int64 tensors) and ``press.scores`` the ``[L, Hkv, P]`` scores. Batch size 1
(the pipeline's); the scores run on the host (``kvevict.torch``): a CUDA model needs a
library built with CUDA for the scoring, and the selection runs on the host.
"""
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
from kvpress.presses.base_press import BasePress, is_prefilling
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import compute_n_kept, extract_keys_and_values, get_prerope_query_states
from transformers import QuantizedCache
from transformers.models.llama.modeling_llama import rotate_half

from . import torch as kt
from ._core import ScoreParams, SelectParams
from ._pipeline import make_score_params

__all__ = ["KvevictPress", "KvevictScorerPress", "KvevictAdaKVPress", "LaProxPress", "LAVaPress", "LaProxSpanPress",
           "UniquenessPress", "PRESS_REGISTRY", "head_budget", "window_queries", "layer_scores",
           "question_aware"]

_NO_QUERIES = ("knorm", "streamingllm", "uniqueness")


def head_budget(n, compression_ratio, window):
    """Positions kept per (layer, KV head), window included: ``floor(n·(1-r))`` (kvpress's
    count, without its float truncation losing a token: 1 - 0.9 is 0.0999...), at least
    the window, at most ``n``."""
    return int(min(n, max(window, math.floor(n * (1.0 - compression_ratio) + 1e-9))))


def window_queries(module, hidden_states, window, position_embeddings):
    """The post-RoPE queries ``[B, Hq, w, d]`` of the last ``w`` positions of the layer's
    input (as kvpress's SnapKV rebuilds them)."""
    q = get_prerope_query_states(module, hidden_states[:, -window:])
    cos, sin = position_embeddings
    cos, sin = cos[:, -window:].unsqueeze(1), sin[:, -window:].unsqueeze(1)
    return q * cos + rotate_half(q) * sin


def layer_scores(params, module, hidden_states, keys, values, kwargs):
    """The library's scores ``[Hkv, P]`` of one layer (batch entry 0), ``P = N - w``."""
    if keys.shape[0] != 1:
        raise ValueError(f"kvevict presses compress one sequence at a time; batch of {keys.shape[0]}")
    cfg = module.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    n = keys.shape[2]
    w = min(params.window, n)
    q = None
    if params.scorer not in _NO_QUERIES:
        q = window_queries(module, hidden_states, w, kwargs["position_embeddings"])[0]
    k, v = keys[0], values[0]
    extra = {}
    if params.scorer in ("laprox", "criticalkv"):
        wo = module.o_proj.weight.T  # [Hq*dv, D], the design's x·Wo layout (a view)
        if params.scorer == "laprox":
            gram = kt.gram_cache.get(wo, None, hq, hkv, params.cross)
            extra["value_forms"] = kt.compute_value_forms(v, gram, params.cross, hq=hq)
        else:
            extra["value_l1"] = kt.compute_value_l1(v, wo, hq=hq)
    elif params.scorer in ("lava", "uniqueness"):
        extra["values"] = v
    return kt.score_layer(params, q, k, **extra)


@dataclass
class KvevictPress(BasePress):
    """A kvevict method as a kvpress press (see the module's doc). ``preset``: a design §3
    preset (``kvevict.PRESET_NAMES``); ``window_size``: its observation window (None: the
    preset's); ``granularity`` ("head", "layer", "token") overrides the preset's
    selection; ``value_links``: a link threshold (``kvevict.LINK_THRESHOLD``) for the
    linked selection of laprox-span / uniqueness; ``score_fields``: ``ScoreParams`` fields."""

    compression_ratio: float = 0.0
    preset: str = "laprox"
    window_size: Optional[int] = None
    granularity: Optional[str] = None
    value_links: Optional[float] = None
    score_fields: dict = field(default_factory=dict)

    def __post_init__(self):
        assert 0 <= self.compression_ratio < 1, "Compression ratio must be between 0 and 1"
        self.params = make_score_params(self.preset, self.window_size, **self.score_fields)
        self.kept = None
        self.scores = None
        self._layers = {}

    def select_params(self, budget):
        sp = SelectParams.preset(self.preset, budget)
        if self.granularity is not None:
            sp.granularity = self.granularity
        return sp

    def forward_hook(self, module, input, kwargs, output):
        hidden_states = kwargs["hidden_states"]
        cache = kwargs["past_key_values"]
        q_len = hidden_states.shape[1]
        if self.compression_ratio == 0 or not is_prefilling(kwargs["cache_position"], q_len):
            return output  # not the prefill
        if isinstance(cache, QuantizedCache):
            raise NotImplementedError("kvevict presses compress a plain (DynamicCache) cache; "
                                      "QuantizedCache is not supported")
        keys, values = extract_keys_and_values(cache, module.layer_idx)
        s = layer_scores(self.params, module, hidden_states, keys, values, kwargs)
        links = None
        if self.value_links is not None:
            links = torch.zeros(keys.shape[2], dtype=torch.float32)
            kt.accumulate_value_links(values[0], links)
        self._layers[module.layer_idx] = (module, cache, s, links)
        return output

    @contextmanager
    def __call__(self, model):
        self._layers = {}
        with super().__call__(model):
            yield
        try:
            if self._layers:
                self.compress_model()
        finally:
            self._layers = {}

    def compress_model(self):
        """Select over every scored layer and compress the cache (after the prefill)."""
        order = sorted(self._layers)
        if order != list(range(len(order))):
            raise RuntimeError(f"kvevict press: scored layers {order}, expected 0..{len(order) - 1}")
        layers = [self._layers[l] for l in order]
        cache = layers[0][1]
        keys0 = extract_keys_and_values(cache, 0)[0]
        hkv, n = keys0.shape[1], keys0.shape[2]
        w = min(self.params.window, n)
        budget = head_budget(n, self.compression_ratio, w) - w
        scores = torch.stack([s for _, _, s, _ in layers])
        links = None
        if self.value_links is not None:
            links = torch.stack([lk for *_, lk in layers]).sum(0)
        offsets, indices = kt.select_model(self.select_params(budget), scores, n, self.params.window,
                                           links=links, link_threshold=self.value_links or 0.5)
        kept = kt.kept_lists(offsets, indices, len(layers), hkv)
        for l, (module, cache, _, _) in enumerate(layers):
            self._apply(module, cache, kept[l], n)
        self.kept, self.scores = kept, scores

    @staticmethod
    def _apply(module, cache, kept, n):
        layer = cache.layers[module.layer_idx]
        keys, values = extract_keys_and_values(cache, module.layer_idx)
        dev = keys.device
        if all(torch.equal(kept[0], k) for k in kept[1:]):
            if len(kept[0]) < n:  # one list for the layer: cut the cache to it
                idx = kept[0].to(dev)
                layer.keys = keys.index_select(2, idx).contiguous()
                layer.values = values.index_select(2, idx).contiguous()
            module.masked_key_indices = None
            return
        _mask_evicted(module, kept, n, dev)


def _mask_evicted(module, kept, n, dev):
    """Ragged heads: mask the keys no list of ``kept`` (one per KV head) holds, per head,
    through kvpress's attention patch (``module.masked_key_indices``, batch entry 0)."""
    assert module.config._attn_implementation != "eager", "eager mode not supported"
    mask = torch.ones(len(kept), n, dtype=torch.bool)
    for h, k in enumerate(kept):
        mask[h, k] = False
    head_idx, seq_idx = mask.nonzero(as_tuple=True)
    module.masked_key_indices = (torch.zeros_like(head_idx).to(dev), head_idx.to(dev), seq_idx.to(dev))


@dataclass
class LaProxPress(KvevictPress):
    """LaProx: attention × the output-projected value term, global allocator."""

    preset: str = "laprox"


@dataclass
class LAVaPress(KvevictPress):
    """LAVa: its scorer and its entropy layer budgets (AdaKV inside a layer)."""

    preset: str = "lava"


@dataclass
class LaProxSpanPress(KvevictPress):
    """LaProx-span: LaProx k=1, token granularity, global, forward post-pool 9/1.0."""

    preset: str = "laprox-span"


@dataclass
class UniquenessPress(KvevictPress):
    """The question-agnostic ``uniqueness`` scorer with LaProx-span's selection (no queries)."""

    preset: str = "uniqueness"
    window_size: Optional[int] = 8


@dataclass
class KvevictScorerPress(ScorerPress):
    """The library's per-layer scores of ``preset`` as a kvpress ``ScorerPress``: kvpress
    keeps ``int(N·(1-r))`` per head of each layer (or wraps it: ``AdaKVPress``)."""

    compression_ratio: float = 0.0
    preset: str = "snapkv-kvpress"
    window_size: Optional[int] = None
    score_fields: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        self.params = make_score_params(self.preset, self.window_size, **self.score_fields)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        s = layer_scores(self.params, module, hidden_states, keys, values, kwargs).to(keys.device)
        w = keys.shape[2] - s.shape[1]
        top = s.max().item() + 1 if s.numel() else 1.0
        return torch.nn.functional.pad(s, (0, w), value=top)[None]


@dataclass
class KvevictAdaKVPress(BasePress):
    """AdaKV (head-adaptive budgets inside a layer) with the library's selection, in the
    interface of kvpress's ``AdaKVPress``: ``press`` (a kvpress ``ScorerPress``, whose
    ``score()`` gives ``[1, Hkv, N]``), ``alpha_safeguard`` (each head first keeps its own
    top ``floor(alpha·n_kept)`` positions). Per layer, ``n_kept`` positions per KV head on
    average (kvpress's count: ``max(1, int(N·(1-r)))``), ``Hkv·n_kept`` in all, chosen by
    the library's ``ada`` allocator over the scores of every position (a press that gives
    its window the top score, as SnapKV's does, keeps it); the other keys are masked per
    head as ``AdaKVPress`` masks them (sdpa / flash attention with kvpress's patch; the
    cache keeps its shape). With ``alpha_safeguard = 0`` the kept sets are kvpress's
    ``AdaKVPress``'s. ``kept[layer]``: the kept positions per KV head (int64, ascending)."""

    press: ScorerPress = None
    alpha_safeguard: float = 0.20

    def __post_init__(self):
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"press: a kvpress ScorerPress, got {type(self.press).__name__}")
        if not 0 <= self.alpha_safeguard <= 1:
            raise ValueError(f"alpha_safeguard: in [0, 1], got {self.alpha_safeguard!r}")
        self.kept = {}

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    @property
    def compression_ratio(self):
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value):
        self.press.compression_ratio = value

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        if scores.dim() != 3 or scores.shape[0] != 1:
            raise ValueError(f"press: scores [1, Hkv, N] expected (one sequence), got "
                             f"{tuple(scores.shape)}")
        _, hkv, n = scores.shape
        n_kept = compute_n_kept(n, self.compression_ratio)
        sp = SelectParams("ada", "head", n_kept, alpha=float(self.alpha_safeguard),
                          normalize="none")
        s = scores.detach().to("cpu", torch.float32)
        offsets, indices = kt.select_model(sp, s, n, 0)
        kept = kt.kept_lists(offsets, indices, 1, hkv)[0]
        self.kept[module.layer_idx] = kept
        _mask_evicted(module, kept, n, keys.device)
        return keys, values


def question_aware(pipe, context, question, press, *, tail=1, max_new_tokens=50,
                   answer_prefix="", max_context_length=None):
    """The answer of kvpress's ``KVPressTextGenerationPipeline`` ``pipe`` with ``press``
    applied question-aware: the pipeline's own tokens of ``context`` and ``question``
    (its chat template and tokenizer, as ``pipe(context, question=...)`` makes them) are
    prefilled and compressed together but for the question's last ``tail`` tokens, which
    are fed afterwards through the compressed cache (``tail >= 1``: the first answer token
    must see the compression). The press's observation window then holds the question's
    queries; its budget (``compression_ratio``) counts the whole prefill. Returns the
    answer string; ``press.kept`` etc. as after ``pipe(...)``."""
    if tail < 1:
        raise ValueError(f"tail: at least 1 question token is fed after the compression, got {tail}")
    limit = max_context_length if max_context_length is not None else 10 ** 9
    t = pipe.preprocess(context, [question], answer_prefix, limit)
    q = t["questions_ids"][0]
    if q.shape[1] <= tail:
        raise ValueError(f"tail: the question has {q.shape[1]} tokens, tail {tail} leaves none "
                         "for the window")
    ids = torch.cat([t["context_ids"], q], dim=1)
    prefill, suffix = ids[:, : ids.shape[1] - tail], ids[:, ids.shape[1] - tail:]
    answers = pipe._forward({"context_ids": prefill, "questions_ids": [suffix]},
                            max_new_tokens=max_new_tokens, press=press)
    return answers[0]


PRESS_REGISTRY = {
    "kvevict-laprox": LaProxPress(),
    "kvevict-lava": LAVaPress(),
    "kvevict-laprox-span": LaProxSpanPress(),
    "kvevict-laprox-span-w8": LaProxSpanPress(window_size=8),
    "kvevict-uniqueness": UniquenessPress(),
}
"""Presses for kvpress's evaluation registry (``evaluation/evaluate_registry.py``:
``PRESS_REGISTRY.update(kvevict.kvpress.PRESS_REGISTRY)``); each takes the run's
``compression_ratio``."""

assert all(isinstance(p.params, ScoreParams) for p in PRESS_REGISTRY.values())
