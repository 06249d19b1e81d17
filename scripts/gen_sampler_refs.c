// Reference draws of llama.cpp's sampler chain, for crates/sampler/tests/llamacpp_refs.rs.
//
// Builds the chain llama.cpp's common_sampler_init builds at default settings (penalties,
// DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC, temperature, dist; the ones disabled at
// their defaults included, min_keep 0) through the public llama.h API, with the parameter
// sets and seeds below, feeds it deterministic logit rows and prints the chosen ids as JSON.
// It also applies single stages and records the surviving candidate order.
//
// The logit rows come from a generator the Rust test repeats exactly (documented in
// crates/sampler/tests/fixtures/README.md): splitmix64 seeded with a case's logit_seed, one
// row after another, each of a "kind" (0 normal, 1 peaked, 2 ties, 3 flat, 4 masked, 5 wide);
// all values are built from integers, so they are the same floats on every machine.
//
// Usage: gen_sampler_refs > sampler_refs.json

#include "llama.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint32_t rnd(uint32_t n) { return (uint32_t) (next_u64() % n); }

// Sum of four uniform integers in [-2^21, 2^21), an integer below 2^23 in magnitude.
static int32_t normal_int(void) {
    int32_t s = 0;
    for (int i = 0; i < 4; ++i) {
        s += (int32_t) rnd(1u << 22) - (1 << 21);
    }
    return s;
}

#define N_KINDS 6

static void gen_logits(float * out, int n, int kind) {
    switch (kind) {
        case 0:  // normal: about N(0, 2.3^2), within [-8, 8)
            for (int i = 0; i < n; ++i) out[i] = (float) normal_int() * 0x1p-20f;
            break;
        case 1:  // peaked: normal plus one dominant token at 12..19
            for (int i = 0; i < n; ++i) out[i] = (float) normal_int() * 0x1p-20f;
            {
                uint32_t j = rnd((uint32_t) n);
                out[j] = 12.0f + (float) rnd(8);
            }
            break;
        case 2:  // ties: 16 levels of 0.5 in [-4, 3.5]
            for (int i = 0; i < n; ++i) out[i] = (float) ((int32_t) rnd(16) - 8) * 0.5f;
            break;
        case 3:  // flat: all equal
            for (int i = 0; i < n; ++i) out[i] = 1.0f;
            break;
        case 4:  // masked: normal with about a quarter at -inf
            for (int i = 0; i < n; ++i) {
                float x = (float) normal_int() * 0x1p-20f;
                out[i] = rnd(4) == 0 ? -INFINITY : x;
            }
            break;
        default:  // wide: normal times 8, within [-64, 64)
            for (int i = 0; i < n; ++i) out[i] = (float) normal_int() * 0x1p-17f;
            break;
    }
}

struct params {
    const char * name;
    float temp;
    int32_t top_k;
    float top_p;
    float min_p;
};

static const struct params PARAMS[] = {
    {"defaults", 0.8f, 40, 0.95f, 0.05f},
    {"temp0", 0.0f, 40, 0.95f, 0.05f},
    {"temp_negative", -1.0f, 40, 0.95f, 0.05f},
    {"temp0_no_top_k", 0.0f, 0, 0.95f, 0.05f},
    {"top_k1", 0.8f, 1, 0.95f, 0.05f},
    {"top_p1", 0.8f, 40, 1.0f, 0.05f},
    {"min_p0", 0.8f, 40, 0.95f, 0.0f},
    {"high_temp", 2.0f, 40, 0.95f, 0.05f},
    {"top_k200", 0.8f, 200, 0.95f, 0.05f},
    {"top_k200_open", 1.5f, 200, 1.0f, 0.0f},
    {"no_top_k", 0.8f, 0, 0.95f, 0.05f},
    {"no_top_k_top_p_0999", 1.2f, 0, 0.999f, 0.0f},
    {"min_p_only", 0.8f, 0, 1.0f, 0.05f},
    {"all_off", 1.0f, 0, 1.0f, 0.0f},
};
#define N_PARAMS (sizeof PARAMS / sizeof PARAMS[0])

