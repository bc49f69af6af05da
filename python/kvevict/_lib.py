"""Finding and loading ``libkvevict``, and the ctypes mirror of the C ABI (``src/capi/``).

Lookup order of the shared library (the first that exists wins):

1. ``$KVEVICT_LIB``: the path of the library file (or of a folder holding it);
2. the copy bundled inside the package at build time (``kvevict/_lib/``), if any;
3. ``<repo>/target/release/libkvevict.so`` (``.dylib`` on macOS, ``kvevict.dll`` on
   Windows), where ``<repo>`` is the checkout the package was built from (recorded at
   build time) or, for an in-tree import, the folder above ``python/``.

The structs below mirror the layouts of include/kvevict.h; the extensible ones pass their
``sizeof`` as ``struct_size``, a released size the library keeps accepting (it accepts
released sizes only), so an older binding keeps working with a newer library.
"""
import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int32, c_uint32, c_uint64, c_void_p

from ._libname import LIB_NAME

_HERE = os.path.dirname(os.path.abspath(__file__))


def _repo_roots():
    roots = []
    try:
        from . import _build_info  # written by setup.py when the package is built

        roots.append(_build_info.REPO_ROOT)
    except ImportError:
        pass
    # in-tree use: <repo>/python/kvevict/_lib.py
    roots.append(os.path.dirname(os.path.dirname(_HERE)))
    return roots


def candidate_paths():
    """The paths tried, in order, as (origin, path) pairs."""
    out = []
    env = os.environ.get("KVEVICT_LIB")
    if env:
        out.append(("KVEVICT_LIB", os.path.join(env, LIB_NAME) if os.path.isdir(env) else env))
    out.append(("bundled", os.path.join(_HERE, "_lib", LIB_NAME)))
    seen = set()
    for root in _repo_roots():
        p = os.path.join(root, "target", "release", LIB_NAME)
        if p not in seen:
            seen.add(p)
            out.append(("repo", p))
    return out


class LibraryNotFound(ImportError):
    """No ``libkvevict`` at any of the places looked at (see :func:`candidate_paths`)."""


def _find():
    tried = candidate_paths()
    env = os.environ.get("KVEVICT_LIB")
    if env and not os.path.exists(tried[0][1]):
        # an explicit path that does not exist is an error, not a reason to look elsewhere
        raise LibraryNotFound(f"KVEVICT_LIB={env!r}: no such file ({tried[0][1]})")
    for _, p in tried:
        if os.path.isfile(p):
            return p
    lines = "\n".join(f"  {o}: {p}" for o, p in tried)
    raise LibraryNotFound(
        f"{LIB_NAME} not found; tried:\n{lines}\n"
        "Build it with `cargo build --release` in the repository, or set KVEVICT_LIB."
    )


# ------------------------------------------------------------------------------ structs
# the typed buffer that opens both tensor descriptors: elements, their count and type
_BUFFER = [("data", c_void_p), ("len", c_uint64), ("dtype", c_uint32), ("pad", c_uint32)]


class kve_tensor(ctypes.Structure):
    _fields_ = _BUFFER + [
        ("extent", c_uint64 * 3),
        ("stride", c_uint64 * 3),
    ]


class kve_paged_layout(ctypes.Structure):
    """One K or V tensor of a paged pool (``src/capi/paged.rs``)."""
    _fields_ = _BUFFER + [
        ("offset", c_uint64),
        ("num_blocks", c_uint64),
        ("block_size", c_uint64),
        ("heads", c_uint64),
        ("dim", c_uint64),
        ("stride", c_uint64 * 4),
    ]


class kve_score_params(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("scorer", c_uint32),
        ("window", c_uint32),
        ("pool_kind", c_uint32),
        ("pool_kernel", c_uint32),
        ("pool_decay", c_float),
        ("gqa", c_uint32),
        ("reduce_before_pool", c_uint32),
        ("laprox_gqa", c_uint32),
        ("placement", c_uint32),
        ("sinks", c_uint32),
        ("critical_first_stage", c_uint32),
        ("power", c_uint32),
    ]


class kve_select_params(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("allocator", c_uint32),
        ("granularity", c_uint32),
        ("normalize", c_uint32),
        ("budget", c_uint64),
        ("alpha", c_float),
        ("beta", c_uint32),
        ("post_pool_kind", c_uint32),
        ("post_pool_kernel", c_uint32),
        ("post_pool_decay", c_float),
        ("post_pool_sinks", c_uint32),
    ]


