// include/kvevict_ggml.hpp against a real ggml (the pristine llama.cpp's): a KV cache of ggml tensors on the CPU backend
// in the layouts llama.cpp uses (f32 / f16 / q8_0 rows read in place, V stored transposed, q5_0 scored on a dequantized
// copy, a q5_0 K beside a transposed bf16 V on a copy), the query rings written by a ggml graph, and one round of the
// glue against the same round run by hand through kvevict's C API on f32 copies of the same values: the kept cells
// must be the same. Then the policy the glue holds (the keep ratio's trigger, the prompt marks) and what it refuses.
// Built and run by tests/ggml_glue.rs; exits nonzero on a failure.
#include "kvevict_ggml.hpp"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

static int fails = 0;
#define CHECK(c, ...)                                                                  \
    do {                                                                               \
        if (!(c)) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);              \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            fails++;                                                                   \
        }                                                                              \
    } while (0)

constexpr int L = 2, HQ = 4, HKV = 2, HD = 32, D = 96, SIZE = 48, STREAMS = 2, WINDOW = 4, T = 6;
constexpr int ROW = HKV * HD;

// f32 values written into t (a [ne0, ...] tensor of any type ggml quantizes) row by row, and read back as the cache holds them
static std::vector<float> fill(ggml_tensor * t, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t ne0 = t->ne[0], rows = ggml_nrows(t);
    std::vector<float> src((size_t) ne0 * rows), back(src.size());
    for (auto & x : src) {
        x = nd(rng);
    }
    std::vector<uint8_t> bytes(ggml_nbytes(t));
    ggml_quantize_chunk(t->type, src.data(), bytes.data(), 0, rows, ne0, nullptr);
    ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
    const auto * tr = ggml_get_type_traits(t->type);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t * row = bytes.data() + r * ggml_row_size(t->type, ne0);
        if (t->type == GGML_TYPE_F32) {
            memcpy(back.data() + r * ne0, row, ne0 * sizeof(float));
        } else {
            tr->to_float(row, back.data() + r * ne0, ne0);
        }
    }
    return back;
}

