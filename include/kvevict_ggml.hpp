// kvevict on ggml: what an engine built on ggml (llama.cpp and its forks) needs to run kvevict's evictor on its own
// KV cache, so that its adapter keeps only what is its own (where the cache and the batches live). Header-only C++17,
// compiled with the engine's ggml (its headers on the include path; link ggml and kvevict).
//
//   kve_ggml::evictor ev;                 // the host form (kve_evictor_*), or the device form (kve_cuda_evictor_*)
//   ev.init(cfg, cache, force_device);     //   when the whole cache is in one CUDA0 buffer type
//   ev.alloc_rings(n_head * head_dim);     // query rings next to the K caches (methods that read queries)
//   ... graph: ev.capture(ctx, gf, layer, q, idx) after each layer's post-RoPE query; before compute ev.ring_rows(...)
//   ev.target(seq, positions, incoming, prompt) // how many cells seq keeps now (keep ratio, budget), or all of them
//   ev.evict(cache, cells, reason, drop)   // one eviction: the round, the engine's drop of the other cells, the log
//
// The cache as ggml holds it (llama.cpp's layout): per layer a K tensor [row, size, streams] (row = Hkv x head_dim,
// one cell a row) and a V tensor of the same shape, or stored transposed (element (cell i, dim j) of a stream at
// j * size + i). Rows whose dtype kvevict reads (f32, f16, bf16, q8_0 / q4_0 whole blocks a head) are read in place
// in host memory; other types, and device memory for the host form, are dequantized into a copy of the sequence's
// rows by ggml's type traits. The policy around a round (which sequences, when, the keep ratio's trigger after a
// prompt, the engine's marks, the question-agnostic fallback for a sequence without window queries) is here too,
// so that every ggml engine runs the same one; docs/llama-cpp.md says how llama.cpp's fork calls it.
#pragma once

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "kvevict.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kve_ggml {

// kvevict's dtype of a cache type whose rows it reads and moves as they are (a block type: whole blocks a head); -1:
// none (scored on a dequantized copy)
inline int32_t dtype_of(ggml_type t, int64_t head_dim) {
    const bool blocks = head_dim % 32 == 0;
    return t == GGML_TYPE_F32 ? KVE_DTYPE_F32 : t == GGML_TYPE_F16 ? KVE_DTYPE_F16 : t == GGML_TYPE_BF16 ? KVE_DTYPE_BF16 :
        t == GGML_TYPE_Q8_0 && blocks ? KVE_DTYPE_Q8_0 : t == GGML_TYPE_Q4_0 && blocks ? KVE_DTYPE_Q4_0 : -1;
}

// the buffer holding t's data (a view's is its source's)
inline ggml_backend_buffer_t buffer_of(const ggml_tensor * t) {
    return t->view_src ? t->view_src->buffer : t->buffer;
}

// a kve_tensor of `len` elements of dtype at data: its three axes' extents e and element strides st
inline kve_tensor tensor3(const void * data, uint64_t len, int32_t dtype, std::array<uint64_t, 3> e,
                          std::array<uint64_t, 3> st) {
    kve_tensor x = {};
    x.data = data; x.len = len; x.dtype = dtype;
    std::copy(e.begin(), e.end(), x.extent); std::copy(st.begin(), st.end(), x.stride);
    return x;
}

// w (row j: output feature j's inputs) of a weight the CPU holds repacked for its matrix kernels (an extra buffer
// type: not host memory, no get_tensor): w = W·I, identity columns in chunks, by the CPU backend
inline bool weight_by_matmul(ggml_tensor * wt, float * w) {
    const int64_t in = wt->ne[0], d = wt->ne[1], m = std::min<int64_t>(in, 256);
    const ggml_init_params ip = { 3 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_backend_ptr cpu(ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr));
    ggml_tensor * x = ctx && cpu ? ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, in, m) : nullptr;
    ggml_tensor * y = x ? ggml_mul_mat(ctx.get(), wt, x) : nullptr;
    ggml_cgraph * gf = y ? ggml_new_graph(ctx.get()) : nullptr;
    ggml_backend_buffer_ptr buf(gf ? ggml_backend_alloc_ctx_tensors(ctx.get(), cpu.get()) : nullptr);
    if (!buf) {
        return false;
    }
    ggml_build_forward_expand(gf, y);
    std::vector<float> id((size_t) in * m), out((size_t) d * m);
    for (int64_t c0 = 0; c0 < in; c0 += m) {
        std::fill(id.begin(), id.end(), 0.0f);
        for (int64_t c = 0; c < m && c0 + c < in; c++) {
            id[(size_t) c * in + c0 + c] = 1.0f;
        }
        ggml_backend_tensor_set(x, id.data(), 0, id.size() * sizeof(float));
        if (ggml_backend_graph_compute(cpu.get(), gf) != GGML_STATUS_SUCCESS) {
            return false;
        }
        ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
        for (int64_t c = 0; c < m && c0 + c < in; c++) { // y[c][j] = W[j][c0 + c]
            for (int64_t j = 0; j < d; j++) {
                w[(size_t) j * in + c0 + c] = out[(size_t) c * d + j];
            }
        }
    }
    return true;
}

// a weight [in, out] of any type ggml dequantizes, in any buffer (host, device, CPU-repacked), as f32 rows: false if
// it cannot be read
inline bool weight_f32(ggml_tensor * wt, float * w) {
    const auto * tr = ggml_get_type_traits(wt->type);
    if (!wt->buffer || !wt->data || (wt->type != GGML_TYPE_F32 && !tr->to_float)) {
        return false;
    }
    const ggml_backend_dev_t bd = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(wt->buffer));
    if (!ggml_backend_buffer_is_host(wt->buffer) && (!bd || ggml_backend_dev_type(bd) == GGML_BACKEND_DEVICE_TYPE_CPU)) {
        return weight_by_matmul(wt, w);
    }
    std::vector<uint8_t> raw(ggml_nbytes(wt));
    ggml_backend_tensor_get(wt, raw.data(), 0, raw.size());
    if (wt->type == GGML_TYPE_F32) {
        memcpy(w, raw.data(), (size_t) ggml_nelements(wt) * sizeof(float));
    } else {
        tr->to_float(raw.data(), w, ggml_nelements(wt));
    }
    return true;
}