class kve_compact_item(ctypes.Structure):
    """One tensor of ``kve_cuda_compact_batch_in_place``: the tensor, its kept lists and counts
    (device pointers), ``kept_ld`` elements between two heads' lists (0: shared)."""
    _fields_ = [("kv", kve_tensor), ("kept", c_void_p), ("kept_ld", c_uint64), ("counts", c_void_p)]


class kve_layer_inputs(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("queries", kve_tensor),
        ("keys", kve_tensor),
        ("values", kve_tensor),
        ("gram", c_void_p),
        ("gram_len", c_uint64),
        ("value_forms", c_void_p),
        ("value_forms_len", c_uint64),
        ("value_l1", c_void_p),
        ("value_l1_len", c_uint64),
        ("row_lse", c_void_p),
        ("row_lse_len", c_uint64),
    ]


class kve_stream_score_params(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("stat", c_uint32),
        ("gqa", c_uint32),
        ("pool_kind", c_uint32),
        ("pool_kernel", c_uint32),
        ("pool_decay", c_float),
        ("post_pool_kind", c_uint32),
        ("post_pool_kernel", c_uint32),
        ("post_pool_decay", c_float),
        ("reserved", c_uint32),
    ]


class kve_model_scores(ctypes.Structure):
    _fields_ = [
        ("scores", c_void_p),
        ("len", c_uint64),
        ("layers", c_uint64),
        ("hkv", c_uint64),
        ("n", c_uint64),
        ("window", c_uint64),
    ]


class kve_search(ctypes.Structure):
    _fields_ = [
        ("need", c_uint64),
        ("prefix_lo", c_uint64),
        ("prefix_hi", c_uint64),
        ("threshold_lo", c_uint64),
        ("threshold_hi", c_uint64),
        ("bits", c_uint32),
        ("done", c_uint32),
        ("layers", c_uint64),
        ("hkv", c_uint64),
        ("n", c_uint64),
        ("window", c_uint64),
        ("params", kve_select_params),
    ]


class kve_histogram(ctypes.Structure):
    _fields_ = [
        ("bins", c_uint64 * 256),
        ("round", c_uint64),
        ("layers", c_uint64),
        ("layer_sum", c_uint64),
    ]


class kve_evictor_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("preset", c_uint32),
        ("window", c_uint32),
        ("granularity", c_uint32),
        ("score", c_void_p),
        ("layers", c_uint64),
        ("select", c_void_p),
        ("hq", c_uint64),
        ("hkv", c_uint64),
        ("dk", c_uint64),
        ("dv", c_uint64),
        ("d_model", c_uint64),
        ("max_cells", c_uint64),
        ("max_seqs", c_uint64),
        ("policy", c_uint32),
        ("link_threshold", c_float),
        ("keep_ratio", c_double),
        ("min_keep", c_uint64),
        ("high", c_uint64),
        ("low", c_uint64),
        ("paged", c_uint32),
        ("paged_dtype", c_uint32),
    ]


class kve_evictor_layer(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("keys", kve_tensor),
        ("values", kve_tensor),
        ("queries", kve_tensor),
        ("row_lse", c_void_p),
        ("row_lse_len", c_uint64),
        ("wo", kve_tensor),
    ]


class kve_evictor_paged_layer(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("keys", kve_paged_layout),
        ("values", kve_paged_layout),
        ("table", c_void_p),
        ("table_len", c_uint64),
        ("queries", kve_tensor),
        ("row_lse", c_void_p),
        ("row_lse_len", c_uint64),
        ("wo", kve_tensor),
    ]


# int32_t (*)(void *user, uint64_t layer, kve_evictor_layer *out)
kve_evictor_fill_fn = ctypes.CFUNCTYPE(c_int32, c_void_p, c_uint64, POINTER(kve_evictor_layer))


class kve_evictor_round(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved", c_uint32),
        ("cells", c_void_p),
        ("n_cells", c_uint64),
        ("marks", c_void_p),
        ("n_marks", c_uint64),
        ("positions", c_void_p),
        ("n_positions", c_uint64),
        ("mark_ranges", c_void_p),
        ("n_mark_ranges", c_uint64),
        ("keys", POINTER(kve_tensor)),
        ("n_keys", c_uint64),
        ("values", POINTER(kve_tensor)),
        ("n_values", c_uint64),
        ("queries", POINTER(kve_tensor)),
        ("n_queries", c_uint64),
        ("target", c_uint64),
        ("mark_share", c_float),
        ("mark_split", c_uint32),
        ("fill", kve_evictor_fill_fn),
        ("fill_layers", c_uint64),
        ("user", c_void_p),
        ("user_pad", c_uint64),
    ]


