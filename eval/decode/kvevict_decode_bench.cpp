// kvevict_decode_bench: decode-time eviction measured through the kvevict fork of llama.cpp
// (issue 28): streaming perplexity and conversation recall under a KV cell budget, through the
// fork's real decode path (llama_decode; under kv_max_cells the fork places each batch one
// ubatch at a time and evicts a sequence to floor(F*C) cells before a ubatch would take it past
// C), against the full cache and llama.cpp's own context shift (n_keep first tokens kept, the
// oldest half of the rest dropped: llama_memory_seq_rm + llama_memory_seq_add, as the unpatched
// tools/completion does it), implemented here at the same cell count.
//
// Public llama.h API only, plus the fork's llama_context_params fields (kv_evict_method,
// kv_max_cells, kv_evict_to, kv_evict_window, kv_evict_links, kv_evict_mark_split) and llama_kv_evict_* calls.
//
//   kvevict_decode_bench -m MODEL --mode ppl  --input TEXT.txt --method M --budget C [options]
//   kvevict_decode_bench -m MODEL --mode chat --input CHAT.tsv --method M --budget C [options]
//     [--mark user|prompt [--mark-share S]]: positions marked through llama_kv_evict_mark (the
//     engine's signal of what the user gave), S of kept cells reserved for their cells. user: the
//     user and system turns; prompt: llama-server's proxy, every token a prompt batch wrote (all
//     but the assistant's reply text, which a server generates one token a batch). The marks are
//     given again after every restore of a snapshot (the fork forgets a restored sequence's marks).
//     [--mark-cap K]: only the oldest K marked tokens are marked (an engine that favours older user text)
//     [--mark-split spans|none]: how the marked cells' budget is spent (the fork's kv_evict_mark_split):
//     spans, split evenly over the marked ranges (a turn each, KVE_MARK_SPLIT_SPANS), or none (default),
//     one selection over every marked cell; or prompts (chat, without --mark), what llama-server's --kv-mark-prompts
//     does: the fork marks each message of each multi-token decode as a range (kv_evict_mark_split 2, share 1:
//     a message from each control token that ends no generation) and the tool marks nothing, feeding as a server does: the text before each assistant reply in one llama_decode (the reply's
//     template end, the user turns, the next reply's start), the reply's text a token a call (generated)
//     [--mark-ranges merged|messages]: the marked ranges as given to llama_kv_evict_mark: merged (default), a
//     range that touches the one before extends it (the system prompt and the first user turn one range), or
//     messages, each message's (template turn's) range its own, as an engine that knows its messages marks them
//     (with --mark-split spans: a span each)
//     [--mark facts|values]: a diagnosis only (an oracle, no engine knows this): the turns that tell the facts
//     (F records) / only the values' tokens in them marked
//     [--kept]: each question's record says how many cells of its fact's turn and of its value the
//     (full-attention) cache holds at the checkpoint, read from the sequence's saved state
//
// M: "full" (no eviction, the whole text in the cache), "ctxshift" (llama.cpp's context shift),
// or a method of the fork (llama_kv_evict_method_names()). One JSON object on stdout per run
// (ppl) or per question (chat), then a summary object; diagnostics on stderr.
//
// Chat input (UTF-8, one record a line, fields separated by TAB; "\n", "\t", "\\" escaped):
//   M <role> <content>                       a message of the history (system, user, assistant)
//   Q <id> <question> <answer prefix> <value> [<distractor> ...]
//   F <id> <i>                               question id's fact is told in message i (0-based among the M
//                                            records): the question is asked only at checkpoints after it
//     [--facts-by N]: every fact must be told within the history's first N tokens (the budget C: at a
//     checkpoint of k x C each fact is then at least (k - 1) x C tokens old); a fact told later is said
//     on stderr and in the summary's note, and the run goes on
// After the history, for each question (from a snapshot of the sequence's state, restored each
// time): the candidates' log-likelihoods after "<question turn><prefix>" and a greedy answer.
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct options {
    std::string model, mode = "ppl", input, method = "full";
    int budget = 0;            // C: cells (0 = none; "full" ignores it)
    float evict_to = 0.75f;    // F: the fork's kv_evict_to
    int window = 0;            // the fork's kv_evict_window (0 = its default)
    float links = 0.0f;        // the fork's kv_evict_links
    int n_keep = -1;           // ctxshift: tokens kept at the front (-1: llama.cpp's default, 0 + BOS)
    int chunk = 0;             // tokens per llama_decode call (0: C - floor(F*C), or 64 without a budget)
    int max_tokens = 0;        // ppl: tokens read from the text (0: the model's trained context)
    int skip = -1;             // ppl: NLL averaged over tokens at index >= skip (-1: the budget)
    int gen = 12;              // chat: greedy answer tokens
    int threads = 1;
    int flash = -1;            // -1 auto, 0 off, 1 on
    std::vector<int> at;       // chat: ask every question when the history reaches these token counts
    std::string nll_out;       // ppl: per-token NLL written here (f32, one per token, token 0 = NaN)
    std::string mark = "none"; // chat: "user" (user and system turns) or "prompt" (all but the assistant's replies) marked
    int mark_cap = -1;         // chat, with --mark: only the first K marked tokens are marked (older text first; -1: all)
    int prompt_tokens = -1;    // ppl, with --mark: the text's first P tokens marked (-1: the budget)
    float mark_share = -1.0f;  // chat, with --mark: the share of kept cells reserved for them (< 0: kvevict's default)
    std::string mark_split = "none"; // with --mark: "spans" (the marked budget split over the marked ranges) or "none";
                                     // "prompts" (chat, no --mark): the fork marks each prompt (kv_evict_mark_split 2)
    std::string mark_ranges = "merged"; // chat, with --mark: "merged" (touching ranges one) or "messages" (a range each)
    std::string chat_template; // chat: a llama.cpp template name or text (default: the model's own, else llama.cpp's chatml)
    int facts_by = -1;         // chat: every fact (F records) told within the history's first N tokens, else said (-1: no check)
    bool kept = false;         // chat: each question's record says how many of its fact's cells are held at the checkpoint
};

double cpu_ms() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
double wall_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

std::string json_str(const std::string & s) {
    std::string r = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { r += '\\'; r += (char) c; }
        else if (c == '\n') r += "\\n";
        else if (c == '\t') r += "\\t";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); r += b; }
        else r += (char) c;
    }
    return r + "\"";
}

std::string unescape(const std::string & s) {
    std::string r;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            char c = s[++i];
            r += c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
            r += s[i];
        }
    }
    return r;
}