// the engine's KV cache, as the evictor reads it (see the top of this file)
struct cache {
    std::vector<ggml_tensor *> k, v; // per evictor layer
    uint32_t size = 0;               // cells a stream
    bool v_trans = false;
    int64_t rot_k = 0, rot_v = 0;    // K and V rows stored Hadamard-rotated in blocks of this many (0: not)
};

// an eviction round of one sequence: its cells (the cache's, in position order), and what the round kept
struct round_in {
    int32_t seq = 0;         // the sequence: its bookkeeping (marks, ring, protection)
    uint32_t stream = 0;     // the cache stream holding its cells
    std::vector<uint32_t> cell;
    std::vector<int32_t> pos; // ascending, distinct
    uint32_t target = 0;     // cells to keep
    bool restored = false;   // the cells of a restored state (no window queries of its own): question-agnostic
};

// a token of a decode, as the policy reads it: its sequence, its position, and whether it starts a message (a control
// token that ends no generation: <|im_start|>, <start_of_turn>, BOS)
struct batch_token {
    int32_t seq = 0, pos = 0;
    bool starts = false;
};

// per sequence: what the engine sees in its stats
struct seq_stats {
    uint32_t evictions = 0;
    uint64_t cells_evicted = 0;
};

class evictor {
public:
    static constexpr uint32_t MARK_PROMPTS = 2; // mark_split 2: the spans' split, each prompt's messages marked here
    static constexpr size_t DEV_ALIGN = 256;    // the device block's alignment, and the scratch's regions'
    static constexpr int32_t UNSUPPORTED = -1;  // a status of round() and mark(): the cache or form cannot (why())

    kve_evictor_config cfg = {};    // the parameters' reading (check), shaped by init
    kve_evictor_requirements req = {};
    uint32_t window = 8, max_cells = 0, mark_split = KVE_MARK_SPLIT_SHARE;
    double t_score_ms = 0, t_compact_ms = 0; // totals (scoring and selection are one call, run_round)
    uint32_t evictions = 0;

    evictor() = default;
    evictor(const evictor &) = delete; // (it owns ggml buffers)
    evictor & operator=(const evictor &) = delete;
    ~evictor() { release(); }

    // where the glue's messages go (ggml's log callback: the engine's logger), and what it is told after each eviction
    void set_log(ggml_log_callback cb, void * user) { log_cb = cb; log_user = user; }
    std::function<void(int32_t seq, uint32_t before, uint32_t after, double ms, const char * reason)> on_evict;

    // the engine's eviction parameters read by the library into cfg and req: null, or why they are refused.
    // (A kvevict cell is one token of every head, as a ggml KV cache's.)
    const char * check(const char * method, uint32_t window_, float keep, uint32_t max_cells_, float evict_to,
                       float links, uint32_t mark_split_) {
        kve_evictor_options o = {};
        o.struct_size = sizeof o;
        o.flags = KVE_OPTIONS_NO_WO_EVERY_ROUND | KVE_OPTIONS_TOKEN_CELLS;
        o.method = method; o.window = window_; o.keep_ratio = keep; o.max_cells = max_cells_; o.evict_to = evict_to;
        o.link_threshold = links;
        const char * why = nullptr;
        if (kve_evictor_options_apply(&o, &cfg, sizeof cfg, &req, sizeof req, &why) != KVE_OK) {
            return why;
        }
        const bool on = (method && *method) || keep != 0.0f || max_cells_ > 0;
        if (!on && links > 0.0f) {
            return "KV value links need eviction (a method, a keep ratio or a cell budget)";
        }
        if (on && kve_version() != KVE_VERSION_NUMBER) {
            return "kvevict header/library version mismatch";
        }
        if (mark_split_ > MARK_PROMPTS) {
            return "kv_evict_mark_split must be 0 (one selection over the marked cells), 1 (split over the marked ranges) "
                   "or 2 (1, each prompt marked)";
        }
        if (!on && mark_split_ != 0) {
            return "kv_evict_mark_split (--kv-mark-prompts) needs eviction (a method, a keep ratio or a cell budget)";
        }
        window = req.window; // the engine's window, else the preset's
        max_cells = max_cells_;
        mark_split = mark_split_;
        return nullptr;
    }
    const char * method() const { return kve_preset_name(cfg.preset); }
    // the settings check() read, in one log line
    void log_settings() const {
        log(GGML_LOG_LEVEL_INFO, "kvevict: KV eviction '%s', window %u, keep %.3f, max cells %u (evicted down to %llu), value "
            "links %.2f\n", method(), window, cfg.policy == KVE_POLICY_KEEP_RATIO ? cfg.keep_ratio : 0.0, max_cells,
            (unsigned long long) cfg.low, cfg.link_threshold);
    }
    bool device() const { return dev != nullptr; }
    bool host_mem() const { return host_mem_; }
    bool on_cpu() const { return cpu_; }
    size_t bytes() const { return mem.size() + (dev_block ? ggml_backend_buffer_get_size(dev_block) : 0); }
    // what a keep ratio in (0, 1] keeps of `cells` cells: the window and that share of the cells before it
    uint32_t keep_cells(uint32_t cells, float keep) const {
        const uint32_t w = std::min(window, cells);
        return (uint32_t) kve_budget_keep_ratio_total(cells, w, keep) + w;
    }
    // the most a ubatch may hold under the budget: what an eviction frees
    uint32_t ubatch_cap() const { return max_cells - (uint32_t) cfg.low; }

