// Prefill and decode timing of llama.cpp through its C API, for comparison with `sluice run`.
// Built and run by scripts/bench_resident.sh against the prebuilt libraries of node-llama-cpp
// (see scripts/llamacpp-npm.sh).
//
//   bench_llamacpp -m MODEL.gguf (-p TEXT | -f FILE) [-t THREADS] [-n N_DECODE] [-c N_CTX]
//                  [-b N_UBATCH] [--no-threadpool]
//
// What it does, in the order sluice's `run` does the same work:
//   - loads the model with llama.cpp's defaults (memory map, weights repacked where the CPU
//     backend repacks them), every layer on the CPU;
//   - tokenizes the text as is (BOS/EOS as the vocabulary's metadata asks, special-token text not
//     parsed, no chat template);
//   - creates a context of N_CTX cells (default 4096, sluice's default), KV cache F16 (both
//     engines' default), flash attention off (sluice has none), n_batch = n_ubatch = N_UBATCH
//     (default 512, sluice's default --ubatch), n_threads = n_threads_batch = THREADS, one
//     sequence; a persistent ggml thread pool is attached as llama-cli and llama-bench do
//     (--no-threadpool leaves it to ggml, which then starts and joins threads on every graph);
//   - prefill: the time of the llama_decode calls of the whole prompt, logits of the last
//     position only (one call when the prompt fits in N_UBATCH);
//   - decode: N_DECODE greedy tokens (argmax over the last logits, end-of-generation tokens
//     included), each token one llama_decode; only the llama_decode calls are timed (the argmax
//     is not), as sluice times only its forward passes.
//
// Output: one line on standard output,
//   llamacpp cpu=<features> threads=T n_prompt=P prefill_s=S prefill_tps=X n_decode=N
//            decode_s=S decode_tps=Y load_s=L
// where <features> lists the CPU backend's reported features (which library was loaded) and
// prefill_tps = P / prefill_s, decode_tps = N / decode_s, and load_s the time from the start of the
// model's load to a ready context (thread pool attached), so that load_s + prefill_s is the time to
// the first token as sluice counts it. llama.cpp's log goes to standard error.
// The environment variable GGML_BACKEND_DIR names the directory of the CPU backend libraries
// (ggml picks the best one there for this CPU).
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

bool g_quiet = false;

void log_cb(enum ggml_log_level level, const char * text, void *) {
    if (!g_quiet || level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

double now_s() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const char * msg) {
    fprintf(stderr, "bench_llamacpp: %s\n", msg);
    exit(1);
}

// The CPU backend's feature list, e.g. "AVX2,FMA,F16C,AVX512,..." (value "1" features only).
std::string cpu_features() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        die("no CPU backend device");
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    std::string out;
    if (!get) {
        return "unknown";
    }
    for (ggml_backend_feature * f = get(reg); f && f->name; f++) {
        if (strcmp(f->value, "1") != 0) {
            continue;
        }
        if (!out.empty()) {
            out += ',';
        }
        out += f->name;
    }
    return out.empty() ? "none" : out;
}

}  // namespace