std::vector<std::string> split_tab(const std::string & line) {
    std::vector<std::string> f;
    size_t a = 0;
    while (true) {
        size_t b = line.find('\t', a);
        f.push_back(unescape(line.substr(a, b == std::string::npos ? std::string::npos : b - a)));
        if (b == std::string::npos) break;
        a = b + 1;
    }
    return f;
}

// log-softmax of one logits row at token t
double logprob(const float * logits, int n_vocab, llama_token t) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = std::max(mx, logits[i]);
    double s = 0.0;
    for (int i = 0; i < n_vocab; i++) s += std::exp((double) logits[i] - mx);
    return (double) logits[t] - mx - std::log(s);
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special, bool special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, add_special, special);
    std::vector<llama_token> t(std::max(n, 0));
    if (n > 0 && llama_tokenize(vocab, text.data(), (int32_t) text.size(), t.data(), n, add_special, special) != n) {
        t.clear();
    }
    return t;
}

std::string piece(const llama_vocab * vocab, llama_token t) {
    char buf[256];
    int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
    return n > 0 ? std::string(buf, n) : std::string();
}

struct evict_log {
    int count = 0;
    double ms = 0.0;
    uint32_t most_after = 0;
};

void on_evict(const llama_kv_evict_event * e, void * user) {
    auto * l = (evict_log *) user;
    l->count++;
    l->ms += e->ms;
    l->most_after = std::max(l->most_after, e->cells_after);
}

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) {
        fputs(text, stderr);
    }
}

// One sequence (seq 0) fed through llama_decode, with the budget policy of the method.
struct runner {
    const options & o;
    llama_model * model = nullptr;
    const llama_vocab * vocab = nullptr;
    llama_context * ctx = nullptr;
    llama_memory_t mem = nullptr;
    int n_vocab = 0;
    bool fork = false, shift = false; // eviction by the fork's budget / llama.cpp's context shift
    int budget = 0, chunk = 64, n_keep = 0;
    llama_pos n_past = 0;             // next position
    int cells = 0;                    // cells the sequence holds (ctxshift and full: n_past)
    int most_cells = 0, shifts = 0;
    double decode_cpu = 0, decode_wall = 0;
    evict_log ev;
    llama_batch batch{};
    std::string refused;              // why the configuration cannot run (reported, not fatal)

    explicit runner(const options & op) : o(op) {}

    bool load() {
        auto mp = llama_model_default_params();
        model = llama_model_load_from_file(o.model.c_str(), mp);
        if (!model) { fprintf(stderr, "cannot load %s\n", o.model.c_str()); return false; }
        vocab = llama_model_get_vocab(model);
        n_vocab = llama_vocab_n_tokens(vocab);
        return true;
    }

    bool init(int n_ctx_full) {
        fork = o.method != "full" && o.method != "ctxshift";
        shift = o.method == "ctxshift";
        budget = o.method == "full" ? 0 : o.budget;
        if (fork || shift) {
            if (budget <= 0) { refused = "a budget (--budget C > 0) is needed for method " + o.method; return true; }
        }
        if (o.chunk > 0) chunk = o.chunk;
        else if (budget > 0) chunk = std::max(1, budget - (int) std::floor(o.evict_to * budget));
        n_keep = o.n_keep >= 0 ? o.n_keep : 0;
        if (shift && llama_vocab_get_add_bos(vocab) && o.n_keep < 0) n_keep += 1; // llama.cpp keeps the BOS
        if (fork) {
            if (const char * err = llama_kv_evict_check_params(o.method.c_str(), (uint32_t) o.window, 0.0f,
                                                               (uint32_t) budget, o.evict_to, o.links)) {
                refused = std::string("the fork refuses these parameters: ") + err;
                return true;
            }
        }
        if (shift && n_keep + chunk >= budget) {
            refused = "context shift needs n_keep + chunk < budget (n_keep " + std::to_string(n_keep) + ", chunk " +
                      std::to_string(chunk) + ", budget " + std::to_string(budget) + ")";
            return true;
        }
        auto cp = llama_context_default_params();
        cp.n_ctx = shift ? (uint32_t) budget : (uint32_t) n_ctx_full;
        cp.n_batch = std::max(chunk, 512);
        cp.n_ubatch = std::min(cp.n_batch, (uint32_t) 512);
        cp.n_seq_max = 1;
        cp.n_threads = o.threads;
        cp.n_threads_batch = o.threads;
        cp.flash_attn_type = (llama_flash_attn_type) o.flash;
        cp.no_perf = true;
        if (fork) {
            cp.kv_evict_method = o.method.c_str();
            cp.kv_evict_window = (uint32_t) o.window;
            cp.kv_max_cells = (uint32_t) budget;
            cp.kv_evict_to = o.evict_to;
            cp.kv_evict_links = o.links;
            cp.kv_evict_mark_split = o.mark_split == "prompts" ? 2 : o.mark_split == "spans" ? 1 : 0;
            cp.kv_evict_cb = on_evict;
            cp.kv_evict_cb_data = &ev;
        }
        ctx = llama_init_from_model(model, cp);
        if (!ctx) { fprintf(stderr, "llama_init_from_model failed\n"); return false; }
        mem = llama_get_memory(ctx);
        if (shift && !llama_memory_can_shift(mem)) {
            refused = "this model's memory cannot shift (llama_memory_can_shift)";
        }
        batch = llama_batch_init(std::max(chunk, 512), 0, 1);
        return true;
    }

    ~runner() {
        if (batch.token) llama_batch_free(batch);
        if (ctx) llama_free(ctx);
        if (model) llama_model_free(model);
    }

