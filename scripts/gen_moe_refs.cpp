// Reference data for the MoE forward-pass fixtures, computed by llama.cpp through its C API.
// Built and run by scripts/gen_moe_refs.sh against the prebuilt libraries of node-llama-cpp.
//
//   gen_moe_refs quantize IN.gguf OUT.gguf [FTYPE [pure] [requantize] [flat-imatrix]
//                                                 [tt:REGEX=TYPE]...]
//       Quantization with llama_model_quantize (default parameters, one thread, no importance
//       matrix); FTYPE is a llama_ftype number (default 15, LLAMA_FTYPE_MOSTLY_Q4_K_M); `pure`
//       and `requantize` set llama_model_quantize_params.pure (every quantized tensor gets the
//       default type) and .allow_requantize. `flat-imatrix` hands the quantizer an importance
//       matrix of ones for every tensor of IN (what the i-quants below 3 bits insist on; a flat
//       one weighs every column alike). Each `tt:REGEX=TYPE` is a tensor type override
//       (llama_model_tensor_override: the first pattern found in a tensor's name gives its
//       ggml type, named as ggml_type_name names it, e.g. iq2_xxs).
//   gen_moe_refs ref MODEL.gguf OUT.json [-n N] [-u UBATCH] (-p TEXT)...
//       For every prompt: the token ids (llama.cpp's tokenizer, special tokens added as the
//       vocabulary asks, special-token text not parsed), the logits of every prompt position
//       from one llama_decode of the whole prompt (run in micro-batches of UBATCH tokens where
//       -u is given), then N greedy tokens decoded one at a time
//       (argmax, lowest id on ties; decoding continues past end-of-generation tokens), the gap
//       between the two largest logits at each greedy step, and the routing margin: the
//       smallest difference between the k-th and (k+1)-th largest router probability over
//       every layer and token (softmax of the router logits the top-k choice is made on: the
//       ffn_moe_logits graph node, or, where the router has a bias as gpt-oss's, the node that
//       adds the bias to it, whose name the graph overwrites with ffn_moe_probs; where a
//       selection bias is added to sigmoid probabilities, as glm4moe's exp_probs_b, the values
//       of that sum, ffn_moe_probs_biased, which the top-k ranks as they are; in a second,
//       separate run of the same tokens so that the callback cannot touch the reference
//       numbers), for the prompt and for each decode call that produced a greedy token (the
//       first one is the prompt's); and the most prompt tokens routed to one expert of one
//       layer (from the same router values: the k largest of each token, lower expert first
//       on ties).
//
// Settings: KV cache F32, flash attention off, one thread, context and batch sized to fit.
// The environment variable GGML_BACKEND_DIR names the directory of the CPU backend libraries.
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

// llama.cpp's log: everything while the model loads, afterwards only warnings and errors.
bool g_loading = true;