// one round through the glue and the same round by hand; the kept cells of both
static void round_case(const char * method, ggml_type tk, ggml_type tv, bool v_trans, ggml_backend_t cpu) {
    std::mt19937 rng(7);
    const ggml_init_params ip = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context_ptr ctx(ggml_init(ip));
    kve_ggml::cache c;
    c.size = SIZE; c.v_trans = v_trans;
    std::vector<ggml_tensor *> wo;
    for (int li = 0; li < L; li++) {
        c.k.push_back(ggml_new_tensor_3d(ctx.get(), tk, ROW, SIZE, STREAMS));
        c.v.push_back(ggml_new_tensor_3d(ctx.get(), tv, ROW, SIZE, STREAMS));
        wo.push_back(ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, HQ * HD, D));
    }
    ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), cpu));
    std::vector<std::vector<float>> kf, vf, wf;
    for (int li = 0; li < L; li++) {
        kf.push_back(fill(c.k[li], rng));
        vf.push_back(fill(c.v[li], rng));
        wf.push_back(fill(wo[li], rng));
    }

    kve_ggml::evictor ev;
    std::string log;
    ev.set_log([](ggml_log_level, const char * text, void * user) { *(std::string *) user += text; }, &log);
    const char * why = ev.check(method, WINDOW, 0.0f, 0, 0.75f, 0.0f, 0);
    CHECK(!why, "%s", why);
    why = ev.init(c, STREAMS, HQ, HKV, HD, D, false, wo);
    CHECK(!why, "%s", why);
    CHECK(ev.host_mem() && ev.on_cpu() && !ev.device(), "a CPU cache");
    why = ev.alloc_rings(HQ * HD, STREAMS);
    CHECK(!why, "%s", why);
    CHECK(ev.captures() == (bool) ev.req.queries, "rings exactly for methods that read queries");

    // T queries of sequence 1 through a graph per layer (the ring keeps the last WINDOW), kept in f32 for the reference
    std::vector<std::vector<float>> qf(L);
    if (ev.captures()) {
        const ggml_init_params gp = { 8 * L * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        ggml_context_ptr gctx(ggml_init(gp));
        ggml_cgraph * gf = ggml_new_graph(gctx.get());
        ggml_tensor * idx = nullptr;
        std::vector<ggml_tensor *> q;
        for (int li = 0; li < L; li++) {
            q.push_back(ggml_new_tensor_3d(gctx.get(), GGML_TYPE_F32, HD, HQ, T));
            ggml_set_input(q[li]);
            ev.capture(gctx.get(), gf, li, q[li], idx);
        }
        ggml_backend_buffer_ptr gbuf(ggml_backend_alloc_ctx_tensors(gctx.get(), cpu));
        for (int li = 0; li < L; li++) {
            qf[li] = fill(q[li], rng);
        }
        CHECK(ev.ring_rows(std::vector<int32_t>(T, 1), idx), "ring rows");
        CHECK(ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS, "the capture graph");
        CHECK(ev.ring_count(1) == T && ev.ring_count(0) == 0, "ring counts %llu %llu",
              (unsigned long long) ev.ring_count(1), (unsigned long long) ev.ring_count(0));
    }
    for (int li = 0; li < L; li++) {
        std::vector<float> w((size_t) HQ * HD * D);
        CHECK(kve_ggml::weight_f32(wo[li], w.data()) && w == wf[li], "Wo read back as ggml dequantizes it");
    }

    // sequence 1: 40 cells of stream 1 in a shuffled order, positions 0..39
    kve_ggml::round_in r;
    r.seq = 1; r.stream = 1; r.target = 12;
    std::vector<uint32_t> cells(SIZE);
    for (uint32_t i = 0; i < SIZE; i++) {
        cells[i] = i;
    }
    std::shuffle(cells.begin(), cells.end(), rng);
    for (int32_t p = 0; p < 40; p++) {
        r.cell.push_back(cells[p]);
        r.pos.push_back(p);
    }
    CHECK(!ev.agnostic(r), "sequence 1 has its window queries");
    // the eviction: the round, the other cells handed to the engine's drop, the bookkeeping
    std::vector<uint32_t> dropped, kept;
    const int32_t evicted = ev.evict(c, r, "test", [&](const std::vector<uint32_t> & d) {
        dropped = d;
        return (int64_t) 16;
    });
    CHECK(evicted == 28 && dropped.size() == 28, "evicted %d, dropped %zu: %s", evicted, dropped.size(), log.c_str());
    for (uint32_t i = 0; i < 40; i++) {
        if (std::find(dropped.begin(), dropped.end(), r.cell[i]) == dropped.end()) {
            kept.push_back(i);
        }
    }
    CHECK(log.find("evict: seq 1: 40 -> 12 cells (test), n_kv 16") != std::string::npos, "the eviction's line: %s",
          log.c_str());

    // the reference: a host evictor of 40 cells, the rows as f32 token rows in position order (the cache's values)
    kve_evictor_config rc = ev.cfg;
    rc.max_cells = 40; rc.max_seqs = 1; rc.paged = 1; rc.paged_dtype = KVE_DTYPE_F32;
    uint64_t bytes = 0;
    CHECK(kve_evictor_size(&rc, &bytes) == KVE_OK, "reference size");
    std::vector<uint8_t> mem(bytes);
    kve_evictor * ref = nullptr;
    CHECK(kve_evictor_init(mem.data(), bytes, &rc, &ref) == KVE_OK, "reference init");
    if (ev.req.wo == KVE_WO_ONCE) {
        for (int li = 0; li < L; li++) {
            const kve_tensor wt = kve_ggml::tensor3(wf[li].data(), wf[li].size(), KVE_DTYPE_F32, {HQ, HD, D}, {HD, 1, HQ * HD});
            CHECK(kve_evictor_set_output_projection(ref, li, &wt) == KVE_OK, "reference Wo");
        }
    }
    std::vector<std::vector<float>> kr(L), vr(L), qr(L);
    std::vector<kve_tensor> keys(L), values(L), queries(L);
    for (int li = 0; li < L; li++) {
        for (int32_t i = 0; i < 40; i++) {
            const size_t s = (size_t) SIZE * ROW; // a stream's elements
            for (int j = 0; j < ROW; j++) {
                kr[li].push_back(kf[li][s + (size_t) r.cell[i] * ROW + j]);
                vr[li].push_back(vf[li][s + (v_trans ? (size_t) j * SIZE + r.cell[i] : (size_t) r.cell[i] * ROW + j)]);
            }
        }
        keys[li] = kve_ggml::tensor3(kr[li].data(), kr[li].size(), KVE_DTYPE_F32, {HKV, 40, HD}, {HD, ROW, 1});
        values[li] = kve_ggml::tensor3(vr[li].data(), vr[li].size(), KVE_DTYPE_F32, {HKV, 40, HD}, {HD, ROW, 1});
        if (ev.req.queries) {
            qr[li].assign(qf[li].end() - (size_t) WINDOW * HQ * HD, qf[li].end());
            queries[li] = kve_ggml::tensor3(qr[li].data(), qr[li].size(), KVE_DTYPE_F32, {HQ, WINDOW, HD},
                                                   {HD, HQ * HD, 1});
        }
    }
    kve_evictor_round rd;
    kve_evictor_round_init(&rd, sizeof rd);
    rd.n_cells = 40; rd.target = 12; rd.keys = keys.data(); rd.n_keys = L; rd.values = values.data(); rd.n_values = L;
    if (ev.req.queries) {
        rd.queries = queries.data(); rd.n_queries = L;
    }
    rd.positions = r.pos.data(); rd.n_positions = 40;
    std::vector<uint32_t> want(40);
    uint64_t count = 0;
    const int32_t rs = kve_evictor_run_round(ref, 0, &rd, want.data(), want.size(), &count);
    CHECK(rs == KVE_OK, "reference round: %s", kve_status_message(rs));
    want.resize(count);
    CHECK(kept == want, "%s %s/%s%s: the glue kept %zu cells, the reference %zu", method, ggml_type_name(tk),
          ggml_type_name(tv), v_trans ? " (V transposed)" : "", kept.size(), want.size());
    printf("%s %s/%s%s: %s, kept %zu of 40\n", method, ggml_type_name(tk), ggml_type_name(tv),
           v_trans ? " (V transposed)" : "", ev.round_path(), kept.size());
    r.target = 40;
    CHECK(ev.evict(c, r, "test", [](const std::vector<uint32_t> &) { return (int64_t) -1; }) == 0, "a target of all: no round");
    CHECK(ev.stats(1).evictions == 1 && ev.stats(1).cells_evicted == 40 - kept.size() && ev.stats(0).evictions == 0,
          "per-sequence counts");
    if (tv == GGML_TYPE_Q8_0) { // a transposed V of a block type: refused, nothing dropped
        kve_ggml::cache ct = c;
        ct.v_trans = true;
        r.target = 12;
        CHECK(ev.evict(ct, r, "test", [](const std::vector<uint32_t> &) { return (int64_t) 0; }) == kve_ggml::evictor::UNSUPPORTED &&
              std::string(ev.why()).find("transposed V") != std::string::npos, "a transposed q8_0 V: %s", ev.why());
    }
}