class kve_evictor_requirements(ctypes.Structure):
    _fields_ = [(f, c_uint32) for f in ("struct_size", "queries", "values", "wo", "row_lse_helps",
                                        "window", "granularity")]


class kve_evictor_stats(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("ragged", c_uint32)] + [
        (f, c_uint64) for f in ("cells", "protected_cells", "evictions", "cells_evicted")]


class kve_evictor_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("method", c_char_p),
        ("max_cells", c_uint64),
        ("window", c_uint32),
        ("link_threshold", c_float),
        ("keep_ratio", c_double),
        ("evict_to", c_double),
    ]


# The C header's sizes (x86-64 / AArch64 LP64), checked once at import.
for _struct, _size in (
    (kve_tensor, 72), (kve_score_params, 52), (kve_select_params, 48), (kve_layer_inputs, 288),
    (kve_model_scores, 48), (kve_stream_score_params, 40), (kve_search, 128),
    (kve_histogram, 2072), (kve_evictor_options, 48), (kve_evictor_config, 144),
    (kve_evictor_layer, 312), (kve_evictor_paged_layer, 376), (kve_evictor_round, 168),
    (kve_evictor_requirements, 28), (kve_evictor_stats, 40),
):
    assert ctypes.sizeof(_struct) == _size, (_struct.__name__, ctypes.sizeof(_struct), _size)
del _struct, _size

# ------------------------------------------------------------------------- prototypes
P = POINTER
_u64p = P(c_uint64)
_u32p = P(c_uint32)