static const int VOCABS[] = {7, 1000, 5000, 151936};
#define N_VOCABS (sizeof VOCABS / sizeof VOCABS[0])
static const uint32_t SEEDS[] = {0, 42, 3735928559u};
#define N_SEEDS (sizeof SEEDS / sizeof SEEDS[0])

static struct llama_sampler * default_chain(const struct params * p, uint32_t seed, int n_vocab) {
    struct llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    // common_params_sampling defaults for everything but the parameters under test
    llama_sampler_chain_add(chain, llama_sampler_init_penalties(n_vocab, 64, 1.0f, 0.0f, 0.0f));
    static const char * breakers[] = {"\n", ":", "\"", "*"};
    llama_sampler_chain_add(chain, llama_sampler_init_dry(NULL, 0.0f, 1.75f, 2, 64, breakers, 4));
    llama_sampler_chain_add(chain, llama_sampler_init_top_n_sigma(-1.0f));
    llama_sampler_chain_add(chain, llama_sampler_init_top_k(p->top_k));
    llama_sampler_chain_add(chain, llama_sampler_init_typical(1.0f, 0));
    llama_sampler_chain_add(chain, llama_sampler_init_top_p(p->top_p, 0));
    llama_sampler_chain_add(chain, llama_sampler_init_min_p(p->min_p, 0));
    llama_sampler_chain_add(chain, llama_sampler_init_xtc(0.0f, 0.1f, 0, seed));
    llama_sampler_chain_add(chain, llama_sampler_init_temp_ext(p->temp, 0.0f, 1.0f));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    return chain;
}

static void load(llama_token_data_array * arr, llama_token_data * buf, const float * logits, int n) {
    for (int i = 0; i < n; ++i) {
        buf[i].id = i;
        buf[i].logit = logits[i];
        buf[i].p = 0.0f;
    }
    arr->data = buf;
    arr->size = (size_t) n;
    arr->selected = -1;
    arr->sorted = false;
}