// the policy: the keep ratio's trigger after a prompt, the prompt marks, refusals
static void policy(ggml_backend_t cpu) {
    kve_ggml::evictor ev;
    CHECK(ev.check("uniqueness", 0, 0.5f, 0, 0.75f, 0.0f, 0) == nullptr, "keep ratio");
    CHECK(!ev.prompt_done(0, 10) && ev.prompt_done(0, 1) && !ev.prompt_done(0, 1), "the first decode after a prompt");
    CHECK(!ev.prompt_done(1, 1), "no prompt, no trigger");
    CHECK(ev.keep_cells(100, 0.5f) == 8 + (uint32_t) kve_budget_keep_ratio_total(100, 8, 0.5) && ev.keep_cells(5, 0.5f) == 5,
          "a keep ratio keeps the window and its share of the rest");
    // a decode's tokens: a prompt of seq 2 (4 tokens), then its first generated token with one of seq 3 -> seq 2 compressed
    std::vector<int32_t> compressed;
    auto tok = [](int32_t seq, int32_t pos) { return kve_ggml::batch_token{seq, pos, false}; };
    ev.decode({tok(2, 0), tok(2, 1), tok(2, 2), tok(2, 3)}, [&](int32_t seq) { compressed.push_back(seq); });
    ev.decode({tok(3, 0), tok(2, 4)}, [&](int32_t seq) { compressed.push_back(seq); });
    CHECK(compressed == std::vector<int32_t>{2}, "the keep ratio compresses seq 2 after its prompt, only");

    kve_ggml::evictor m;
    CHECK(m.check("uniqueness", 0, 0.0f, 64, 0.75f, 0.5f, 2) == nullptr, "cell budget, prompt marks");
    m.mark_prompt(0, 20, 0, 19, {0, 8, 15}); // system [0, 8), user + the reply's header [8, 20)
    using R = std::vector<std::pair<int32_t, int32_t>>;
    CHECK(m.marked(0) == (R{{0, 8}, {8, 20}}), "a range a message, the header joined to the one before");
    m.mark_prompt(0, 1, 20, 20, {});
    CHECK(m.marked(0) == (R{{0, 8}, {8, 20}}), "a generated token marks nothing");
    m.mark_prompt(0, 6, 10, 15, {}); // written again from 10: unmarked first, then one range (no starts)
    CHECK(m.marked(0) == (R{{0, 8}, {8, 10}, {10, 16}}), "rewritten text unmarked, then marked");
    m.mark_prompt(0, 4, 16, 19, {18}); // one start: it heads the range to the end
    CHECK(m.marked(0) == (R{{0, 8}, {8, 10}, {10, 16}, {18, 20}}), "the text before the first start unmarked");
    CHECK(m.mark(0, 5, 4, 0.5f) == KVE_ERR_INVALID_ARGUMENT && m.mark(0, 0, 4, 1.5f) == KVE_ERR_INVALID_ARGUMENT,
          "bad ranges and shares refused");
    m.forget(0);
    CHECK(m.marked(0).empty(), "forget drops the marks");
    // the same marks from a decode's tokens, two sequences in one batch; a decode of one token marks nothing
    std::vector<kve_ggml::batch_token> toks;
    for (int32_t p = 0; p < 20; p++) {
        toks.push_back({0, p, p == 0 || p == 8 || p == 15});
        toks.push_back({1, 100 + p, p == 4});
    }
    m.decode(toks, [](int32_t) {});
    m.decode({{0, 20, false}}, [](int32_t) {});
    CHECK(m.marked(0) == (R{{0, 8}, {8, 20}}) && m.marked(1) == (R{{104, 120}}), "decode marks each sequence's prompt");

    kve_ggml::evictor bad;
    CHECK(bad.check("bogus", 0, 0.0f, 64, 0.75f, 0.0f, 0) != nullptr, "unknown method");
    CHECK(bad.check(nullptr, 0, 0.0f, 0, 0.75f, 0.5f, 0) != nullptr, "links without eviction");
    CHECK(bad.check("uniqueness", 0, 0.0f, 64, 0.75f, 0.0f, 3) != nullptr, "mark_split 3");
    (void) cpu;
}

int main() {
    ggml_backend_ptr cpu(ggml_backend_cpu_init());
    for (const char * method : {"uniqueness", "snapkv", "laprox-span"}) {
        round_case(method, GGML_TYPE_F16, GGML_TYPE_F16, false, cpu.get());
        round_case(method, GGML_TYPE_F16, GGML_TYPE_F16, true, cpu.get());
        round_case(method, GGML_TYPE_F32, GGML_TYPE_F32, true, cpu.get());
        round_case(method, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, false, cpu.get());
        round_case(method, GGML_TYPE_Q5_0, GGML_TYPE_Q5_0, false, cpu.get());
        round_case(method, GGML_TYPE_Q5_0, GGML_TYPE_BF16, true, cpu.get()); // a copy with V transposed (no flash attention)
    }
    policy(cpu.get());
    printf("%s: %d failed\n", fails ? "FAILED" : "ok", fails);
    return fails ? 1 : 0;
}