_PROTOS = {
    # status and version
    "kve_status_name": (c_char_p, [c_int32]),
    "kve_status_message": (c_char_p, [c_int32]),
    "kve_version": (c_uint32, []),
    "kve_version_string": (c_char_p, []),
    # params and budgets
    "kve_score_params_init": (c_int32, [P(kve_score_params), c_uint32, c_uint32]),
    "kve_select_params_init": (c_int32, [P(kve_select_params), c_uint32, c_uint32, c_uint32, c_uint64]),
    "kve_select_params_init_laprox_span": (c_int32, [P(kve_select_params), c_uint32, c_uint64]),
    "kve_select_params_init_preset": (
        c_int32, [P(kve_select_params), c_uint32, c_uint32, c_uint64]),
    "kve_budget_from_capacity": (c_uint64, [c_uint64, c_uint64]),
    "kve_budget_keep_ratio_total": (c_uint64, [c_uint64, c_uint64, c_double]),
    "kve_budget_keep_ratio_prefix": (c_uint64, [c_uint64, c_uint64, c_double]),
    # scoring
    "kve_layer_inputs_init": (c_int32, [P(kve_layer_inputs), c_uint32]),
    "kve_score_workspace_size": (
        c_int32, [P(kve_score_params), c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_score_output_len": (c_int32, [P(kve_score_params), c_uint64, c_uint64, _u64p]),
    "kve_score_layer": (
        c_int32, [P(kve_score_params), P(kve_layer_inputs), c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_window_row_lse_workspace_size": (
        c_int32, [c_uint64, c_uint64, c_uint64, c_uint64, c_uint32, _u64p]),
    "kve_window_row_lse": (
        c_int32, [P(kve_tensor), P(kve_tensor), c_uint32, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_gram_len": (c_int32, [c_uint64, c_uint64, c_uint64, c_uint32, _u64p]),
    "kve_gram_workspace_size": (c_int32, [c_uint64, c_uint64, _u64p]),
    "kve_compute_gram": (
        c_int32, [P(kve_tensor), c_uint64, c_uint32, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_value_forms_len": (c_int32, [c_uint64, c_uint64, c_uint64, c_uint32, _u64p]),
    "kve_compute_value_forms": (
        c_int32,
        [P(kve_tensor), c_void_p, c_uint64, c_uint64, c_uint32, c_uint64, c_uint64, c_void_p, c_uint64]),
    "kve_value_l1_workspace_size": (c_int32, [c_uint64, c_uint64, _u64p]),
    "kve_compute_value_l1": (
        c_int32, [P(kve_tensor), P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64]),
    # scoring from a query stream
    "kve_stream_score_params_init": (c_int32, [P(kve_stream_score_params), c_uint32]),
    "kve_stream_state_size": (c_int32, [c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_stream_init": (c_int32, [c_void_p, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64]),
    "kve_stream_feed_workspace_size": (
        c_int32, [c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_stream_feed": (
        c_int32,
        [c_void_p, c_uint64, P(kve_tensor), c_void_p, c_uint64, P(kve_tensor), c_void_p, c_uint64,
         c_void_p, c_uint64]),
    "kve_stream_query_count": (c_int32, [c_void_p, c_uint64, _u64p]),
    "kve_stream_stats": (
        c_int32, [c_void_p, c_uint64, c_void_p, c_void_p, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_stream_scores_workspace_size": (
        c_int32, [c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_stream_scores": (
        c_int32,
        [c_void_p, c_uint64, P(kve_stream_score_params), P(kve_tensor), c_void_p, c_uint64,
         c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64]),
    # selection
    "kve_select_output_len": (
        c_int32, [P(kve_select_params), c_uint64, c_uint64, c_uint64, c_uint64, _u64p, _u64p]),
    "kve_select_workspace_size": (
        c_int32, [P(kve_select_params), c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_select_model": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_void_p, c_uint64, c_void_p, c_uint64,
         c_void_p, c_uint64]),
    "kve_select_model_linked": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_void_p, c_uint64, c_float, c_void_p, c_uint64,
         c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_value_links_workspace_size": (c_int32, [c_uint64, c_uint64, _u64p]),
    "kve_accumulate_value_links": (c_int32, [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_hadamard_blocks": (c_int32, [c_void_p, c_uint64, c_uint64]),
    "kve_query_ring_rows": (
        c_int32, [c_void_p, c_uint64, c_uint32, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_evicted_positions": (c_int32, [c_void_p, c_uint64, c_uint64, c_void_p, c_uint64, _u64p]),
    # the evictor
    "kve_preset_count": (c_uint32, []),
    "kve_preset_name": (c_char_p, [c_uint32]),
    "kve_preset_from_name": (c_int32, [c_char_p, _u32p]),
    "kve_evictor_config_init": (c_int32, [P(kve_evictor_config), c_uint32, c_uint32]),
    "kve_evictor_size": (c_int32, [P(kve_evictor_config), _u64p]),
    "kve_evictor_config_check": (
        c_int32, [P(kve_evictor_config), P(kve_evictor_requirements), c_uint32, P(c_char_p)]),
    "kve_preset_list": (c_char_p, [c_uint32]),
    "kve_evictor_options_apply": (
        c_int32, [P(kve_evictor_options), P(kve_evictor_config), c_uint32,
                  P(kve_evictor_requirements), c_uint32, P(c_char_p)]),
    "kve_evictor_init": (c_int32, [c_void_p, c_uint64, P(kve_evictor_config), P(c_void_p)]),
    "kve_evictor_get_requirements": (c_int32, [c_void_p, P(kve_evictor_requirements), c_uint32]),
    "kve_evictor_set_output_projection": (c_int32, [c_void_p, c_uint64, P(kve_tensor)]),
    "kve_evictor_observe_queries": (c_int32, [c_void_p, c_uint64, c_uint64, P(kve_tensor)]),
    "kve_evictor_plan": (c_int32, [c_void_p, c_uint64, c_uint64, _u64p]),
    "kve_evictor_begin": (c_int32, [c_void_p, c_uint64, c_uint64, c_uint64]),
    "kve_evictor_layer_init": (c_int32, [P(kve_evictor_layer), c_uint32]),
    "kve_evictor_score_layer": (c_int32, [c_void_p, c_uint64, c_uint64, P(kve_evictor_layer)]),
    "kve_evictor_paged_layer_init": (c_int32, [P(kve_evictor_paged_layer), c_uint32]),
    "kve_evictor_score_layer_paged": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_evictor_paged_layer)]),
    "kve_evictor_round_init": (c_int32, [P(kve_evictor_round), c_uint32]),
    "kve_evictor_run_round": (
        c_int32, [c_void_p, c_uint64, P(kve_evictor_round), c_void_p, c_uint64, _u64p]),
    "kve_evictor_mark_cells": (c_int32, [c_void_p, c_uint64, c_void_p, c_uint64, c_float]),
    "kve_evictor_select": (c_int32, [c_void_p, c_uint64, _u64p]),
    "kve_evictor_kept_cells": (c_int32, [c_void_p, c_uint64, c_void_p, c_uint64, _u64p]),
    "kve_evictor_evicted_cells": (c_int32, [c_void_p, c_uint64, c_void_p, c_uint64, _u64p]),
    "kve_evictor_kept_lists": (
        c_int32, [c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_evictor_compact": (c_int32, [c_void_p, c_uint64, c_uint64, P(kve_tensor)]),
    "kve_evictor_compact_paged": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_paged_layout), c_void_p, c_uint64, _u64p]),
    "kve_evictor_commit": (c_int32, [c_void_p, c_uint64]),
    "kve_evictor_seq_reset": (c_int32, [c_void_p, c_uint64]),
    "kve_evictor_seq_unprotect": (c_int32, [c_void_p, c_uint64]),
    "kve_evictor_get_stats": (c_int32, [c_void_p, c_uint64, P(kve_evictor_stats), c_uint32]),
    # sharded search
    "kve_search_init": (
        c_int32, [P(kve_search), P(kve_select_params), c_uint64, c_uint64, c_uint64, c_uint64]),
    "kve_histogram_clear": (c_int32, [P(kve_histogram)]),
    "kve_select_shard_workspace_size": (
        c_int32, [P(kve_select_params), c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_search_count_shard": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_uint64, P(kve_search), P(kve_histogram),
         c_void_p, c_uint64]),
    "kve_histogram_merge": (c_int32, [P(kve_histogram), P(kve_histogram)]),
    "kve_search_step": (c_int32, [P(kve_search), P(kve_histogram), P(c_int32)]),
    "kve_search_threshold": (c_int32, [P(kve_search), P(c_float)]),
    "kve_select_shard_output_len": (c_int32, [c_uint64, c_uint64, c_uint64, _u64p, _u64p]),
    "kve_select_shard": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_uint64, P(kve_search), c_void_p, c_uint64,
         c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_search_count_shard_linked": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_uint64, P(kve_search), c_void_p, c_uint64,
         c_float, P(kve_histogram), c_void_p, c_uint64]),
    "kve_select_shard_linked": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_uint64, P(kve_search), c_void_p, c_uint64,
         c_float, c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64]),
    # compaction
    "kve_compact_in_place": (
        c_int32, [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64]),
    "kve_compact_varlen": (
        c_int32,
        [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64, P(kve_tensor), c_void_p, c_uint64]),
    # paged caches
    "kve_paged_layout_init": (
        c_int32,
        [P(kve_paged_layout), c_uint32, c_void_p, c_uint64, c_uint32, c_uint64, c_uint64, c_uint64,
         c_uint64, c_uint64, c_uint64, c_uint32]),
    "kve_paged_gather_size": (c_int32, [P(kve_paged_layout), c_uint64, _u64p]),
    "kve_paged_gather": (
        c_int32,
        [P(kve_paged_layout), c_void_p, c_uint64, c_uint64, c_void_p, c_uint64, P(kve_tensor)]),
    "kve_paged_compact_workspace_size": (c_int32, [P(kve_paged_layout), _u64p]),
    "kve_paged_compact": (
        c_int32,
        [P(kve_paged_layout), c_void_p, c_uint64, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64,
         c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64, _u64p, c_void_p, c_uint64]),
}

# The device entry points (``src/capi/cuda.rs``; every pointer but the descriptor structs is
# a device pointer, ``stream`` a ``cudaStream_t``). Declared by every build (a build without
# CUDA answers KVE_ERR_NOT_BUILT_WITH_CUDA), but optional here: a library that predates them
# still loads, and ``kvevict.cuda`` reports them missing (see :func:`has`).
_CUDA_PROTOS = {
    "kve_cuda_get_device_count": (c_int32, [P(c_int32)]),
    "kve_cuda_score_workspace_size": (
        c_int32, [P(kve_score_params), c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_cuda_score_layer": (
        c_int32,
        [P(kve_score_params), P(kve_layer_inputs), c_void_p, c_uint64, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_select_model_workspace_size": (
        c_int32, [P(kve_select_params), c_uint64, c_uint64, c_uint64, c_uint64, _u64p]),
    "kve_cuda_select_model": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_void_p, c_uint64, c_void_p, c_uint64,
         c_uint64, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_compact_in_place_workspace_size": (c_int32, [P(kve_tensor), c_uint64, _u64p]),
    "kve_cuda_compact_in_place": (
        c_int32,
        [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_compact_to_varlen": (
        c_int32, [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_void_p, c_void_p, c_void_p]),
    "kve_cuda_compact_batch_in_place_workspace_size": (
        c_int32, [P(kve_compact_item), c_uint64, c_uint64, _u64p]),
    "kve_cuda_compact_batch_in_place": (
        c_int32, [P(kve_compact_item), c_uint64, c_uint64, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_prepare_gram_size": (c_int32, [c_uint64, c_uint32, c_uint32, _u64p]),
    "kve_cuda_prepare_gram": (
        c_int32, [c_void_p, c_uint64, c_uint32, c_uint32, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_score_layer_prepared": (
        c_int32,
        [P(kve_score_params), P(kve_layer_inputs), c_void_p, c_uint64, c_uint32, c_void_p, c_uint64,
         c_void_p, c_uint64, c_void_p]),
    "kve_cuda_value_links_workspace_size": (c_int32, [c_uint64, c_uint64, _u64p]),
    "kve_cuda_accumulate_value_links": (
        c_int32, [P(kve_tensor), c_void_p, c_uint64, c_void_p, c_uint64, c_void_p]),
    "kve_cuda_select_model_linked": (
        c_int32,
        [P(kve_select_params), P(kve_model_scores), c_void_p, c_uint64, c_float, c_void_p,
         c_uint64, c_void_p, c_uint64, c_uint64, c_void_p, c_uint64, c_void_p]),
    # the evictor's device form (``kve_cuda_evictor``: a host context over a device block)
    "kve_cuda_evictor_size": (c_int32, [P(kve_evictor_config), _u64p, _u64p]),
    "kve_cuda_evictor_init": (
        c_int32, [c_void_p, c_uint64, c_void_p, c_uint64, P(kve_evictor_config), P(c_void_p)]),
    "kve_cuda_evictor_get_requirements": (
        c_int32, [c_void_p, P(kve_evictor_requirements), c_uint32]),
    "kve_cuda_evictor_set_output_projection": (
        c_int32, [c_void_p, c_uint64, P(kve_tensor), c_void_p]),
    "kve_cuda_evictor_observe_queries": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_tensor), c_void_p]),
    "kve_cuda_evictor_plan": (c_int32, [c_void_p, c_uint64, c_uint64, _u64p]),
    "kve_cuda_evictor_begin": (c_int32, [c_void_p, c_uint64, c_uint64, c_uint64]),
    "kve_cuda_evictor_score_layer": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_evictor_layer), c_void_p]),
    "kve_cuda_evictor_select": (c_int32, [c_void_p, c_uint64, _u64p, c_void_p]),
    "kve_cuda_evictor_kept_lists": (
        c_int32, [c_void_p, c_uint64, P(c_void_p), P(c_void_p), _u64p]),
    "kve_cuda_evictor_compact": (c_int32, [c_void_p, c_uint64, c_uint64, P(kve_tensor), c_void_p]),
    "kve_cuda_evictor_score_layer_paged": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_evictor_paged_layer), c_void_p]),
    "kve_cuda_evictor_compact_paged": (
        c_int32, [c_void_p, c_uint64, c_uint64, P(kve_paged_layout), c_void_p, c_uint64, _u64p,
                  c_void_p]),
    "kve_cuda_evictor_run_round": (
        c_int32, [c_void_p, c_uint64, P(kve_evictor_round), c_void_p, c_uint64, _u64p, c_void_p]),
    "kve_cuda_evictor_commit": (c_int32, [c_void_p, c_uint64]),
    "kve_cuda_evictor_seq_reset": (c_int32, [c_void_p, c_uint64]),
    "kve_cuda_evictor_seq_unprotect": (c_int32, [c_void_p, c_uint64]),
    "kve_cuda_evictor_get_stats": (c_int32, [c_void_p, c_uint64, P(kve_evictor_stats), c_uint32]),
}


def _load():
    path = _find()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryNotFound(f"cannot load {path}: {e}") from e
    missing = []
    for name, (res, args) in _PROTOS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        f.restype = res
        f.argtypes = args
    if missing:
        raise LibraryNotFound(f"{path} lacks {', '.join(missing)} (an older library?)")
    optional = set()
    for name, (res, args) in _CUDA_PROTOS.items():
        f = getattr(lib, name, None)
        if f is None:
            continue
        f.restype = res
        f.argtypes = args
        optional.add(name)
    return lib, path, optional


lib, path, _present = _load()


def has(name):
    """Whether the loaded library exports the optional function ``name`` (``kve_cuda_*``)."""
    return name in _present