void log_cb(enum ggml_log_level level, const char * text, void *) {
    if (g_loading || level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

struct LayerRoute {
    bool biased = false;  // measured on the biased router logits (which replace the unbiased)
    float margin = INFINITY;  // the smallest margin over the call's tokens
    int max_expert_tokens = 0;  // the most tokens of the call routed to one expert
};

struct RouteStats {
    int k = 0;
    float min_margin = INFINITY;  // over everything seen
    int max_expert_tokens = 0;  // over every llama_decode call and layer
    std::vector<float> per_decode;  // the smallest margin of each llama_decode call
    std::vector<float> buf;
    // The current llama_decode call's layers.
    std::map<int, LayerRoute> layers;

    // Folds the finished llama_decode call's layers into the totals.
    void end_decode() {
        for (const auto & [il, v] : layers) {
            min_margin = std::min(min_margin, v.margin);
            max_expert_tokens = std::max(max_expert_tokens, v.max_expert_tokens);
            if (!per_decode.empty()) {
                per_decode.back() = std::min(per_decode.back(), v.margin);
            }
        }
        layers.clear();
    }
};

// The layer of a node named exactly "ffn_moe_logits-<il>" (not a view such as
// "... (reshaped)"); -1 otherwise.
int logits_layer(const char * name) {
    int il = -1;
    int end = 0;
    if (sscanf(name, "ffn_moe_logits-%d%n", &il, &end) == 1 && name[end] == '\0') {
        return il;
    }
    return -1;
}

// The layer of a router-logits node: the router's product "ffn_moe_logits-<il>", or the sum of
// it and the router bias (biased), which the top-k choice then ranks; or the selection values
// "ffn_moe_probs_biased-<il>" (biased and raw: ranked as they are, no softmax); -1 otherwise.
int router_layer(const struct ggml_tensor * t, bool * biased, bool * raw) {
    *raw = false;
    int il = logits_layer(t->name);
    if (il >= 0) {
        *biased = false;
        return il;
    }
    int end = 0;
    if (sscanf(t->name, "ffn_moe_probs_biased-%d%n", &il, &end) == 1 && t->name[end] == '\0') {
        *biased = true;
        *raw = true;
        return il;
    }
    if (t->op == GGML_OP_ADD && t->src[0] != nullptr && (il = logits_layer(t->src[0]->name)) >= 0) {
        *biased = true;
        return il;
    }
    return -1;
}

bool route_cb(struct ggml_tensor * t, bool ask, void * user) {
    bool biased = false;
    bool raw = false;
    const int il = router_layer(t, &biased, &raw);
    const bool wanted = il >= 0;
    if (ask) {
        return wanted;
    }
    if (!wanted) {
        return true;
    }
    auto * st = static_cast<RouteStats *>(user);
    const int64_t n_exp = t->ne[0];
    const int64_t n_tok = ggml_nelements(t) / n_exp;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        fprintf(stderr, "unexpected router logits tensor %s\n", t->name);
        exit(1);
    }
    st->buf.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, st->buf.data(), 0, ggml_nbytes(t));
    std::vector<double> row(n_exp);
    std::vector<int> idx(n_exp);
    std::vector<int> count(n_exp, 0);
    float layer_min = INFINITY;
    for (int64_t i = 0; i < n_tok; i++) {
        // softmax in double precision, then the gap between the k-th and (k+1)-th probability
        const float * x = st->buf.data() + i * n_exp;
        if (raw) {
            for (int64_t j = 0; j < n_exp; j++) {
                row[j] = x[j];
            }
        } else {
            const double mx = *std::max_element(x, x + n_exp);
            double sum = 0.0;
            for (int64_t j = 0; j < n_exp; j++) {
                row[j] = std::exp((double) x[j] - mx);
                sum += row[j];
            }
            for (auto & v : row) {
                v /= sum;
            }
        }
        // the k chosen experts (largest values; lower index first on ties)
        for (int64_t j = 0; j < n_exp; j++) {
            idx[j] = (int) j;
        }
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return row[a] > row[b]; });
        for (int j = 0; j < st->k; j++) {
            count[idx[j]]++;
        }
        std::sort(row.begin(), row.end(), std::greater<double>());
        const float m = (float) (row[st->k - 1] - row[st->k]);
        layer_min = std::min(layer_min, m);
    }
    auto it = st->layers.find(il);
    if (it == st->layers.end() || biased || !it->second.biased) {
        st->layers[il] = {biased, layer_min, *std::max_element(count.begin(), count.end())};
    }
    return true;
}

// Tokens per llama_decode micro-batch (-u; 0: the whole prompt in one).
static int g_ubatch = 0;

llama_context * make_ctx(llama_model * model, int n_ctx, ggml_backend_sched_eval_callback cb, void * ud) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = g_ubatch > 0 && g_ubatch < n_ctx ? g_ubatch : n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.cb_eval = cb;
    cp.cb_eval_user_data = ud;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "failed to create a context\n");
        exit(1);
    }
    return ctx;
}

void decode(llama_context * ctx, llama_batch & b, const llama_token * toks, int n, int pos0) {
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        exit(1);
    }
}

ggml_type type_by_name(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && name == n) {
            return (ggml_type) t;
        }
    }
    fprintf(stderr, "no ggml type is named %s\n", name.c_str());
    exit(2);
}

// An importance matrix of ones for every tensor of `path`: ne[0] * ne[2] values each (a row's
// length per expert), as llama_model_quantize checks.
std::vector<std::pair<std::string, std::vector<float>>> flat_imatrix(const char * path) {
    ggml_context * ctx = nullptr;
    gguf_init_params ip = { /*no_alloc =*/ true, /*ctx =*/ &ctx };
    gguf_context * g = gguf_init_from_file(path, ip);
    if (!g) {
        fprintf(stderr, "%s: not a readable GGUF file\n", path);
        exit(1);
    }
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        out.emplace_back(t->name, std::vector<float>((size_t) (t->ne[0] * t->ne[2]), 1.0f));
    }
    gguf_free(g);
    ggml_free(ctx);
    return out;
}