    // llama.cpp's context shift (tools/completion): before n tokens that would fill the context
    void maybe_shift(int n) {
        if (!shift || n_past + n < budget) return;
        const int n_left = (int) n_past - n_keep;
        const int n_discard = n_left / 2;
        llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard);
        llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard);
        n_past -= n_discard;
        cells = (int) n_past;
        shifts++;
    }

    // feeds toks in calls of at most `chunk` tokens (ctxshift, ppl) or `max_call`; logits of every
    // token when all_logits, else of the last; on_logits(index in toks, logits row) for each
    bool feed(const std::vector<llama_token> & toks, bool all_logits, int max_call,
              const std::function<void(size_t, const float *)> & on_logits) {
        size_t i = 0;
        while (i < toks.size()) {
            int n = (int) std::min<size_t>(toks.size() - i, (size_t) (shift || all_logits ? chunk : max_call));
            maybe_shift(n);
            batch.n_tokens = 0;
            for (int j = 0; j < n; j++) {
                batch.token[j] = toks[i + j];
                batch.pos[j] = n_past + j;
                batch.n_seq_id[j] = 1;
                batch.seq_id[j][0] = 0;
                batch.logits[j] = all_logits || (i + j + 1 == toks.size());
            }
            batch.n_tokens = n;
            const double c0 = cpu_ms(), w0 = wall_ms();
            const int rc = llama_decode(ctx, batch);
            decode_cpu += cpu_ms() - c0;
            decode_wall += wall_ms() - w0;
            if (rc != 0) { fprintf(stderr, "llama_decode returned %d\n", rc); return false; }
            n_past += n;
            update_cells();
            for (int j = 0; j < n; j++) {
                if (batch.logits[j]) on_logits(i + j, llama_get_logits_ith(ctx, j));
            }
            i += n;
        }
        return true;
    }

    void update_cells() {
        if (fork) {
            llama_kv_evict_stats st{};
            if (llama_kv_evict_get_stats(ctx, 0, &st) == 0) cells = (int) st.cells;
        } else {
            cells = (int) n_past;
            if (shift) cells = (int) n_past; // positions [0, n_past) after a shift are all held
        }
        most_cells = std::max(most_cells, cells);
    }

    double evict_ms() const {
        if (!fork) return 0.0;
        llama_kv_evict_stats st{};
        if (llama_kv_evict_get_stats(ctx, 0, &st) != 0) return 0.0;
        return st.t_score_ms + st.t_select_ms + st.t_compact_ms;
    }

    std::string cost_json() const {
        char b[512];
        const double e = evict_ms();
        snprintf(b, sizeof b,
                 "\"decode_cpu_ms\":%.1f,\"decode_wall_ms\":%.1f,\"evict_ms\":%.1f,\"evict_share_cpu\":%.4f,"
                 "\"evictions\":%d,\"shifts\":%d,\"most_cells\":%d,\"chunk\":%d,\"n_keep\":%d",
                 decode_cpu, decode_wall, e, decode_cpu > 0 ? e / decode_cpu : 0.0, ev.count, shifts, most_cells,
                 chunk, shift ? n_keep : 0);
        return b;
    }
};

// a configuration the tool cannot run (a budget the fork refuses, ...): said, recorded, exit 0
template <class Head> int report_refused(const runner & r, Head head) {
    fprintf(stderr, "kvevict_decode_bench: %s\n", r.refused.c_str());
    head("refused", r.refused);
    printf("}\n");
    return 0;
}