int main(int argc, char ** argv) {
    std::string model_path;
    std::string text;
    bool have_text = false;
    int n_threads = 1;
    int n_decode = 64;
    int n_ctx = 4096;
    int n_ubatch = 512;
    bool use_threadpool = true;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool more = i + 1 < argc;
        if (a == "-m" && more) {
            model_path = argv[++i];
        } else if (a == "-p" && more) {
            text = argv[++i];
            have_text = true;
        } else if (a == "-f" && more) {
            std::ifstream in(argv[++i], std::ios::binary);
            if (!in) {
                die("cannot read the prompt file");
            }
            std::stringstream ss;
            ss << in.rdbuf();
            text = ss.str();
            have_text = true;
        } else if (a == "-t" && more) {
            n_threads = atoi(argv[++i]);
        } else if (a == "-n" && more) {
            n_decode = atoi(argv[++i]);
        } else if (a == "-c" && more) {
            n_ctx = atoi(argv[++i]);
        } else if (a == "-b" && more) {
            n_ubatch = atoi(argv[++i]);
        } else if (a == "--no-threadpool") {
            use_threadpool = false;
        } else {
            fprintf(stderr,
                    "usage: %s -m MODEL (-p TEXT | -f FILE) [-t THREADS] [-n N_DECODE] [-c N_CTX] [-b N_UBATCH] "
                    "[--no-threadpool]\n",
                    argv[0]);
            return 2;
        }
    }
    if (model_path.empty() || !have_text || n_threads < 1 || n_decode < 0 || n_ctx < 1 || n_ubatch < 1) {
        die("missing or invalid arguments (see the usage in the source)");
    }

    llama_log_set(log_cb, nullptr);
    const char * dir = getenv("GGML_BACKEND_DIR");
    if (dir) {
        ggml_backend_load_all_from_path(dir);
    } else {
        ggml_backend_load_all();
    }
    llama_backend_init();
    const std::string features = cpu_features();

    const double t_load = now_s();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die("failed to load the model");
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> toks(text.size() + 8);
    const int n_prompt = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), true, false);
    if (n_prompt <= 0) {
        die("tokenization failed");
    }
    toks.resize(n_prompt);
    if (n_prompt + n_decode > n_ctx) {
        die("prompt plus decoded tokens do not fit in the context");
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ubatch;
    cp.n_ubatch = n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("failed to create a context");
    }

    ggml_threadpool_t pool = nullptr;
    decltype(ggml_threadpool_free) * pool_free = nullptr;
    if (use_threadpool) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        auto pool_new = (decltype(ggml_threadpool_new) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
        pool_free = (decltype(ggml_threadpool_free) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
        if (!pool_new || !pool_free) {
            die("the CPU backend does not export its thread pool functions");
        }
        ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
        pool = pool_new(&tpp);
        if (!pool) {
            die("cannot create the thread pool");
        }
        llama_attach_threadpool(ctx, pool, nullptr);
    }
    const double load_s = now_s() - t_load;
    g_quiet = true;

    llama_batch b = llama_batch_init(n_ubatch, 0, 1);
    auto submit = [&](const llama_token * t, int n, int pos0) {
        b.n_tokens = n;
        for (int i = 0; i < n; i++) {
            b.token[i] = t[i];
            b.pos[i] = pos0 + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = (pos0 + i == n_prompt - 1) || pos0 >= n_prompt;
        }
        if (llama_decode(ctx, b) != 0) {
            die("llama_decode failed");
        }
    };

    // Prefill, in chunks of n_ubatch tokens (a single call for prompts up to n_ubatch).
    const double t0 = now_s();
    for (int i = 0; i < n_prompt; i += n_ubatch) {
        submit(toks.data() + i, std::min(n_ubatch, n_prompt - i), i);
    }
    const double prefill_s = now_s() - t0;

    double decode_s = 0.0;
    const float * logits = llama_get_logits_ith(ctx, -1);
    for (int g = 0; g < n_decode; g++) {
        llama_token best = 0;
        for (int j = 1; j < n_vocab; j++) {
            if (logits[j] > logits[best]) {
                best = j;
            }
        }
        const double t = now_s();
        submit(&best, 1, n_prompt + g);
        decode_s += now_s() - t;
        logits = llama_get_logits_ith(ctx, -1);
    }

    printf("llamacpp cpu=%s threads=%d n_prompt=%d prefill_s=%.6f prefill_tps=%.3f n_decode=%d decode_s=%.6f decode_tps=%.3f load_s=%.6f\n",
           features.c_str(), n_threads, n_prompt, prefill_s, n_prompt / prefill_s, n_decode, decode_s,
           n_decode > 0 ? n_decode / decode_s : 0.0, load_s);

    llama_batch_free(b);
    llama_free(ctx);
    if (pool) {
        pool_free(pool);
    }
    llama_model_free(model);
    return 0;
}