    // the evictor for the cache's cells (every stream, max_seqs sequences) of a model of `layers` layers with hq
    // query heads, hkv KV heads of head_dim and a residual width d_model: the device form when every K/V tensor is in
    // one CUDA0 buffer type (force_device: any one type); null, or why not
    // wo: each layer's attention output weight, read at the first round if the method needs it (LaProx)
    const char * init(const cache & kv, uint32_t max_seqs, int32_t hq, int32_t hkv, int32_t head_dim, int32_t d_model,
                      bool force_device, std::vector<ggml_tensor *> wo = {}) {
        const char * why = setup(kv, max_seqs, hq, hkv, head_dim, d_model, force_device);
        wo_ = std::move(wo);
        if (!why) {
            const uint32_t pol = cfg.policy;
            log(GGML_LOG_LEVEL_INFO, "kvevict: evictor '%s' (%s): %u cells x %u sequences, window %u, %s, %.2f MiB\n",
                method(), dev ? "device form, kve_cuda_evictor_*" : "kve_evictor_*", kv.size, max_seqs, window,
                pol == KVE_POLICY_KEEP_RATIO ? "keep ratio on what is new" : pol == KVE_POLICY_CELLS ? "cell budget" : "explicit",
                bytes() / 1048576.0);
        }
        return why;
    }
    // the query rings (methods that read queries): per layer an f32 tensor [row, max_seqs*window + 1] in its K cache's
    // buffer type; row seq*window + slot holds a query of seq (slot = arrival % window), the last row takes the others.
    // Null, or why not; bytes_out: their size
    const char * alloc_rings(int64_t row, uint32_t max_seqs) {
        size_t bytes = 0;
        if (!req.queries) {
            log(GGML_LOG_LEVEL_INFO, "kvevict: no query capture ('%s' reads no queries)\n", method());
            return nullptr;
        }
        ring_n.assign(max_seqs, 0);
        qrow = row;
        const int64_t rows = (int64_t) max_seqs * window + 1;
        std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_of; // one context and buffer per buffer type
        qring.assign(c_.k.size(), nullptr);
        for (size_t li = 0; li < c_.k.size(); li++) {
            ggml_context *& ctx = ctx_of[ggml_backend_buffer_get_type(buffer_of(c_.k[li]))];
            if (!ctx) {
                const ggml_init_params ip = { c_.k.size() * ggml_tensor_overhead(), nullptr, true };
                if (!(ctx = ggml_init(ip))) {
                    return "cannot make a ggml context for the query rings";
                }
                qring_ctx.emplace_back(ctx);
            }
            qring[li] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, row, rows);
            ggml_format_name(qring[li], "kv_evict_qring-%zu", li);
        }
        for (const auto & [buft, ctx] : ctx_of) {
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
            if (!buf) {
                return "cannot allocate the query rings";
            }
            ggml_backend_buffer_clear(buf, 0);
            bytes += ggml_backend_buffer_get_size(buf);
            qring_buf.emplace_back(buf);
        }
        log(GGML_LOG_LEVEL_INFO, "kvevict: query capture in the graph: rings of %u queries x %u sequences in %zu layers, %.2f MiB\n",
            window, max_seqs, c_.k.size(), bytes / 1048576.0);
        return nullptr;
    }
    bool captures() const { return !qring.empty(); }

    // in a graph: layer li's post-RoPE queries q [head_dim, n_head, n_tokens] written into its ring at the rows in idx
    // (an I64 input of n_tokens, made here on the first call of a graph, then set by ring_rows before each compute).
    // Expanded now, as the KV cache's own set_rows, so that the query is written right after it is computed
    void capture(ggml_context * ctx, ggml_cgraph * gf, size_t li, ggml_tensor * q, ggml_tensor *& idx) {
        const int64_t n_tokens = q->ne[2];
        if (!idx) {
            idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_tokens);
            ggml_set_input(idx);
            ggml_set_name(idx, "kv_evict_qrows");
        }
        q = ggml_is_contiguous(q) ? q : ggml_cont(ctx, q);
        q = ggml_reshape_2d(ctx, q, qrow, n_tokens);
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, qring[li], q, idx));
    }
    // whether q is a layer's post-RoPE query the rings take: [head_dim, n_head, n_tokens, 1] f32
    bool takes_query(size_t li, const ggml_tensor * q, int64_t n_tokens) const {
        return li < qring.size() && q->op == GGML_OP_ROPE && q->type == GGML_TYPE_F32 && q->ne[0] == hd &&
               q->ne[1] == n_head && q->ne[2] == n_tokens && q->ne[3] == 1;
    }
    // before a compute: each token's ring row (seq: each token's sequence, -1 none); only each sequence's last
    // `window` queries stay in its ring, the others go to the scratch row (never read)
    bool ring_rows(const std::vector<int32_t> & seq, ggml_tensor * idx) {
        std::vector<int64_t> rows(seq.size());
        if (kve_query_ring_rows(ring_n.data(), ring_n.size(), window, seq.data(), seq.size(), rows.data(), rows.size()) !=
            KVE_OK) {
            return false;
        }
        ggml_backend_tensor_set(idx, rows.data(), 0, rows.size() * sizeof(int64_t));
        return true;
    }

    // Wo of every layer ([Hq*head_dim, d_model] ggml weights, any type and buffer), dequantized, handed to the evictor
    // once, before the first round (LaProx); null, or why not
    const char * set_output_projection(const std::vector<ggml_tensor *> & wo) {
        if (wo_set || req.wo != KVE_WO_ONCE) {
            return nullptr;
        }
        const int64_t in = (int64_t) n_head * hd, d = cfg.d_model;
        std::vector<float> w((size_t) in * d);
        for (size_t li = 0; li < wo.size(); li++) {
            if (!wo[li] || wo[li]->ne[0] != in || wo[li]->ne[1] != d || !weight_f32(wo[li], w.data())) {
                return "a layer's attn_output weight is not of shape [Hq*head_dim, d_model] in memory that ggml reads";
            }
            // V rows are stored rotated (v' = H v in blocks of rot_v), so |v Wo| = |v' (H Wo)|: Wo's inputs rotated once
            if (c_.rot_v > 0) {
                kve_hadamard_blocks(w.data(), w.size(), c_.rot_v);
            }
            const kve_tensor wt = tensor3(w.data(), w.size(), KVE_DTYPE_F32,
                    {(uint64_t) n_head, (uint64_t) hd, (uint64_t) d}, {(uint64_t) hd, 1, (uint64_t) in});
            const int32_t st = dev ? kve_cuda_evictor_set_output_projection(dev, li, &wt, nullptr)
                                   : kve_evictor_set_output_projection(kev, li, &wt);
            if (st != KVE_OK) {
                return status("kve_evictor_set_output_projection", st);
            }
        }
        wo_set = true;
        return nullptr;
    }

    // Per decode, before it runs, its tokens: for each of its sequences in ascending order, compress(seq) when the keep
    // ratio compresses it now (prompt_done), then, with mark_split 2, its prompt marked (mark_prompt)
    void decode(const std::vector<batch_token> & toks, const std::function<void(int32_t seq)> & compress) {
        std::map<int32_t, std::array<int32_t, 3>> n; // per sequence: tokens, first and last position
        for (const batch_token & t : toks) {
            auto it = n.try_emplace(t.seq, std::array<int32_t, 3>{0, t.pos, t.pos}).first;
            it->second = {it->second[0] + 1, std::min(it->second[1], t.pos), std::max(it->second[2], t.pos)};
        }
        for (const auto & [seq, c] : n) {
            if (prompt_done(seq, (uint32_t) c[0])) {
                compress(seq);
            }
            if (mark_split == MARK_PROMPTS) {
                std::vector<int32_t> starts;
                for (const batch_token & t : toks) {
                    if (t.seq == seq && t.starts) {
                        starts.push_back(t.pos);
                    }
                }
                mark_prompt(seq, (uint32_t) c[0], c[1], c[2], std::move(starts));
            }
        }
    }
    // Per decode of n tokens of seq: true when the keep ratio compresses the sequence now (the first one-token decode
    // after a prompt)
    bool prompt_done(int32_t seq, uint32_t n) {
        const bool compress = cfg.policy == KVE_POLICY_KEEP_RATIO && n == 1 && pending_prompt[seq];
        pending_prompt[seq] = n > 1;
        return compress;
    }
    // Per decode with mark_split 2 (the engine marks each prompt here): seq's n tokens at positions p0..p1; starts: the
    // positions of those that start a message (a control token that ends no generation: <|im_start|>,
    // <start_of_turn>, BOS). What is written again is unmarked first; then each message of a prompt (n > 1) is marked:
    // the text before the first start (the last reply's end) is left unmarked, the last start (the reply's header)
    // joins the message before it, a prompt without starts is one range
    void mark_prompt(int32_t seq, uint32_t n, int32_t p0, int32_t p1, std::vector<int32_t> starts) {
        auto & m = marks[seq];
        for (auto & r : m) {
            r.second = std::min(r.second, p0);
        }
        m.erase(std::remove_if(m.begin(), m.end(), [](const auto & r) { return r.second <= r.first; }), m.end());
        if (n > 1) {
            std::sort(starts.begin(), starts.end());
            if (starts.size() > 1) {
                starts.pop_back();
            }
            if (starts.empty()) {
                starts.push_back(p0);
            }
            starts.push_back(p1 + 1);
            for (size_t i = 0; i + 1 < starts.size(); i++) {
                mark(seq, starts[i], starts[i + 1], 1.0f);
            }
        }
    }

    // the cells seq keeps of its cells at positions pos (ascending) and `incoming` more: the keep ratio on what is new
    // since its last compression (prompt), else the budget, else all. The cells the last compression kept must all be
    // there, else (a rewound or reused sequence) all are new again
    uint64_t target(int32_t seq, const std::vector<int32_t> & pos, uint32_t incoming, bool prompt) {
        const uint64_t all = pos.size() + incoming;
        kve_evictor_stats es = {};
        call_stats(seq, es);
        if (es.protected_cells > 0) {
            const auto it = kept_to.find(seq);
            const uint64_t held = it == kept_to.end() ? 0 :
                    (uint64_t) (std::upper_bound(pos.begin(), pos.end(), it->second) - pos.begin());
            if (held != es.protected_cells) {
                unprotect(seq);
            }
        }
        uint64_t t = all;
        if (prompt || cfg.policy == KVE_POLICY_CELLS) {
            if (dev ? kve_cuda_evictor_plan(dev, seq, all, &t) : kve_evictor_plan(kev, seq, all, &t)) {
                t = all;
            }
        } else if (max_cells > 0 && all > max_cells) {
            // a keep ratio and a cell budget: the budget evicts over every cell, the ratio's kept ones included
            unprotect(seq);
            t = cfg.low;
        }
        return t;
    }

    // llama_kv_evict_mark's: positions [p0, p1) of seq hold text the user gave, share of each round's kept cells
    // reserved for them (< 0: kvevict's default); p0 < 0 forgets seq's marks. KVE_OK or a KVE_ERR_* status
    int32_t mark(int32_t seq, int32_t p0, int32_t p1, float share) {
        if (p0 < 0) {
            marks.erase(seq);
            return KVE_OK;
        }
        if (seq < 0 || p1 < p0 || !(share < 0.0f || share <= 1.0f)) {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        if (dev) {
            why_ = "the device form takes no marks";
            return UNSUPPORTED;
        }
        mark_share[seq] = share < 0.0f ? KVE_MARK_SHARE_DEFAULT : share;
        if (p1 > p0) {
            marks[seq].emplace_back(p0, p1);
        }
        return KVE_OK;
    }

    // seq's marked position ranges [p0, p1), in the order marked
    const std::vector<std::pair<int32_t, int32_t>> & marked(int32_t seq) { return marks[seq]; }

    // seq's cells are of another text now (a state read into it): its window, marks and protection are gone
    void forget(int32_t seq) {
        if ((size_t) seq < ring_n.size()) {
            ring_n[seq] = 0;
        }
        pending_prompt.erase(seq);
        if (dev ? kve_cuda_evictor_seq_reset(dev, seq) : kve_evictor_seq_reset(kev, seq)) {}
        kept_to.erase(seq);
        marks.erase(seq);
    }

    // whether seq's cells are scored question-agnostically (uniqueness): a restored state, or fewer window queries
    // captured since its cells came than the window (cells copied from another sequence or restored)
    bool agnostic(const round_in & r) const {
        const uint64_t n_q = !r.restored && (size_t) r.seq < ring_n.size() ? ring_n[r.seq] : 0;
        return r.restored || (req.queries && n_q < std::min<uint64_t>(window, r.cell.size()));
    }

    // One eviction of r.seq's cells in cache kv down to r.target (cells in position order): nothing if r.target or the
    // window holds them all; else the round, then drop(the other cells) by the engine (it returns the attention span
    // it has after, -1 if it dropped nothing), then the bookkeeping, the log line and on_evict. The cells evicted, or
    // UNSUPPORTED / KVEVICT (the message logged). The cache's writes must be finished
    static constexpr int32_t KVEVICT = -2;
    int32_t evict(const cache & kv, const round_in & r, const char * reason,
                  const std::function<int64_t(const std::vector<uint32_t> &)> & drop) {
        const uint32_t n = (uint32_t) r.cell.size();
        if (r.target >= n || n <= std::min(window, n)) {
            return 0;
        }
        for (uint32_t i = 1; i < n; i++) {
            if (r.pos[i] == r.pos[i - 1]) {
                log(GGML_LOG_LEVEL_ERROR, "kvevict: KV eviction needs one cell per position and sequence\n");
                return UNSUPPORTED;
            }
        }
        if (!r.restored && agnostic(r)) {
            log(GGML_LOG_LEVEL_INFO, "kvevict: seq %d: %llu of its %u window queries captured (cells copied or restored): scored "
                "with 'uniqueness'\n", r.seq, (unsigned long long) ring_count(r.seq), std::min(window, n));
        }
        if (!wo_ready()) { // at the first eviction (a context made only to measure memory has no weights to read)
            const int64_t t0 = ggml_time_us();
            if (const char * why = set_output_projection(wo_)) {
                log(GGML_LOG_LEVEL_ERROR, "kvevict: %s\n", why);
                return UNSUPPORTED;
            }
            log(GGML_LOG_LEVEL_INFO, "kvevict: LaProx Gram blocks of %zu layers in %.1f ms (once per context)\n", wo_.size(),
                1e-3 * (double) (ggml_time_us() - t0));
        }
        std::vector<uint32_t> kept, dropped;
        const int32_t st = round(kv, r, kept);
        if (st != KVE_OK) {
            log(GGML_LOG_LEVEL_ERROR, "kvevict: sequence %d: %s\n", r.seq, why());
            return st == UNSUPPORTED ? UNSUPPORTED : KVEVICT;
        }
        for (uint32_t i = 0, j = 0; i < n; i++) { // the kept positions' cells stay; the sequence leaves the others
            if (j < kept.size() && kept[j] == i) {
                j++;
            } else {
                dropped.push_back(r.cell[i]);
            }
        }
        const int64_t n_kv = drop(dropped);
        if (n_kv < 0) {
            return UNSUPPORTED;
        }
        committed(r.seq, n, (uint32_t) kept.size(), r.pos[kept.back()]);
        const double ms = since_round_ms();
        log(GGML_LOG_LEVEL_INFO, "evict: seq %d: %u -> %zu cells (%s), n_kv %lld (score %.2f ms, select %.2f ms, compact %.2f "
            "ms; evictions %u, most cells held %u; %zu marked ranges; %s)\n", r.seq, n, kept.size(), reason, (long long) n_kv,
            round_ms(), 0.0, ms - round_ms(), evictions, cells_max, last_ranges, round_path());
        if (on_evict) {
            on_evict(r.seq, n, (uint32_t) kept.size(), ms, reason);
        }
        return (int32_t) (n - kept.size());
    }
    // a ubatch of n tokens placed for seq, which then holds `cells` (the largest such count is in the eviction lines)
    void placed(int32_t seq, uint64_t cells, uint32_t n) {
        if (cells > cells_max) {
            cells_max = (uint32_t) cells;
            log(GGML_LOG_LEVEL_INFO, "place: seq %d: %u cells with this ubatch of %u tokens (budget %u; most cells held %u)\n", seq,
                cells_max, n, max_cells, cells_max);
        }
    }

    // One eviction round of r.seq's cells in cache kv (or, r.restored, a host copy of the state restored into r.seq:
    // its stream 0 and slot 0): kept gets the kept cells (ascending indices into r.cell). KVE_OK, UNSUPPORTED (why()
    // says why) or the library's status; the engine then drops the others and calls committed(). Wo must be set
    // (wo_ready) and the cache's writes finished
    int32_t round(const cache & kv, const round_in & r, std::vector<uint32_t> & kept) {
        const uint32_t n = (uint32_t) r.cell.size();
        for (const ggml_tensor * t : {kv.k[0], kv.v[0]}) {
            if (t->type != GGML_TYPE_F32 && !ggml_get_type_traits(t->type)->to_float) {
                why_ = std::string("KV eviction cannot dequantize a ") + ggml_type_name(t->type) + " cache";
                return UNSUPPORTED;
            }
        }
        if (kv.v_trans && ggml_blck_size(kv.v[0]->type) != 1) { // (element by element: no blocks across cells)
            why_ = std::string("KV eviction reads a transposed V cache of f32, f16 or bf16, not ") + ggml_type_name(kv.v[0]->type);
            return UNSUPPORTED;
        }
        // no window of its own: scored by a question-agnostic host evictor (uniqueness; the method itself if it
        // reads no queries), in its slot 0
        std::vector<uint8_t> agn_mem;
        kve_evictor * agn = nullptr;
        if ((last_agnostic = agnostic(r))) {
            kve_evictor_config c = shaped(n, 1);
            c.preset = req.queries ? KVE_PRESET_UNIQUENESS : cfg.preset; c.policy = KVE_POLICY_EXPLICIT; c.link_threshold = 0.0f;
            uint64_t bytes = 0;
            int32_t st = kve_evictor_size(&c, &bytes);
            if (st != KVE_OK || (agn_mem.resize(bytes), st = kve_evictor_init(agn_mem.data(), bytes, &c, &agn)) != KVE_OK) {
                why_ = std::string("the question-agnostic evictor: ") + kve_status_message(st);
                return st;
            }
        }
        kve_cuda_evictor * const d = agn ? nullptr : dev;
        kve_evictor * const e = agn ? agn : kev;
        const int32_t es = agn ? 0 : r.seq;
        // K/V rows read as they are (by cell; the device form: f32/f16/bf16, K and V alike), else a dequantized copy of
        // the sequence's rows (uploaded for the device form)
        const int32_t k_dt = dtype_of(kv.k[0]->type, hd), v_dt = dtype_of(kv.v[0]->type, hd);
        const bool direct = d ? k_dt == v_dt && (uint32_t) k_dt <= KVE_DTYPE_BF16 : k_dt >= 0 && v_dt >= 0 && (host_mem_ || r.restored);
        t0_us = ggml_time_us();
        const uint64_t hkv = n_head_kv, hd_ = hd;
        const size_t rows_b = aligned((size_t) n * hkv * hd_ * sizeof(float)); // (the device form's copy: a layer's K, V)
        if (d && !direct && (!dev_scratch || ggml_backend_buffer_get_size(dev_scratch) < 2 * rows_b + DEV_ALIGN)) {
            if (dev_scratch) {
                ggml_backend_buffer_free(dev_scratch);
            }
            dev_scratch = ggml_backend_buft_alloc_buffer(ggml_backend_buffer_get_type(dev_block), 2 * rows_b + DEV_ALIGN);
            if (!dev_scratch) {
                why_ = "cannot allocate the device scratch for a dequantized copy";
                return UNSUPPORTED;
            }
        }
        const uint32_t size = kv.size;
        // layer li's K or V as the cache holds it, every cell of the stream: [Hkv, size, hd] (V transposed: element
        // (cell i, dim j) at j*size + i)
        auto view = [&](size_t li, bool is_v, kve_tensor & x) {
            const ggml_tensor * t = is_v ? kv.v[li] : kv.k[li];
            const bool tr = is_v && kv.v_trans;
            x = tensor3((const char *) t->data + r.stream * t->nb[2], (uint64_t) size * t->ne[0], is_v ? v_dt : k_dt,
                    {hkv, size, hd_}, {tr ? hd_ * size : hd_, tr ? 1 : (uint64_t) t->ne[0], tr ? size : 1});
        };
        // else the sequence's rows in position order, dequantized to f32 token rows (host or device memory)
        std::vector<uint8_t> raw;
        const uint32_t max_cell = *std::max_element(r.cell.begin(), r.cell.end());
        auto gather = [&](const ggml_tensor * t, bool trans, std::vector<float> & dst, kve_tensor & x, size_t off_d) {
            const int64_t ne0 = t->ne[0];
            const size_t eb = trans ? ggml_type_size(t->type) : ggml_row_size(t->type, ne0);
            const auto * tr = ggml_get_type_traits(t->type);
            dst.resize((size_t) n * ne0);
            raw.resize(trans ? (size_t) ne0 * size * eb : ((size_t) max_cell + 1) * eb);
            ggml_backend_tensor_get(t, raw.data(), (size_t) r.stream * t->nb[2], raw.size());
            for (uint32_t i = 0; i < n; i++) {
                float * out = dst.data() + (size_t) i * ne0;
                if (!trans && t->type == GGML_TYPE_F32) {
                    memcpy(out, raw.data() + (size_t) r.cell[i] * eb, ne0 * sizeof(float));
                } else if (!trans) {
                    tr->to_float(raw.data() + (size_t) r.cell[i] * eb, out, ne0);
                }
                // transposed V (f32, f16 or bf16: ggml quantizes V only with flash attention, which stores it by rows)
                for (int64_t j = 0; trans && j < ne0; j++) {
                    const uint8_t * el = raw.data() + ((size_t) j * size + r.cell[i]) * eb;
                    if (t->type == GGML_TYPE_F32) {
                        memcpy(&out[j], el, sizeof(float));
                    } else {
                        tr->to_float(el, &out[j], 1);
                    }
                }
            }
            x = tensor3(d ? upload(off_d, dst.data(), dst.size() * sizeof(float)) : (const char *) dst.data(), dst.size(),
                    KVE_DTYPE_F32, {hkv, n, hd_}, {hd_, (uint64_t) ne0, 1});
        };
        kve_evictor_requirements rq;
        int32_t st = d ? kve_cuda_evictor_get_requirements(d, &rq, sizeof rq) : kve_evictor_get_requirements(e, &rq, sizeof rq);
        const uint32_t wq = std::min(rq.window, n);
        // layer li's last wq window queries, oldest first, f32 into q (from the ring, in runs of consecutive slots)
        auto queries = [&](size_t li, float * q, kve_tensor & x) {
            for (uint32_t j = 0, slot, cnt; j < wq; j += cnt) {
                slot = (uint32_t) ((ring_n[es] - wq + j) % window);
                cnt = std::min(wq - j, window - slot);
                ggml_backend_tensor_get(qring[li], q + j * qrow, ((size_t) es * window + slot) * qrow * sizeof(float),
                        cnt * qrow * sizeof(float));
            }
            if (kv.rot_k > 0) { // K rows are stored rotated (k' = H k): q' = H q gives the same logits
                kve_hadamard_blocks(q, wq * qrow, kv.rot_k);
            }
            x = tensor3(q, wq * qrow, KVE_DTYPE_F32, {(uint64_t) n_head, wq, hd_}, {hd_, (uint64_t) qrow, 1});
        };
        // layer li's K/V in place (direct) or their dequantized copy (one layer at a time, in buffers reused for every
        // layer), and its window queries (host memory: the device form uploads them): what the round asks for
        std::vector<float> copies[2], q((size_t) wq * qrow);
        auto fill = [&](size_t li, kve_evictor_layer & l) {
            for (int v = 0; v < 1 + (int) rq.values; v++) {
                const ggml_tensor * t = v ? kv.v[li] : kv.k[li];
                direct ? view(li, v, v ? l.values : l.keys) : gather(t, v && kv.v_trans, copies[v], v ? l.values : l.keys, v * rows_b);
            }
            if (rq.queries) {
                queries(li, q.data(), l.queries);
            }
        };
        std::vector<int32_t> ranges; // the engine's marks: position ranges [p0, p1)
        for (const auto & [a, b] : marks[r.seq]) {
            ranges.insert(ranges.end(), {a, b});
        }
        uint64_t count = 0;
        kept.assign(n, 0);
        if (st == KVE_OK) {
            // one round (kve_evictor_run_round, or its device form): each layer's views from fill when the library
            // reaches it, the kept cells back in host memory
            kve_evictor_round rd;
            kve_evictor_round_init(&rd, sizeof rd);
            rd.cells = direct ? r.cell.data() : nullptr; rd.n_cells = n; rd.target = r.target;
            rd.fill = [](void * f, uint64_t li, kve_evictor_layer * l) -> int32_t {
                try { (*(decltype(fill) *) f)((size_t) li, *l); } catch (...) { return 1; } // (no exception into the library)
                return 0;
            };
            rd.fill_layers = kv.k.size(); rd.user = &fill;
            rd.positions = r.pos.data(); rd.n_positions = n; rd.mark_ranges = ranges.data(); rd.n_mark_ranges = ranges.size();
            rd.mark_share = mark_share[r.seq];
            rd.mark_split = ranges.empty() ? KVE_MARK_SPLIT_SHARE : std::min(mark_split, (uint32_t) KVE_MARK_SPLIT_SPANS);
            st = d ? kve_cuda_evictor_run_round(d, es, &rd, kept.data(), n, &count, nullptr)
                   : kve_evictor_run_round(e, es, &rd, kept.data(), n, &count);
        }
        t1_us = ggml_time_us();
        kept.resize(st == KVE_OK ? count : 0);
        last_ranges = ranges.size() / 2;
        last_direct = direct;
        st = st == KVE_OK && count == 0 ? KVE_ERR_INVALID_ARGUMENT : st;
        if (st != KVE_OK) {
            why_ = std::string("kvevict evictor round: ") + kve_status_message(st);
        }
        return st;
    }

    // after the engine dropped a round's other cells: the kept ones (the last at position kept_last) are protected
    // from the keep ratio (after a question-agnostic round, all are new again), the counts and times
    void committed(int32_t seq, uint32_t n_before, uint32_t n_after, int32_t kept_last) {
        if (last_agnostic) {
            unprotect(seq);
        } else {
            if (dev ? kve_cuda_evictor_commit(dev, seq) : kve_evictor_commit(kev, seq)) {}
            kept_to[seq] = kept_last;
        }
        const int64_t t2 = ggml_time_us();
        t_score_ms   += 1e-3 * (double) (t1_us - t0_us); // (scoring and selection in one call)
        t_compact_ms += 1e-3 * (double) (t2 - t1_us);
        evictions++;
        seq_stats_[seq].evictions++;
        seq_stats_[seq].cells_evicted += n_before - n_after;
    }
    // the last round's: ms scoring and selecting, ms since it started; marked ranges; path ("kve_*", ...)
    double round_ms() const { return 1e-3 * (double) (t1_us - t0_us); }
    double since_round_ms() const { return 1e-3 * (double) (ggml_time_us() - t0_us); }
    const char * round_path() const {
        return dev && !last_agnostic ? (last_direct ? "device path, kve_cuda_*" : "device path, kve_cuda_* on a dequantized copy")
                                     : last_direct ? "host path, kve_*" : "host path, dequantized copy";
    }
    seq_stats stats(int32_t seq) const {
        const auto it = seq_stats_.find(seq);
        return it == seq_stats_.end() ? seq_stats() : it->second;
    }
    uint64_t ring_count(int32_t seq) const { return (size_t) seq < ring_n.size() ? ring_n[seq] : 0; }

    // whether the rounds may run: Wo set once if the method reads it (set_output_projection)
    bool wo_ready() const { return wo_set || req.wo != KVE_WO_ONCE; }
    // why the last call that failed did
    const char * why() const { return why_.c_str(); }

private:
    // init's work: the form and its memory
    const char * setup(const cache & kv, uint32_t max_seqs, int32_t hq, int32_t hkv, int32_t head_dim, int32_t d_model,
                       bool force_device) {
        c_ = kv; n_head = hq; n_head_kv = hkv; hd = head_dim;
        cfg.layers = kv.k.size(); cfg.hq = hq; cfg.hkv = hkv; cfg.dk = cfg.dv = head_dim; cfg.d_model = d_model;
        const kve_evictor_config c = shaped(kv.size, max_seqs);
        ggml_backend_buffer_type_t buft = nullptr;
        bool one_type = true;
        host_mem_ = cpu_ = true;
        for (size_t li = 0; li < kv.k.size(); li++) {
            for (const ggml_tensor * t : {kv.k[li], kv.v[li]}) {
                const ggml_backend_buffer_t buf = t ? buffer_of(t) : nullptr;
                if (!buf) {
                    return "a layer has no K/V cache in memory";
                }
                one_type = one_type && (!buft || buft == ggml_backend_buffer_get_type(buf));
                buft = ggml_backend_buffer_get_type(buf);
                host_mem_ = host_mem_ && ggml_backend_buffer_is_host(buf);
                // (the CPU buffer type has no device: ggml_backend_cpu_buffer_type's FIXME)
                const ggml_backend_dev_t bd = ggml_backend_buft_get_device(buft);
                cpu_ = cpu_ && (buft == ggml_backend_cpu_buffer_type() || (bd && ggml_backend_dev_type(bd) == GGML_BACKEND_DEVICE_TYPE_CPU));
            }
        }
        if (force_device || (one_type && !host_mem_ && strcmp(ggml_backend_buft_name(buft), "CUDA0") == 0)) {
            if (!one_type) {
                return "the device path needs the whole KV cache in one buffer type (is it partly offloaded?)";
            }
            const char * why = init_device(c, buft);
            return why || mark_split != MARK_PROMPTS ? why :
                "the device path takes no marks: run without kv_evict_mark_split 2 (--kv-mark-prompts)";
        }
        // (a cache in another device's memory is scored on a host copy of its rows, compacted as bytes)
        uint64_t n = 0;
        int32_t st = kve_evictor_size(&c, &n);
        if (st == KVE_OK) {
            mem.resize(n);
            st = kve_evictor_init(mem.data(), n, &c, &kev);
        }
        return st == KVE_OK ? nullptr : status("kve_evictor_init", st);
    }

    cache c_;
    int32_t n_head = 0, n_head_kv = 0, hd = 0;
    int64_t qrow = 0;
    std::vector<uint8_t> mem;
    kve_evictor * kev = nullptr;
    kve_cuda_evictor * dev = nullptr;
    ggml_backend_buffer_t dev_block = nullptr, dev_scratch = nullptr;
    bool host_mem_ = true, cpu_ = true, wo_set = false;
    std::string why_;
    std::vector<ggml_tensor *> wo_;
    uint32_t cells_max = 0;
    ggml_log_callback log_cb = nullptr;
    void * log_user = nullptr;

    void log(ggml_log_level level, const char * fmt, ...) const {
        if (!log_cb) {
            return;
        }
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        log_cb(level, buf, log_user);
    }
    std::vector<ggml_tensor *> qring;
    std::vector<ggml_context_ptr> qring_ctx;
    std::vector<ggml_backend_buffer_ptr> qring_buf;
    std::vector<uint64_t> ring_n; // per sequence: queries written so far (kve_query_ring_rows)
    std::map<int32_t, bool> pending_prompt; // sequences whose last decode was a prompt
    std::map<int32_t, int32_t> kept_to;      // per sequence: the last position its last compression kept
    std::map<int32_t, std::vector<std::pair<int32_t, int32_t>>> marks;
    std::map<int32_t, float> mark_share;
    std::map<int32_t, seq_stats> seq_stats_;
    int64_t t0_us = 0, t1_us = 0;
    bool last_agnostic = false, last_direct = false;
    size_t last_ranges = 0;

    static size_t aligned(size_t n) { return (n + DEV_ALIGN - 1) & ~(DEV_ALIGN - 1); }
    const char * status(const char * what, int32_t st) {
        why_ = std::string(what) + ": " + kve_status_message(st);
        return why_.c_str();
    }
    // cfg for `cells` cells x `seqs` sequences of this cache: the host form's round gathers the rows it reads as they
    // are into its context (f16-sized, or f32)
    kve_evictor_config shaped(uint64_t cells, uint64_t seqs) const {
        kve_evictor_config c = cfg;
        c.max_cells = cells; c.max_seqs = seqs;
        const int32_t k = dtype_of(c_.k[0]->type, hd), v = dtype_of(c_.v[0]->type, hd);
        c.paged = std::min(k, v) >= 0;
        c.paged_dtype = k == KVE_DTYPE_F32 || v == KVE_DTYPE_F32 ? KVE_DTYPE_F32 : KVE_DTYPE_F16;
        return c;
    }
    const char * init_device(const kve_evictor_config & c, ggml_backend_buffer_type_t buft) {
        uint64_t hb = 0, db = 0;
        int32_t count = 0, st = kve_cuda_evictor_size(&c, &hb, &db);
        if (st == KVE_ERR_NOT_BUILT_WITH_CUDA) {
            return "the KV cache is on the device path (CUDA0 memory, or forced), but kvevict was built without CUDA "
                   "(cargo feature cuda or cuda-emu)";
        }
        if (st == KVE_OK && (kve_cuda_get_device_count(&count) != KVE_OK || count < 1)) {
            return "the KV cache is on the device path (CUDA0 memory, or forced), but kvevict sees no CUDA device";
        }
        if (st == KVE_OK) {
            mem.resize(hb);
            dev_block = ggml_backend_buft_alloc_buffer(buft, db + DEV_ALIGN);
            st = dev_block ? kve_cuda_evictor_init(mem.data(), hb,
                    (void *) aligned((size_t) ggml_backend_buffer_get_base(dev_block)), db, &c, &dev) : KVE_ERR_OUTPUT_TOO_SMALL;
        }
        return st == KVE_OK ? nullptr : status("kve_cuda_evictor_init", st);
    }
    // to dev_scratch + off: its device address
    char * upload(size_t off, const void * src, size_t bytes) {
        char * at = (char *) aligned((size_t) ggml_backend_buffer_get_base(dev_scratch)) + off;
        ggml_tensor t = {}; // a tensor over those bytes, for ggml_backend_tensor_set on a device address
        t.type = GGML_TYPE_I8; t.buffer = dev_scratch; t.data = at;
        t.ne[0] = (int64_t) bytes; t.ne[1] = t.ne[2] = t.ne[3] = 1;
        t.nb[0] = 1; t.nb[1] = t.nb[2] = t.nb[3] = bytes;
        ggml_backend_tensor_set(&t, src, 0, bytes);
        return at;
    }
    int32_t call_stats(int32_t seq, kve_evictor_stats & es) {
        return dev ? kve_cuda_evictor_get_stats(dev, seq, &es, sizeof es) : kve_evictor_get_stats(kev, seq, &es, sizeof es);
    }
    void unprotect(int32_t seq) {
        if (dev ? kve_cuda_evictor_seq_unprotect(dev, seq) : kve_evictor_seq_unprotect(kev, seq)) {}
        kept_to.erase(seq);
    }
    void release() {
        if (dev_scratch) {
            ggml_backend_buffer_free(dev_scratch);
        }
        if (dev_block) {
            ggml_backend_buffer_free(dev_block);
        }
        dev_scratch = dev_block = nullptr;
    }
};

} // namespace kve_ggml