// FNV-1a 64 over the ids as little-endian u32.
static uint64_t fnv_ids(const llama_token_data_array * arr) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < arr->size; ++i) {
        uint32_t id = (uint32_t) arr->data[i].id;
        for (int b = 0; b < 4; ++b) {
            h ^= (id >> (8 * b)) & 0xff;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

#define HEAD 64

int main(void) {
    llama_backend_init();
    const int max_vocab = 151936;
    float * logits = malloc(sizeof(float) * max_vocab);
    llama_token_data * buf = malloc(sizeof(llama_token_data) * max_vocab);
    if (!logits || !buf) return 1;

    printf("{\n\"tool\":\"llama.cpp release v0.4.0 (libllama prebuilt in the npm package node-llama-cpp 3.21.1)\",\n");
    printf("\"generator\":\"scripts/gen_sampler_refs.sh\",\n");
    printf("\"layout\":{\"cases\":\"one default chain per (params, vocab, seed): ids drawn from `steps` logit rows "
           "generated in a row from splitmix64(logit_seed), row j of kind (j + kind_offset) %% 6\","
           "\"stages\":\"one stage applied to one logit row (splitmix64(logit_seed), kind): candidate count, "
           "whether sorted, the first ids and FNV-1a 64 of all ids in order\"},\n");
    printf("\"cases\":[\n");
    int n_case = 0;
    for (size_t ip = 0; ip < N_PARAMS; ++ip) {
        for (size_t iv = 0; iv < N_VOCABS; ++iv) {
            for (size_t is = 0; is < N_SEEDS; ++is) {
                const struct params * p = &PARAMS[ip];
                const int n = VOCABS[iv];
                const uint32_t seed = SEEDS[is];
                const int steps = n > 10000 ? 6 : 12;
                const uint64_t logit_seed = 1000 + (uint64_t) n_case;
                const int kind_offset = n_case % N_KINDS;
                struct llama_sampler * chain = default_chain(p, seed, n);
                rng_state = logit_seed;
                printf("%s{\"name\":\"%s\",\"temp\":%.9g,\"top_k\":%d,\"top_p\":%.9g,\"min_p\":%.9g,\"seed\":%u,"
                       "\"vocab\":%d,\"logit_seed\":%llu,\"kind_offset\":%d,\"steps\":%d,\"ids\":[",
                       n_case ? ",\n" : "", p->name, p->temp, p->top_k, p->top_p, p->min_p, seed, n,
                       (unsigned long long) logit_seed, kind_offset, steps);
                for (int j = 0; j < steps; ++j) {
                    gen_logits(logits, n, (j + kind_offset) % N_KINDS);
                    llama_token_data_array arr;
                    load(&arr, buf, logits, n);
                    llama_sampler_apply(chain, &arr);
                    if (arr.selected < 0 || (size_t) arr.selected >= arr.size) return 2;
                    llama_token id = arr.data[arr.selected].id;
                    llama_sampler_accept(chain, id);
                    printf("%s%d", j ? "," : "", id);
                }
                printf("]}");
                llama_sampler_free(chain);
                ++n_case;
            }
        }
    }
    printf("\n],\n\"stages\":[\n");
    static const int STAGE_VOCABS[] = {100, 1000, 5000, 151936};
    int n_stage = 0;
    for (size_t iv = 0; iv < sizeof STAGE_VOCABS / sizeof STAGE_VOCABS[0]; ++iv) {
        const int n = STAGE_VOCABS[iv];
        for (int kind = 0; kind < N_KINDS; ++kind) {
            for (int st = 0; st < 8; ++st) {
                const char * stage;
                float arg;
                struct llama_sampler * s;
                switch (st) {
                    case 0: stage = "top_k"; arg = 40; s = llama_sampler_init_top_k(40); break;
                    case 1: stage = "top_k"; arg = 200; s = llama_sampler_init_top_k(200); break;
                    case 2: stage = "top_k"; arg = (float) n; s = llama_sampler_init_top_k(n); break;
                    case 3: stage = "top_p"; arg = 0.95f; s = llama_sampler_init_top_p(0.95f, 0); break;
                    case 4: stage = "top_p"; arg = 0.5f; s = llama_sampler_init_top_p(0.5f, 0); break;
                    case 5: stage = "min_p"; arg = 0.05f; s = llama_sampler_init_min_p(0.05f, 0); break;
                    case 6: stage = "min_p"; arg = 0.5f; s = llama_sampler_init_min_p(0.5f, 0); break;
                    default: stage = "temp"; arg = 0.0f; s = llama_sampler_init_temp(0.0f); break;
                }
                const uint64_t logit_seed = 500000 + (uint64_t) n_stage;
                rng_state = logit_seed;
                gen_logits(logits, n, kind);
                llama_token_data_array arr;
                load(&arr, buf, logits, n);
                llama_sampler_apply(s, &arr);
                if (st == 7) {
                    // temp 0 marks all but one logit -inf: record the survivor's position
                    size_t keep = 0;
                    for (size_t i = 0; i < arr.size; ++i) {
                        if (arr.data[i].logit != -INFINITY) { keep = i; break; }
                    }
                    printf("%s{\"stage\":\"%s\",\"arg\":%.9g,\"vocab\":%d,\"kind\":%d,\"logit_seed\":%llu,"
                           "\"len\":%zu,\"sorted\":%s,\"kept\":%zu}",
                           n_stage ? ",\n" : "", stage, arg, n, kind, (unsigned long long) logit_seed,
                           arr.size, arr.sorted ? "true" : "false", keep);
                } else {
                    printf("%s{\"stage\":\"%s\",\"arg\":%.9g,\"vocab\":%d,\"kind\":%d,\"logit_seed\":%llu,"
                           "\"len\":%zu,\"sorted\":%s,\"fnv\":\"%016llx\",\"head\":[",
                           n_stage ? ",\n" : "", stage, arg, n, kind, (unsigned long long) logit_seed,
                           arr.size, arr.sorted ? "true" : "false", (unsigned long long) fnv_ids(&arr));
                    for (size_t i = 0; i < arr.size && i < HEAD; ++i) {
                        printf("%s%d", i ? "," : "", arr.data[i].id);
                    }
                    printf("]}");
                }
                llama_sampler_free(s);
                ++n_stage;
            }
        }
    }
    printf("\n]}\n");
    free(logits);
    free(buf);
    return 0;
}
