"""kvevict: KV-cache eviction (LaProx, LAVa, SnapKV, AdaKV, PyramidKV, CriticalKV, ...).

A ctypes binding to ``libkvevict`` (the crate's C ABI, ``src/capi/``): numpy arrays in and
out, the C API's nouns. See ``python/README.md`` and docs/design.md for the math.

The library is looked up, first match wins: ``$KVEVICT_LIB``; the copy bundled in the
package at build time; ``<repo>/target/release/libkvevict.so``.
"""
from ._core import (ALLOCATORS, GRANULARITIES, POOLS, PRESETS, SCORERS, STATUS_CODES,
                    KvevictError, ScoreParams, SelectParams, Tensor, bfloat16,
                    budget_from_capacity, budget_keep_ratio_prefix, budget_keep_ratio_total,
                    from_bfloat16_bits, library_path, status_message, status_name,
                    to_bfloat16_bits, version, version_number)
from ._lib import LibraryNotFound, candidate_paths
from ._api import (LINK_THRESHOLD, ShardedSearch, accumulate_value_links, compact_in_place,
                   compact_varlen, compute_gram, compute_value_forms, compute_value_l1,
                   evicted_positions, gram_blocks, gram_len, hadamard_blocks, kept_lists,
                   query_ring_rows, prefix_len, score_layer, score_output_len,
                   score_workspace_size, select_model, select_output_len, select_sharded,
                   select_workspace_size, value_forms_len, window_row_lse)
from ._stream import STREAM_STATS, StreamScorer
from ._paged import POOL_KINDS, paged_compact, paged_gather, pool_tensor
from ._evictor import Evictor, evictor_options, preset_list
from ._pipeline import (DEFAULT_ALLOCATOR, GramCache, gram_cache, make_score_params,
                        score_model, select_kept)

__version__ = "0.4.0"

PRESET_NAMES = tuple(PRESETS.names())

__all__ = [
    "KvevictError", "LibraryNotFound", "ScoreParams", "SelectParams", "Tensor", "bfloat16",
    "to_bfloat16_bits", "from_bfloat16_bits", "version", "version_number", "library_path",
    "candidate_paths", "status_name", "status_message", "STATUS_CODES", "PRESET_NAMES",
    "budget_from_capacity", "budget_keep_ratio_total", "budget_keep_ratio_prefix",
    "score_layer", "score_output_len", "score_workspace_size", "prefix_len", "window_row_lse",
    "compute_gram", "gram_len", "gram_blocks", "compute_value_forms", "value_forms_len",
    "compute_value_l1", "accumulate_value_links", "LINK_THRESHOLD", "select_model",
    "select_output_len", "select_workspace_size",
    "kept_lists", "evicted_positions", "ShardedSearch", "select_sharded",
    "compact_in_place", "compact_varlen", "score_model", "select_kept", "make_score_params",
    "GramCache", "gram_cache", "DEFAULT_ALLOCATOR", "StreamScorer", "STREAM_STATS", "Evictor",
    "POOL_KINDS", "pool_tensor", "paged_gather", "paged_compact", "evictor_options",
    "preset_list", "hadamard_blocks", "query_ring_rows",
]