std::string read_file(const std::string & p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

int run_ppl(const options & o) {
    runner r(o);
    const std::string text = read_file(o.input);
    // the full cache needs the whole text: n_ctx from the text (capped at the trained context)
    if (!r.load()) return 1;
    std::vector<llama_token> toks = tokenize(r.vocab, text, true, false);
    const int n_train = llama_model_n_ctx_train(r.model);
    const int cap = o.max_tokens > 0 ? std::min(o.max_tokens, n_train) : n_train;
    if ((int) toks.size() > cap) toks.resize(cap);
    const int n = (int) toks.size();
    if (!r.init(n + 64)) return 1;
    const int skip = o.skip >= 0 ? o.skip : r.budget;
    auto head = [&](const char * status, const std::string & note) {
        printf("{\"mode\":\"ppl\",\"method\":%s,\"budget\":%d,\"evict_to\":%.3f,\"tokens\":%d,\"skip\":%d,"
               "\"mark_split\":%s,\"status\":\"%s\",\"note\":%s", json_str(o.method).c_str(), r.budget, o.evict_to, n,
               skip, json_str(o.mark_split).c_str(), status, json_str(note).c_str());
    };
    if (!r.refused.empty()) return report_refused(r, head);
    std::string note;
    if (r.budget > 0 && n <= r.budget) {
        note = "the text (" + std::to_string(n) + " tokens) does not exceed the budget (" + std::to_string(r.budget) +
               " cells): nothing is evicted and no token lies beyond the budget";
        fprintf(stderr, "kvevict_decode_bench: %s\n", note.c_str());
    }
    // --mark prompt in ppl mode: the text's first P tokens (--prompt-tokens, default C) marked as a prompt batch's,
    // the rest as generated text (llama-server's proxy on a long generation after a prompt)
    if (o.mark != "none" && r.fork) {
        const llama_pos p1 = (llama_pos) std::min(n, o.prompt_tokens >= 0 ? o.prompt_tokens : r.budget);
        if (llama_kv_evict_mark(r.ctx, 0, 0, p1, o.mark_share) < 0) {
            head("error", "llama_kv_evict_mark failed"); printf("}\n"); return 1;
        }
    }
    std::vector<float> nll(n, NAN);
    const bool ok = r.feed(toks, true, r.chunk, [&](size_t i, const float * row) {
        if (i + 1 < (size_t) n) nll[i + 1] = (float) -logprob(row, r.n_vocab, toks[i + 1]);
    });
    if (!ok) {
        head("error", "llama_decode failed");
        printf(",%s}\n", r.cost_json().c_str());
        return 1;
    }
    double s = 0.0;
    int m = 0;
    for (int i = std::max(skip, 1); i < n; i++) { s += nll[i]; m++; }
    if (!o.nll_out.empty()) {
        FILE * f = fopen(o.nll_out.c_str(), "wb");
        if (f) { fwrite(nll.data(), sizeof(float), nll.size(), f); fclose(f); }
    }
    head(m > 0 ? "ok" : "no-tokens-scored", note);
    printf(",\"scored\":%d,\"nll\":%.6f,\"ppl\":%.4f,%s}\n", m, m ? s / m : NAN, m ? std::exp(s / m) : NAN,
           r.cost_json().c_str());
    return 0;
}

struct question {
    std::string id, text, prefix;
    std::vector<std::string> cands; // [0] = the value
    long told_msg = -1;             // the message that tells the fact (F record; -1: not given, asked everywhere)
    size_t told = 0;                // the history's tokens up to the end of that message's turn
    size_t turn0 = 0;               // where that turn starts (its tokens: [turn0, told))
    size_t val0 = 0, val1 = 0;      // the value's tokens in it ([val0, val1); val1 == 0: not found)
};

// --kept: the positions a sequence's state holds in its first cache (llama_state_seq_get_data: a magic word and
// the sequence id, then llama_kv_cache::state_write: the stream
// count, each stream's cell count, then each cell's pos, n_seq_id, seq ids; an iSWA cache writes its
// full-attention cache first). Empty when the bytes do not read as that (then the records say null).
std::vector<llama_pos> state_positions(const std::vector<uint8_t> & b, llama_pos n_past) {
    std::vector<llama_pos> out;
    size_t off = 0;
    auto rd = [&](void * dst, size_t n) {
        if (off + n > b.size()) return false;
        memcpy(dst, b.data() + off, n);
        off += n;
        return true;
    };
    uint32_t magic = 0, n_stream = 0, count = 0;
    int32_t seq_id = -1;
    if (!rd(&magic, 4) || !rd(&seq_id, 4) || seq_id != 0) return {};
    if (!rd(&n_stream, 4) || n_stream == 0 || n_stream > 64) return {};
    for (uint32_t s = 0; s < n_stream && count == 0; s++) {
        if (!rd(&count, 4)) return {};
    }
    for (uint32_t i = 0; i < count; i++) {
        llama_pos pos;
        uint32_t n_seq;
        int32_t seq;
        if (!rd(&pos, 4) || !rd(&n_seq, 4) || n_seq != 1 || !rd(&seq, 4) || seq != 0 || pos < 0 || pos >= n_past) return {};
        out.push_back(pos);
    }
    std::sort(out.begin(), out.end());
    return out;
}

int run_chat(const options & o) {
    runner r(o);
    std::vector<llama_chat_message> msgs;
    std::vector<std::string> roles, contents;
    std::vector<question> qs;
    std::vector<std::pair<std::string, long>> told_recs; // F records: (question id, message index)
    {
        std::ifstream f(o.input);
        std::string line;
        while (std::getline(f, line)) {
            if (line.empty()) continue;
            auto fl = split_tab(line);
            if (fl[0] == "M" && fl.size() >= 3) { roles.push_back(fl[1]); contents.push_back(fl[2]); }
            else if (fl[0] == "Q" && fl.size() >= 5) {
                question q{fl[1], fl[2], fl[3], {}};
                for (size_t i = 4; i < fl.size(); i++) q.cands.push_back(fl[i]);
                qs.push_back(q);
            } else if (fl[0] == "F" && fl.size() == 3) {
                told_recs.push_back({fl[1], atol(fl[2].c_str())});
            } else { fprintf(stderr, "bad record: %s\n", line.c_str()); return 1; }
        }
    }
    if (roles.empty() || qs.empty()) { fprintf(stderr, "no history or no question in %s\n", o.input.c_str()); return 1; }
    for (const auto & [id, i] : told_recs) {
        auto q = std::find_if(qs.begin(), qs.end(), [&](const question & x) { return x.id == id; });
        if (q == qs.end() || i < 0 || i >= (long) roles.size()) {
            fprintf(stderr, "bad record: F %s %ld (no such question or message)\n", id.c_str(), i);
            return 1;
        }
        q->told_msg = i;
    }
    // the model's template: incremental formatting (each turn's text = formatted(0..i) minus formatted(0..i-1))
    if (!r.load()) return 1;
    llama_model * vm = r.model;
    const char * tmpl = llama_model_chat_template(vm, nullptr);
    std::string tmpl_s = !o.chat_template.empty() ? o.chat_template : tmpl ? tmpl : "";
    // what the records say the history was formatted with
    const std::string tmpl_label = !o.chat_template.empty() ? o.chat_template : tmpl ? "model" : "chatml (llama.cpp's default)";
    if (o.chat_template.empty() && !tmpl) {
        // (a GGUF without tokenizer.chat_template, e.g. some Gemma 3 conversions: llama.cpp falls back to chatml,
        // which the model was not trained on)
        fprintf(stderr, "kvevict_decode_bench: the model has no chat template: llama.cpp's default (chatml) used; "
                        "--chat-template NAME (e.g. gemma) gives its own\n");
    }
    bool fmt_failed = false; // (an empty text is no failure: Gemma's template writes a system turn with the next user turn)
    auto format = [&](const std::vector<std::string> & rs, const std::vector<std::string> & cs, bool add_ass) {
        std::vector<llama_chat_message> m;
        for (size_t i = 0; i < rs.size(); i++) m.push_back({rs[i].c_str(), cs[i].c_str()});
        std::vector<char> buf(4096);
        int n = llama_chat_apply_template(tmpl_s.empty() ? nullptr : tmpl_s.c_str(), m.data(), m.size(), add_ass, buf.data(), (int) buf.size());
        if (n > (int) buf.size()) {
            buf.resize(n);
            n = llama_chat_apply_template(tmpl_s.empty() ? nullptr : tmpl_s.c_str(), m.data(), m.size(), add_ass, buf.data(), (int) buf.size());
        }
        if (n < 0) fmt_failed = true;
        return n < 0 ? std::string() : std::string(buf.data(), n);
    };
    const llama_vocab * vv = llama_model_get_vocab(vm);
    std::vector<std::vector<llama_token>> turns;
    // the marked token spans [a, b) of each turn (--mark): user and system turns whole; with "prompt" also an
    // assistant turn's template text before and after its reply (what a server's next prompt batch writes)
    std::vector<std::vector<std::pair<size_t, size_t>>> turn_marks;
    // --mark-split prompts: each turn's reply tokens [a, b) (generated a token a call); a == b: none (not an assistant's)
    std::vector<std::pair<size_t, size_t>> reply_of;
    size_t n_mark_approx = 0; // assistant turns whose reply tokens did not split cleanly from the template's
    size_t n_ranges_unsplit = 0; // --mark-ranges messages: turns holding an earlier message not split cleanly
    std::string prev;
    size_t hist_tokens = 0;
    for (size_t i = 0; i < roles.size(); i++) {
        std::vector<std::string> rs(roles.begin(), roles.begin() + i + 1), cs(contents.begin(), contents.begin() + i + 1);
        std::string all = format(rs, cs, false);
        if (fmt_failed || all.compare(0, prev.size(), prev) != 0) { fprintf(stderr, "chat template failed\n"); return 1; }
        const std::string text = all.substr(prev.size());
        turns.push_back(tokenize(vv, text, i == 0, true));
        const size_t n = turns.back().size();
        turn_marks.emplace_back();
        reply_of.push_back({n, n});
        if (o.mark_split == "prompts" && roles[i] == "assistant") {
            // the reply's tokens: the template's text before it and after it tokenized on their own (where they do
            // not split cleanly, the whole turn is prompt text)
            const size_t at = text.find(contents[i]);
            if (at != std::string::npos && !contents[i].empty()) {
                const size_t pre = tokenize(vv, text.substr(0, at), i == 0, true).size();
                const size_t post = tokenize(vv, text.substr(at + contents[i].size()), false, true).size();
                if (pre + post < n && pre + tokenize(vv, contents[i], false, true).size() + post == n) {
                    reply_of.back() = {pre, n - post};
                } else {
                    n_mark_approx++;
                }
            } else {
                n_mark_approx++;
            }
        }
        if ((o.mark == "user" || o.mark == "prompt") && roles[i] != "assistant") {
            // --mark-ranges messages: a turn that also writes an earlier message (Gemma's template writes the
            // system prompt inside the first user turn) is two ranges, split after that message's text where
            // the tokens split cleanly there (else one range, said in the note); only a system message is looked for
            size_t cut = 0;
            for (size_t j = 0; o.mark_ranges == "messages" && j < i && cut == 0; j++) {
                const size_t at = contents[j].empty() ? std::string::npos : text.find(contents[j]);
                if (roles[j] != "system" || at == std::string::npos) continue;
                const std::string head_text = text.substr(0, at + contents[j].size());
                const auto h = tokenize(vv, head_text, i == 0, true);
                if (h.size() < n && std::equal(h.begin(), h.end(), turns.back().begin())) cut = h.size();
                else n_ranges_unsplit++;
            }
            if (cut > 0) turn_marks.back().push_back({0, cut});
            turn_marks.back().push_back({cut, n});
        } else if (o.mark == "prompt") {
            // the reply's tokens: the template's text before it and after it tokenized on their own
            const size_t at = text.find(contents[i]);
            size_t pre = 0, post = 0;
            if (at != std::string::npos) {
                pre = tokenize(vv, text.substr(0, at), i == 0, true).size();
                post = tokenize(vv, text.substr(at + contents[i].size()), false, true).size();
                const size_t mid = tokenize(vv, contents[i], false, true).size();
                n_mark_approx += pre + mid + post != n;
            } else {
                n_mark_approx++;
            }
            pre = std::min(pre, n);
            post = std::min(post, n - pre);
            if (pre > 0) turn_marks.back().push_back({0, pre});
            if (post > 0) turn_marks.back().push_back({n - post, n});
        }
        for (auto & q : qs) {
            if (q.told_msg != (long) i) continue;
            q.turn0 = hist_tokens;
            q.told = hist_tokens + n;
            // the value's tokens: those whose text overlaps the value's first occurrence in the turn
            std::string txt, v = q.cands[0];
            std::vector<size_t> at0;
            for (llama_token t : turns.back()) { at0.push_back(txt.size()); txt += piece(vv, t); }
            while (!v.empty() && v[0] == ' ') v.erase(0, 1);
            std::transform(txt.begin(), txt.end(), txt.begin(), ::tolower);
            std::transform(v.begin(), v.end(), v.begin(), ::tolower);
            const size_t a = v.empty() ? std::string::npos : txt.find(v);
            if (a != std::string::npos) {
                size_t j0 = n, j1 = 0;
                for (size_t j = 0; j < n; j++) {
                    const size_t e = j + 1 < n ? at0[j + 1] : txt.size();
                    if (at0[j] < a + v.size() && e > a) { j0 = std::min(j0, j); j1 = j + 1; }
                }
                if (j1 > j0) { q.val0 = hist_tokens + j0; q.val1 = hist_tokens + j1; }
            }
            // the oracle marks of the diagnosis (--mark facts: the fact's turn; values: the value's tokens)
            if (o.mark == "facts") turn_marks.back().push_back({0, n});
            if (o.mark == "values" && q.val1 > q.val0) turn_marks.back().push_back({q.val0 - hist_tokens, q.val1 - hist_tokens});
        }
        hist_tokens += turns.back().size();
        prev = all;
    }
    if (n_mark_approx > 0) {
        fprintf(stderr, "kvevict_decode_bench: --mark prompt / --mark-split prompts: %zu assistant turns' replies tokenize "
                        "differently inside their template: their marked spans (prompt text) are approximate\n", n_mark_approx);
    }
    if (n_ranges_unsplit > 0) {
        fprintf(stderr, "kvevict_decode_bench: --mark-ranges messages: %zu turns that also write the system prompt do "
                        "not tokenize cleanly after it: marked as one range\n", n_ranges_unsplit);
    }
    // a question's text: the history + the question as a user turn, with the assistant's start, then the prefix
    std::vector<std::vector<llama_token>> qtoks;
    std::vector<std::vector<std::vector<llama_token>>> ctoks;
    std::vector<std::vector<bool>> cclean;   // the candidate's tokens follow the prefix's unchanged
    std::vector<std::vector<size_t>> cdrop;  // else: prefix tokens replaced by the merged ones
    size_t q_max = 0;
    for (const auto & q : qs) {
        std::vector<std::string> rs = roles, cs = contents;
        rs.push_back("user");
        cs.push_back(q.text);
        std::string all = format(rs, cs, true);
        std::string qtext = all.substr(prev.size()) + q.prefix;
        qtoks.push_back(tokenize(vv, qtext, false, true));
        std::vector<std::vector<llama_token>> cc;
        std::vector<bool> clean;
        std::vector<size_t> drop;
        for (const auto & c : q.cands) {
            // the candidate's tokens in context: tokenize prefix+candidate and drop the prefix's tokens
            auto full = tokenize(vv, qtext + c, false, true);
            auto base = qtoks.back();
            size_t k = 0;
            while (k < base.size() && k < full.size() && base[k] == full[k]) k++;
            // a token merged across the boundary: restart the candidate there
            cc.push_back(std::vector<llama_token>(full.begin() + k, full.end()));
            clean.push_back(k == base.size() && !cc.back().empty());
            drop.push_back(base.size() - k);
            q_max = std::max(q_max, full.size());
        }
        ctoks.push_back(cc);
        cclean.push_back(clean);
        cdrop.push_back(drop);
        q_max = std::max(q_max, qtoks.back().size() + (size_t) o.gen);
    }
    if (!r.init((int) (hist_tokens + q_max + 64))) return 1;
    auto head = [&](const char * status, const std::string & note) {
        printf("{\"mode\":\"chat\",\"method\":%s,\"budget\":%d,\"evict_to\":%.3f,\"history\":%zu,\"mark\":%s,"
               "\"mark_share\":%.3f,\"mark_split\":%s,\"mark_ranges\":%s,\"template\":%s,\"status\":\"%s\",\"note\":%s",
               json_str(o.method).c_str(), r.budget, o.evict_to, hist_tokens, json_str(o.mark).c_str(), o.mark_share,
               json_str(o.mark_split).c_str(), json_str(o.mark_ranges).c_str(), json_str(tmpl_label).c_str(), status,
               json_str(note).c_str());
    };
    if (!r.refused.empty()) return report_refused(r, head);
    std::string note;
    if (r.budget > 0 && hist_tokens + q_max <= (size_t) r.budget) {
        note = "the conversation (" + std::to_string(hist_tokens) + " tokens, questions included) never exceeds the budget (" +
               std::to_string(r.budget) + " cells): nothing is evicted";
        fprintf(stderr, "kvevict_decode_bench: %s\n", note.c_str());
    }
    // the facts' places: each told within the first --facts-by tokens, else said (the run goes on: its
    // question is asked at the checkpoints after it, younger than the others there)
    size_t facts_end = 0;
    for (const auto & q : qs) facts_end = std::max(facts_end, q.told);
    if (o.facts_by >= 0) {
        std::string late;
        for (const auto & q : qs) {
            if (q.told_msg < 0) late += (late.empty() ? "" : ", ") + q.id + " (not given: no F record)";
            else if (q.told > (size_t) o.facts_by) late += (late.empty() ? "" : ", ") + q.id + " (told by token " + std::to_string(q.told) + ")";
        }
        if (!late.empty()) {
            std::string m = "not every fact is told within the first " + std::to_string(o.facts_by) + " tokens: " + late;
            fprintf(stderr, "kvevict_decode_bench: %s\n", m.c_str());
            note += (note.empty() ? "" : "; ") + m;
        }
    }
    // checkpoints: after the first turn at which the history reaches each --at count (default: the end)
    std::vector<int> at = o.at;
    if (at.empty()) at.push_back((int) hist_tokens);
    std::sort(at.begin(), at.end());
    for (int a : at) {
        if ((size_t) a > hist_tokens) {
            std::string m = "the conversation (" + std::to_string(hist_tokens) + " tokens) never reaches " + std::to_string(a) +
                            " tokens: that checkpoint is asked at its end";
            fprintf(stderr, "kvevict_decode_bench: %s\n", m.c_str());
            note += (note.empty() ? "" : "; ") + m;
        }
    }
    const int room_needed = (int) std::min<size_t>(q_max, (size_t) r.chunk);
    struct snapshot {
        std::vector<uint8_t> bytes;
        llama_pos past = 0;
        int cells = 0, shifts = 0;
    };
    auto save = [&](snapshot & sn) {
        sn.past = r.n_past;
        sn.cells = r.cells;
        sn.shifts = r.shifts;
        sn.bytes.resize(llama_state_seq_get_size(r.ctx, 0));
        sn.bytes.resize(llama_state_seq_get_data(r.ctx, sn.bytes.data(), sn.bytes.size(), 0));
    };
    // the marked position ranges so far (merged), given to the fork again after every restore: the fork
    // forgets a restored sequence's marks ("the engine marks the restored text again if it wants"); without
    // this, every mark of the history before a checkpoint would be lost from that checkpoint on
    std::vector<std::pair<llama_pos, llama_pos>> marked;
    size_t n_marked = 0;
    auto apply_marks = [&]() {
        for (const auto & [p0, p1] : marked) {
            const int32_t rc = llama_kv_evict_mark(r.ctx, 0, p0, p1, o.mark_share);
            if (rc < 0) { fprintf(stderr, "llama_kv_evict_mark: %d\n", rc); return false; }
        }
        return true;
    };
    auto restore = [&](const snapshot & sn) {
        llama_memory_seq_rm(r.mem, 0, -1, -1);
        if (llama_state_seq_set_data(r.ctx, sn.bytes.data(), sn.bytes.size(), 0) == 0) return false;
        if (r.fork && !marked.empty() && !apply_marks()) return false;
        r.n_past = sn.past;
        r.cells = sn.cells;
        r.shifts = sn.shifts;
        return true;
    };
    snapshot snap, snap_q;
    int n_ok = 0, n_asked = 0;
    double q_cpu = 0;
    // every question from a snapshot of the history, restored each time; then the history goes on from it
    auto checkpoint = [&](int label, size_t fed) -> bool {
        const double c0 = r.decode_cpu;
        // room for the longest question, so that no question starts by evicting right after a restore
        // (the fork resets a restored sequence's query ring): evict now, as the fork would before that
        // ubatch, with the history's last queries; context shift the same way
        if (r.fork && r.cells + room_needed > r.budget) {
            const int32_t rc = llama_kv_evict_to(r.ctx, 0, (uint32_t) std::floor(o.evict_to * r.budget));
            if (rc < 0) { fprintf(stderr, "llama_kv_evict_to: %d\n", rc); return false; }
            r.update_cells();
        }
        if (r.shift) r.maybe_shift(room_needed);
        save(snap);
        const int evictions = r.ev.count, shifts = r.shifts;
        // --kept: what the (full-attention) cache holds of each fact here
        const std::vector<llama_pos> held = o.kept ? state_positions(snap.bytes, r.n_past) : std::vector<llama_pos>();
        if (getenv("KVEVICT_DECODE_DUMP")) {
            // the held positions and their tokens (a diagnosis: KVEVICT_DECODE_DUMP=1 with --kept)
            std::vector<llama_token> hist;
            for (const auto & t : turns) hist.insert(hist.end(), t.begin(), t.end());
            fprintf(stderr, "kvevict_decode_bench: held at %d (%zu cells):", label, held.size());
            for (llama_pos p : held) fprintf(stderr, " %d:%s", p, (size_t) p < hist.size() ? json_str(piece(r.vocab, hist[p])).c_str() : "?");
            fprintf(stderr, "\nkvevict_decode_bench: marked ranges:");
            for (const auto & [p0, p1] : marked) fprintf(stderr, " [%d, %d)", p0, p1);
            fprintf(stderr, "\n");
        }
        auto n_held = [&](size_t p0, size_t p1) {
            return (long) (std::lower_bound(held.begin(), held.end(), (llama_pos) p1) - std::lower_bound(held.begin(), held.end(), (llama_pos) p0));
        };
        // a fact not told yet is not asked here (said once per checkpoint)
        std::string later;
        for (const auto & q : qs) {
            if (q.told > fed) later += (later.empty() ? "" : ", ") + q.id + " (told by token " + std::to_string(q.told) + ")";
        }
        if (!later.empty()) {
            std::string m = "at the checkpoint of " + std::to_string(label) + " (" + std::to_string(fed) +
                            " tokens) not asked, their facts not told yet: " + later;
            fprintf(stderr, "kvevict_decode_bench: %s\n", m.c_str());
            note += (note.empty() ? "" : "; ") + m;
        }
        for (size_t qi = 0; qi < qs.size(); qi++) {
            const auto & q = qs[qi];
            if (q.told > fed) continue;
            const int ev_q0 = r.ev.count; // evictions while this question is asked and answered
            std::vector<double> lp;
            bool failed = !restore(snap);
            // the question and the answer prefix once; its last logits and a snapshot after it serve
            // every candidate and the greedy answer
            std::vector<float> last(r.n_vocab);
            if (!failed && !r.feed(qtoks[qi], false, 512, [&](size_t, const float * row) {
                    std::copy(row, row + r.n_vocab, last.begin());
                })) failed = true;
            if (!failed) save(snap_q);
            for (size_t ci = 0; !failed && ci < ctoks[qi].size(); ci++) {
                const auto & ct = ctoks[qi][ci];
                double s = 0.0;
                if (cclean[qi][ci]) {
                    // the candidate's log-likelihood after the prefix
                    s = logprob(last.data(), r.n_vocab, ct[0]);
                    if (ct.size() > 1) {
                        if (!restore(snap_q)) { failed = true; break; }
                        if (!r.feed(ct, true, r.chunk, [&](size_t i, const float * row) {
                                if (i + 1 < ct.size()) s += logprob(row, r.n_vocab, ct[i + 1]);
                            })) { failed = true; break; }
                    }
                } else {
                    // a token merged across the prefix's end: from the history's snapshot, the whole text
                    if (!restore(snap)) { failed = true; break; }
                    std::vector<llama_token> all(qtoks[qi].begin(), qtoks[qi].begin() + (qtoks[qi].size() - cdrop[qi][ci]));
                    all.insert(all.end(), ct.begin(), ct.end());
                    const size_t base = all.size() - ct.size();
                    if (!r.feed(all, true, r.chunk, [&](size_t i, const float * row) {
                            if (i + 1 >= base && i + 1 < all.size()) s += logprob(row, r.n_vocab, all[i + 1]);
                        })) { failed = true; break; }
                }
                lp.push_back(s);
            }
            std::string answer;
            if (!failed && restore(snap_q)) {
                llama_token next = (llama_token) (std::max_element(last.begin(), last.end()) - last.begin());
                for (int g = 0; !failed && g < o.gen && next >= 0 && !llama_vocab_is_eog(r.vocab, next); g++) {
                    std::string p = piece(r.vocab, next);
                    if (p.find('\n') != std::string::npos) break;
                    answer += p;
                    std::vector<llama_token> one{next};
                    next = -1;
                    if (!r.feed(one, false, 1, [&](size_t, const float * row) {
                            next = (llama_token) (std::max_element(row, row + r.n_vocab) - row);
                        })) failed = true;
                }
            } else {
                failed = true;
            }
            int rank = 0;
            for (size_t c = 1; c < lp.size(); c++) rank += lp[c] >= lp[0];
            std::string kept_json;
            if (o.kept) {
                char kb[256];
                if (held.empty() || q.told_msg < 0) snprintf(kb, sizeof kb, ",\"held\":null");
                else snprintf(kb, sizeof kb, ",\"held\":%zu,\"fact_held\":%ld,\"fact_cells\":%zu,\"value_held\":%ld,\"value_cells\":%zu,"
                              "\"q_evictions\":%d", held.size(), n_held(q.turn0, q.told), q.told - q.turn0, n_held(q.val0, q.val1),
                              q.val1 - q.val0, r.ev.count - ev_q0);
                kept_json = kb;
            }
            std::string lo = answer, v = q.cands[0];
            std::transform(lo.begin(), lo.end(), lo.begin(), ::tolower);
            std::transform(v.begin(), v.end(), v.begin(), ::tolower);
            const bool hit = !failed && lo.find(v) != std::string::npos;
            n_ok += hit;
            n_asked++;
            printf("{\"at\":%d,\"history\":%zu,\"told\":%ld,\"cells\":%d,\"evictions\":%d,\"shifts\":%d,\"question\":%s,\"value\":%s,"
                   "\"answer\":%s,\"recalled\":%s,\"choice_ok\":%s,\"lp_value\":%.4f,\"status\":\"%s\"%s}\n",
                   label, fed, q.told_msg < 0 ? -1L : (long) q.told, snap.cells, evictions, shifts, json_str(q.id).c_str(), json_str(q.cands[0]).c_str(),
                   json_str(answer).c_str(), hit ? "true" : "false", (!failed && rank == 0) ? "true" : "false",
                   lp.empty() ? NAN : lp[0], failed ? "error" : "ok", kept_json.c_str());
            fflush(stdout);
        }
        // back to the history's state to go on
        if (!restore(snap)) return false;
        r.ev.count = evictions;
        q_cpu += r.decode_cpu - c0;
        return true;
    };
    size_t fed = 0, next_at = 0;
    // --mark-split prompts: the prompt text not decoded yet, fed in one llama_decode (a range of the fork's marks, given
    // again after a restore as the fork had it) before a reply or a checkpoint
    std::vector<llama_token> pending;
    auto flush = [&]() {
        for (size_t i = 0; i < pending.size(); i += 512) {
            const size_t n = std::min<size_t>(512, pending.size() - i);
            if (n > 1) {
                // the fork's ranges of this decode (kv_evict_mark_split 2): a message from each control token that ends
                // no generation, the text before the first unmarked, the last (the reply's header) joined to the one before
                std::vector<llama_pos> cut;
                for (size_t j = 0; j < n; j++) {
                    const llama_token t = pending[i + j];
                    if (!llama_vocab_is_eog(r.vocab, t) && (llama_vocab_get_attr(r.vocab, t) & LLAMA_TOKEN_ATTR_CONTROL)) {
                        cut.push_back(r.n_past + (llama_pos) j);
                    }
                }
                if (cut.size() > 1) cut.pop_back();
                if (cut.empty()) cut.push_back(r.n_past);
                cut.push_back(r.n_past + (llama_pos) n);
                for (size_t k = 0; k + 1 < cut.size(); k++) marked.push_back({cut[k], cut[k + 1]});
            }
            if (!r.feed(std::vector<llama_token>(pending.begin() + i, pending.begin() + i + n), false, 512,
                        [](size_t, const float *) {})) return false;
        }
        pending.clear();
        return true;
    };
    for (size_t ti = 0; ti < turns.size(); ti++) {
        // the engine's signal: the positions of what the user gave (--mark user: user turns, the system prompt;
        // --mark prompt: every prompt batch's tokens), merged with the ranges before, all given again
        if (r.fork && !turn_marks[ti].empty() && (o.mark_cap < 0 || n_marked < (size_t) o.mark_cap)) {
            for (const auto & [a, b0] : turn_marks[ti]) {
                // --mark-cap: the oldest marked text only, up to K tokens
                const size_t b = o.mark_cap < 0 ? b0 : std::min(b0, a + ((size_t) o.mark_cap - std::min(n_marked, (size_t) o.mark_cap)));
                if (b <= a) continue;
                n_marked += b - a;
                const llama_pos p0 = r.n_past + (llama_pos) a, p1 = r.n_past + (llama_pos) b;
                if (!marked.empty() && marked.back().second == p0 && o.mark_ranges == "merged") marked.back().second = p1;
                else marked.push_back({p0, p1});
            }
            if (llama_kv_evict_mark(r.ctx, 0, -1, -1, o.mark_share) < 0 || !apply_marks()) {
                head("error", "llama_kv_evict_mark failed"); printf("}\n"); return 1;
            }
        }
        if (o.mark_split == "prompts") {
            // as a server: the prompt text gathered, the reply's tokens one a call after it
            const auto & t = turns[ti];
            const auto [a, b] = reply_of[ti];
            pending.insert(pending.end(), t.begin(), t.begin() + a);
            bool ok = a == b || flush();
            for (size_t j = a; ok && j < b; j++) ok = r.feed({t[j]}, false, 1, [](size_t, const float *) {});
            pending.insert(pending.end(), t.begin() + b, t.end());
            if (!ok) { head("error", "llama_decode failed"); printf("}\n"); return 1; }
        } else if (!r.feed(turns[ti], false, 512, [](size_t, const float *) {})) {
            // a turn per llama_decode call (the fork splits it into ubatches and evicts between them)
            head("error", "llama_decode failed"); printf("}\n"); return 1;
        }
        fed += turns[ti].size();
        const bool asked = next_at < at.size() && (fed >= (size_t) at[next_at] || ti + 1 == turns.size());
        if (asked && !flush()) { head("error", "llama_decode failed"); printf("}\n"); return 1; }
        while (next_at < at.size() && (fed >= (size_t) at[next_at] || ti + 1 == turns.size())) {
            if (!checkpoint(at[next_at], fed)) { head("error", "a checkpoint failed"); printf("}\n"); return 1; }
            next_at++;
        }
        if (next_at == at.size()) break; // the turns after the last checkpoint are not needed
    }
    head("ok", note);
    char b[256];
    snprintf(b, sizeof b, ",\"asked\":%d,\"recalled\":%d,\"facts_end\":%zu,\"facts_by\":%d,\"question_cpu_ms\":%.1f,",
             n_asked, n_ok, facts_end, o.facts_by, q_cpu);
    // the cost line: decode CPU time of the history alone (questions excluded)
    r.decode_cpu -= q_cpu;
    printf("%s%s}\n", b, r.cost_json().c_str());
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { fprintf(stderr, "%s needs a value\n", a.c_str()); exit(2); }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") o.model = next();
        else if (a == "--mode") o.mode = next();
        else if (a == "--input") o.input = next();
        else if (a == "--method") o.method = next();
        else if (a == "--budget") o.budget = atoi(next().c_str());
        else if (a == "--evict-to") o.evict_to = (float) atof(next().c_str());
        else if (a == "--window") o.window = atoi(next().c_str());
        else if (a == "--links") o.links = (float) atof(next().c_str());
        else if (a == "--n-keep") o.n_keep = atoi(next().c_str());
        else if (a == "--chunk") o.chunk = atoi(next().c_str());
        else if (a == "--max-tokens") o.max_tokens = atoi(next().c_str());
        else if (a == "--skip") o.skip = atoi(next().c_str());
        else if (a == "--gen") o.gen = atoi(next().c_str());
        else if (a == "-t" || a == "--threads") o.threads = atoi(next().c_str());
        else if (a == "--flash") o.flash = atoi(next().c_str());
        else if (a == "--nll-out") o.nll_out = next();
        else if (a == "--mark") o.mark = next();
        else if (a == "--mark-cap") o.mark_cap = atoi(next().c_str());
        else if (a == "--prompt-tokens") o.prompt_tokens = atoi(next().c_str());
        else if (a == "--mark-share") o.mark_share = (float) atof(next().c_str());
        else if (a == "--mark-split") o.mark_split = next();
        else if (a == "--mark-ranges") o.mark_ranges = next();
        else if (a == "--chat-template") o.chat_template = next();
        else if (a == "--facts-by") o.facts_by = atoi(next().c_str());
        else if (a == "--kept") o.kept = true;
        else if (a == "--at") {
            std::stringstream ss(next());
            std::string x;
            while (std::getline(ss, x, ',')) o.at.push_back(atoi(x.c_str()));
        }
        else if (a == "--methods") { printf("full, ctxshift, %s\n", llama_kv_evict_method_names()); return 0; }
        else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }
    if (o.mark != "none" && o.mark != "user" && o.mark != "prompt" && o.mark != "facts" && o.mark != "values") {
        fprintf(stderr, "--mark: none, user, prompt, facts or values\n");
        return 2;
    }
    if (o.mark_split != "none" && o.mark_split != "spans" && o.mark_split != "prompts") {
        fprintf(stderr, "--mark-split: spans, none or prompts\n");
        return 2;
    }
    if (o.mark_split == "prompts" && (o.mode != "chat" || o.mark != "none")) {
        fprintf(stderr, "--mark-split prompts: chat mode, without --mark (the fork marks each prompt itself)\n");
        return 2;
    }
    if (o.mark_split == "prompts") o.mark_share = 1.0f; // the fork's share for its prompt marks
    if (o.mark_ranges != "merged" && o.mark_ranges != "messages") {
        fprintf(stderr, "--mark-ranges: merged or messages\n");
        return 2;
    }
    if (o.mode == "ppl" && (o.mark == "facts" || o.mark == "values")) {
        fprintf(stderr, "--mark %s: chat mode only (the facts are the conversation's F records)\n", o.mark.c_str());
        return 2;
    }
    if (o.model.empty() || o.input.empty() || (o.mode != "ppl" && o.mode != "chat")) {
        fprintf(stderr, "usage: %s -m MODEL --mode ppl|chat --input FILE --method M --budget C [--evict-to F] "
                        "[--window W] [--links T] [--n-keep K] [--chunk U] [--max-tokens N] [--skip S] [--gen G] "
                        "[-t N] [--flash -1|0|1] [--nll-out F] [--mark none|user|prompt|facts|values] [--mark-share S] [--mark-split spans|none] [--mark-cap K] [--prompt-tokens P] [--chat-template T] [--facts-by N] [--kept]\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    const int rc = o.mode == "ppl" ? run_ppl(o) : run_chat(o);
    llama_backend_free();
    return rc;
}