int cmd_quantize(const char * in, const char * out, llama_ftype ftype, bool pure, bool requantize,
                 bool flat, const std::vector<std::pair<std::string, ggml_type>> & overrides) {
    llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = ftype;
    p.pure = pure;
    p.allow_requantize = requantize;
    p.nthread = 1;
    const auto imatrix = flat ? flat_imatrix(in) : std::vector<std::pair<std::string, std::vector<float>>>();
    std::vector<llama_model_imatrix_data> im;
    for (const auto & [name, v] : imatrix) {
        im.push_back({ name.c_str(), v.data(), v.size() });
    }
    im.push_back({ nullptr, nullptr, 0 });
    if (flat) {
        p.imatrix = im.data();
    }
    std::vector<llama_model_tensor_override> tt;
    for (const auto & [pattern, type] : overrides) {
        tt.push_back({ pattern.c_str(), type });
    }
    tt.push_back({ nullptr, GGML_TYPE_COUNT });
    if (!overrides.empty()) {
        p.tt_overrides = tt.data();
    }
    if (llama_model_quantize(in, out, &p) != 0) {
        fprintf(stderr, "quantization failed\n");
        return 1;
    }
    return 0;
}

int cmd_ref(const char * model_path, const char * out_path, int n_gen, const std::vector<std::string> & prompts) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "failed to load %s\n", model_path);
        return 1;
    }
    g_loading = false;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    char arch[64];
    char key[128];
    char val[64];
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    // A dense model (no expert_used_count) has no routing: its margins are written as FLT_MAX.
    const int k_used = llama_model_meta_val_str(model, key, val, sizeof val) < 0 ? 0 : atoi(val);

    FILE * f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    fprintf(f, "{\"n_vocab\":%d,\"prompts\":[", n_vocab);
    for (size_t ip = 0; ip < prompts.size(); ip++) {
        const std::string & text = prompts[ip];
        std::vector<llama_token> toks(text.size() + 8);
        const int nt = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), true, false);
        if (nt <= 0) {
            fprintf(stderr, "tokenization failed\n");
            return 1;
        }
        toks.resize(nt);
        const int n_ctx = nt + n_gen + 8;

        // Reference run.
        llama_context * ctx = make_ctx(model, n_ctx, nullptr, nullptr);
        llama_batch b = llama_batch_init(n_ctx, 0, 1);
        decode(ctx, b, toks.data(), nt, 0);
        std::vector<float> logits((size_t) nt * n_vocab);
        for (int i = 0; i < nt; i++) {
            const float * l = llama_get_logits_ith(ctx, i);
            std::copy(l, l + n_vocab, logits.begin() + (size_t) i * n_vocab);
        }
        std::vector<float> last(logits.end() - n_vocab, logits.end());
        std::vector<llama_token> greedy;
        std::vector<float> gaps;
        for (int g = 0; g < n_gen; g++) {
            int best = 0;
            for (int j = 1; j < n_vocab; j++) {
                if (last[j] > last[best]) {
                    best = j;
                }
            }
            float second = -INFINITY;
            for (int j = 0; j < n_vocab; j++) {
                if (j != best) {
                    second = std::max(second, last[j]);
                }
            }
            greedy.push_back(best);
            gaps.push_back(last[best] - second);
            if (g + 1 == n_gen) {
                break;
            }
            llama_token t = best;
            decode(ctx, b, &t, 1, nt + g);
            const float * l = llama_get_logits_ith(ctx, -1);
            last.assign(l, l + n_vocab);
        }
        llama_free(ctx);

        // Routing-margin run over the same tokens (prompt, then the greedy tokens one by one).
        RouteStats prompt_st;
        prompt_st.k = k_used;
        RouteStats all_st;
        all_st.k = k_used;
        if (k_used > 0) {
            ctx = make_ctx(model, n_ctx, route_cb, &prompt_st);
            decode(ctx, b, toks.data(), nt, 0);
            prompt_st.end_decode();
            llama_free(ctx);
            ctx = make_ctx(model, n_ctx, route_cb, &all_st);
            all_st.per_decode.push_back(INFINITY);
            decode(ctx, b, toks.data(), nt, 0);
            all_st.end_decode();
            for (int g = 0; g + 1 < n_gen; g++) {
                llama_token t = greedy[g];
                all_st.per_decode.push_back(INFINITY);
                decode(ctx, b, &t, 1, nt + g);
                all_st.end_decode();
            }
            llama_free(ctx);
        } else {
            prompt_st.min_margin = FLT_MAX;
            all_st.min_margin = FLT_MAX;
            all_st.per_decode.assign(n_gen, FLT_MAX);
        }
        llama_batch_free(b);

        fprintf(f, "%s{\"tokens\":[", ip ? "," : "");
        for (int i = 0; i < nt; i++) {
            fprintf(f, "%s%d", i ? "," : "", toks[i]);
        }
        fprintf(f, "],\"greedy\":[");
        for (size_t i = 0; i < greedy.size(); i++) {
            fprintf(f, "%s%d", i ? "," : "", greedy[i]);
        }
        fprintf(f, "],\"greedy_gaps\":[");
        for (size_t i = 0; i < gaps.size(); i++) {
            fprintf(f, "%s%.9g", i ? "," : "", gaps[i]);
        }
        fprintf(f, "],\"greedy_route_margins\":[");
        for (size_t i = 0; i < all_st.per_decode.size(); i++) {
            fprintf(f, "%s%.9g", i ? "," : "", all_st.per_decode[i]);
        }
        fprintf(f, "],\"route_margin_prompt\":%.9g,\"route_margin_all\":%.9g,\"max_expert_tokens\":%d,\"logits\":[",
                prompt_st.min_margin, all_st.min_margin, prompt_st.max_expert_tokens);
        for (size_t i = 0; i < logits.size(); i++) {
            fprintf(f, "%s%.9g", i ? "," : "", logits[i]);
        }
        fprintf(f, "]}");
        float min_gap = *std::min_element(gaps.begin(), gaps.end());
        fprintf(stderr, "# %s prompt %zu: %d tokens, routing margin %.3g (prompt) %.3g (with greedy), min greedy gap %.3g\n",
                model_path, ip, nt, prompt_st.min_margin, all_st.min_margin, min_gap);
    }
    fprintf(f, "]}\n");
    fclose(f);
    llama_model_free(model);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s quantize IN OUT [FTYPE [pure] [requantize] [flat-imatrix] [tt:REGEX=TYPE]...] | ref MODEL OUT.json [-n N] [-u UBATCH] (-p TEXT)...\n", argv[0]);
        return 2;
    }
    llama_log_set(log_cb, nullptr);
    const char * dir = getenv("GGML_BACKEND_DIR");
    if (dir) {
        ggml_backend_load_all_from_path(dir);
    } else {
        ggml_backend_load_all();
    }
    llama_backend_init();
    const std::string cmd = argv[1];
    if (cmd == "quantize") {
        const int ftype = argc > 4 ? atoi(argv[4]) : (int) LLAMA_FTYPE_MOSTLY_Q4_K_M;
        bool pure = false;
        bool requantize = false;
        bool flat = false;
        std::vector<std::pair<std::string, ggml_type>> overrides;
        for (int i = 5; i < argc; i++) {
            const std::string a = argv[i];
            if (a == "pure") {
                pure = true;
            } else if (a == "requantize") {
                requantize = true;
            } else if (a == "flat-imatrix") {
                flat = true;
            } else if (a.rfind("tt:", 0) == 0 && a.find('=') != std::string::npos) {
                const size_t eq = a.rfind('=');
                overrides.emplace_back(a.substr(3, eq - 3), type_by_name(a.substr(eq + 1)));
            } else {
                fprintf(stderr, "quantize: unknown option %s\n", a.c_str());
                return 2;
            }
        }
        return cmd_quantize(argv[2], argv[3], (llama_ftype) ftype, pure, requantize, flat, overrides);
    }
    if (cmd != "ref") {
        return 2;
    }
    int n_gen = 32;
    std::vector<std::string> prompts;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            n_gen = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-u") && i + 1 < argc) {
            g_ubatch = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-p") && i + 1 < argc) {
            prompts.emplace_back(argv[++i]);
        } else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    return cmd_ref(argv[2], argv[3], n_gen, prompts);
}
