// Reference outputs of ggml's CPU backend for the engine's numerical ops (RoPE with and without
// YaRN, softmax with scale and mask, SiLU, SwiGLU, sigmoid, GELU, GEGLU, RMS norm with a weight,
// MoE routing, and attention over an F32 or F16 KV cache for one token and for a batch of
// tokens), written as JSON. Built and run by scripts/gen_engine_refs.sh (x86: linked against one
// prebuilt CPU backend variant of the npm package node-llama-cpp, see that script for versions)
// and scripts/gen_engine_refs_aarch64.sh (the same release built for aarch64, run under qemu).
//
// Usage: gen_engine_refs OUT.json
//
// Every float is written as its IEEE-754 bit pattern (a JSON integer), so the file round-trips
// exactly. Each case is one ggml graph of one op (plus a MUL for the norm weight) computed on
// one thread with ggml_graph_compute_with_ctx. Inputs come from a splitmix64 generator and
// integer-derived floats (no libm), so they do not depend on the machine.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

#if !defined(__aarch64__)
// Exported by every CPU backend variant library: 0 if this CPU lacks the variant's features.
int ggml_backend_score(void);
#endif

#define REF_SEED 0x5EED0E9E7E5E0A11ULL
#include "ref_rand.h"

static struct ggml_context * gctx;
static FILE * out;
static int first_case = 1;

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void put_array(const char * name, const float * v, int64_t n) {
    fprintf(out, ",\"%s\":[", name);
    for (int64_t i = 0; i < n; ++i) {
        fprintf(out, "%s%u", i ? "," : "", bits(v[i]));
    }
    fprintf(out, "]");
}

static void begin_case(const char * op) {
    fprintf(out, "%s\n{\"op\":\"%s\"", first_case ? "" : ",", op);
    first_case = 0;
}

static void compute(struct ggml_tensor * t) {
    struct ggml_cgraph * gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, t);
    if (ggml_graph_compute_with_ctx(gctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(1);
    }
}

static struct ggml_tensor * filled(int64_t ne0, int64_t ne1, int64_t ne2, float amp) {
    struct ggml_tensor * t = ggml_new_tensor_3d(gctx, GGML_TYPE_F32, ne0, ne1, ne2);
    float * d = (float *) t->data;
    for (int64_t i = 0; i < ggml_nelements(t); ++i) {
        d[i] = uniform_pm1() * amp;
    }
    return t;
}

static void rope_case(int mode, int n_dims, float base, float freq_scale, float ext_factor,
                      float attn_factor, int n_ctx_orig) {
    const int head_dim = 64, n_head = 2, n_tok = 5;
    const int32_t pos[5] = { 0, 1, 77, 4095, 30000 };
    const float beta_fast = 32.0f, beta_slow = 1.0f;
    struct ggml_tensor * x = filled(head_dim, n_head, n_tok, 2.0f);
    struct ggml_tensor * p = ggml_new_tensor_1d(gctx, GGML_TYPE_I32, n_tok);
    memcpy(p->data, pos, sizeof pos);
    struct ggml_tensor * y = ggml_rope_ext(gctx, x, p, NULL, n_dims, mode, n_ctx_orig, base,
                                           freq_scale, ext_factor, attn_factor, beta_fast, beta_slow);
    compute(y);
    begin_case("rope");
    fprintf(out, ",\"mode\":\"%s\",\"head_dim\":%d,\"n_head\":%d,\"n_dims\":%d,\"n_ctx_orig\":%d",
            mode == GGML_ROPE_TYPE_NEOX ? "neox" : "norm", head_dim, n_head, n_dims, n_ctx_orig);
    fprintf(out, ",\"freq_base\":%u,\"freq_scale\":%u,\"ext_factor\":%u,\"attn_factor\":%u",
            bits(base), bits(freq_scale), bits(ext_factor), bits(attn_factor));
    fprintf(out, ",\"beta_fast\":%u,\"beta_slow\":%u,\"pos\":[", bits(beta_fast), bits(beta_slow));
    for (int i = 0; i < n_tok; ++i) fprintf(out, "%s%d", i ? "," : "", pos[i]);
    fprintf(out, "]");
    put_array("input", (float *) x->data, ggml_nelements(x));
    put_array("output", (float *) y->data, ggml_nelements(y));
    fprintf(out, "}");
}

// Rows of length n; row r sees its first n_vis[r] elements (the rest masked with -inf).
static void softmax_case(int n, int rows, const int * n_vis, float scale, float amp) {
    struct ggml_tensor * x = filled(n, rows, 1, amp);
    struct ggml_tensor * mask = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, n, rows);
    float * m = (float *) mask->data;
    for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < n; ++i) m[r * n + i] = i < n_vis[r] ? 0.0f : -INFINITY;
    }
    struct ggml_tensor * y = ggml_soft_max_ext(gctx, x, mask, scale, 0.0f);
    compute(y);
    begin_case("softmax");
    fprintf(out, ",\"n\":%d,\"rows\":%d,\"scale\":%u,\"n_visible\":[", n, rows, bits(scale));
    for (int r = 0; r < rows; ++r) fprintf(out, "%s%d", r ? "," : "", n_vis[r]);
    fprintf(out, "]");
    put_array("input", (float *) x->data, ggml_nelements(x));
    put_array("output", (float *) y->data, ggml_nelements(y));
    fprintf(out, "}");
}

static void unary_case(const char * op, int n, float amp) {
    struct ggml_tensor * x = filled(n, 1, 1, amp);
    struct ggml_tensor * y = strcmp(op, "silu") == 0 ? ggml_silu(gctx, x) : ggml_sigmoid(gctx, x);
    compute(y);
    begin_case(op);
    put_array("input", (float *) x->data, n);
    put_array("output", (float *) y->data, n);
    fprintf(out, "}");
}

static void swiglu_case(int n) {
    struct ggml_tensor * g = filled(n, 1, 1, 9.0f);
    struct ggml_tensor * u = filled(n, 1, 1, 3.0f);
    struct ggml_tensor * y = ggml_swiglu_split(gctx, g, u);
    compute(y);
    begin_case("swiglu");
    put_array("gate", (float *) g->data, n);
    put_array("up", (float *) u->data, n);
    put_array("output", (float *) y->data, n);
    fprintf(out, "}");
}

// GELU (tanh form) and GEGLU: ggml's CPU backend looks both up in its f16 table.
static void gelu_case(int n, float amp) {
    struct ggml_tensor * x = filled(n, 1, 1, amp);
    struct ggml_tensor * y = ggml_gelu(gctx, x);
    compute(y);
    begin_case("gelu");
    put_array("input", (float *) x->data, n);
    put_array("output", (float *) y->data, n);
    fprintf(out, "}");
}

// The whole f16 GELU table: every f16 value strictly inside (-10, 10), as inputs.
static void gelu_table_case(void) {
    static float xs[65536];
    int n = 0;
    for (int i = 0; i < 65536; i++) {
        const float x = ggml_fp16_to_fp32((ggml_fp16_t) i);
        if (x > -10.0f && x < 10.0f) {
            xs[n++] = x;
        }
    }
    struct ggml_tensor * x = ggml_new_tensor_1d(gctx, GGML_TYPE_F32, n);
    memcpy(x->data, xs, (size_t) n * sizeof(float));
    struct ggml_tensor * y = ggml_gelu(gctx, x);
    compute(y);
    begin_case("gelu");
    put_array("input", (float *) x->data, n);
    put_array("output", (float *) y->data, n);
    fprintf(out, "}");
}

static void geglu_case(int n) {
    struct ggml_tensor * g = filled(n, 1, 1, 12.0f);
    struct ggml_tensor * u = filled(n, 1, 1, 3.0f);
    struct ggml_tensor * y = ggml_geglu_split(gctx, g, u);
    compute(y);
    begin_case("geglu");
    put_array("gate", (float *) g->data, n);
    put_array("up", (float *) u->data, n);
    put_array("output", (float *) y->data, n);
    fprintf(out, "}");
}

static void rms_norm_case(int n, int rows, float eps) {
    struct ggml_tensor * x = filled(n, rows, 1, 3.0f);
    struct ggml_tensor * w = filled(n, 1, 1, 1.5f);
    struct ggml_tensor * y = ggml_mul(gctx, ggml_rms_norm(gctx, x, eps), w);
    compute(y);
    begin_case("rms_norm");
    fprintf(out, ",\"n\":%d,\"rows\":%d,\"eps\":%u", n, rows, bits(eps));
    put_array("input", (float *) x->data, ggml_nelements(x));
    put_array("weight", (float *) w->data, n);
    put_array("output", (float *) y->data, ggml_nelements(y));
    fprintf(out, "}");
}

// Attention as llama.cpp builds it without flash attention: K cache [hd, n_head_kv, n_kv] and
// transposed V cache [n_kv, hd, n_head_kv] of type kv_type (F32 or F16, converted with ggml's
// row conversion), KQ = mul_mat(permuted K, permuted Q), softmax with scale and a causal
// mask over all n_kv cells (cells >= n_used hold zeros and are masked), KQV = mul_mat(V, KQ).
// Tokens are at positions p0 .. p0 + n_tok - 1 (p0 + n_tok == n_used).
static void attn_case(enum ggml_type kv_type, int n_head, int n_head_kv, int hd, int n_kv, int n_used, int n_tok) {
    const int p0 = n_used - n_tok;
    const float scale = 1.0f / sqrtf((float) hd);
    // K and V values of the used cells, f32, in cache order: k[cell][head][d], v[cell][head][d]
    float * kf = calloc((size_t) n_kv * n_head_kv * hd, sizeof(float));
    float * vf = calloc((size_t) n_kv * n_head_kv * hd, sizeof(float));
    for (int i = 0; i < n_used * n_head_kv * hd; ++i) kf[i] = uniform_pm1() * 2.0f;
    for (int i = 0; i < n_used * n_head_kv * hd; ++i) vf[i] = uniform_pm1();
    float * vt = calloc((size_t) n_kv * n_head_kv * hd, sizeof(float));
    for (int c = 0; c < n_kv; ++c)
        for (int h = 0; h < n_head_kv; ++h)
            for (int d = 0; d < hd; ++d) vt[((size_t) h * hd + d) * n_kv + c] = vf[((size_t) c * n_head_kv + h) * hd + d];
    struct ggml_tensor * kc = ggml_new_tensor_3d(gctx, kv_type, hd, n_head_kv, n_kv);
    struct ggml_tensor * vc = ggml_new_tensor_3d(gctx, kv_type, n_kv, hd, n_head_kv);
    if (kv_type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(kf, (ggml_fp16_t *) kc->data, ggml_nelements(kc));
        ggml_fp32_to_fp16_row(vt, (ggml_fp16_t *) vc->data, ggml_nelements(vc));
    } else {
        memcpy(kc->data, kf, ggml_nbytes(kc));
        memcpy(vc->data, vt, ggml_nbytes(vc));
    }
    struct ggml_tensor * q = filled(hd, n_head, n_tok, 2.0f);
    struct ggml_tensor * mask = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, n_kv, n_tok);
    float * m = (float *) mask->data;
    for (int t = 0; t < n_tok; ++t)
        for (int c = 0; c < n_kv; ++c) m[t * n_kv + c] = c <= p0 + t ? 0.0f : -INFINITY;
    struct ggml_tensor * qp = ggml_permute(gctx, q, 0, 2, 1, 3);
    struct ggml_tensor * kp = ggml_permute(gctx, kc, 0, 2, 1, 3);
    struct ggml_tensor * kq = ggml_mul_mat(gctx, kp, qp);
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(gctx, kq, mask, scale, 0.0f);
    struct ggml_tensor * kqv = ggml_mul_mat(gctx, vc, kq);
    struct ggml_tensor * y = ggml_cont(gctx, ggml_permute(gctx, kqv, 0, 2, 1, 3));
    compute(y);
    begin_case("attention");
    fprintf(out, ",\"kv_type\":\"%s\",\"n_head\":%d,\"n_head_kv\":%d,\"head_dim\":%d,\"n_kv\":%d,\"n_used\":%d,\"n_tok\":%d,\"scale\":%u",
            kv_type == GGML_TYPE_F16 ? "f16" : "f32", n_head, n_head_kv, hd, n_kv, n_used, n_tok, bits(scale));
    put_array("k", kf, (int64_t) n_used * n_head_kv * hd);
    put_array("v", vf, (int64_t) n_used * n_head_kv * hd);
    put_array("q", (float *) q->data, ggml_nelements(q));
    put_array("output", (float *) y->data, ggml_nelements(y));
    fprintf(out, "}");
    free(kf);
    free(vf);
    free(vt);
}

// MoE routing as llama.cpp's build_moe_ffn: probs = softmax(logits) (or sigmoid), ids =
// argsort_top_k(probs, k), weights = get_rows(probs, ids), optionally divided by
// clamp(sum_rows(weights), 2^-14, inf), then scaled unless the scale is 0 or 1.
// With ties > 0, logits are drawn from a few distinct values so that probabilities tie.
static void route_case(int n_expert, int k, int norm, float scale, int sigmoid, int ties) {
    struct ggml_tensor * logits = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, n_expert, 1);
    float * l = (float *) logits->data;
    for (int i = 0; i < n_expert; ++i) {
        l[i] = ties ? (float) rnd(4) * 0.75f : uniform_pm1() * 4.0f;
    }
    struct ggml_tensor * probs = sigmoid ? ggml_sigmoid(gctx, logits) : ggml_soft_max(gctx, logits);
    struct ggml_tensor * ids = ggml_argsort_top_k(gctx, probs, k);
    struct ggml_tensor * w = ggml_get_rows(gctx, ggml_reshape_3d(gctx, probs, 1, n_expert, 1), ids);
    w = ggml_reshape_2d(gctx, w, k, 1);
    if (norm) {
        struct ggml_tensor * sum = ggml_sum_rows(gctx, w);
        sum = ggml_clamp(gctx, sum, 6.103515625e-5f, INFINITY);
        w = ggml_div(gctx, w, sum);
    }
    if (scale != 0.0f && scale != 1.0f) {
        w = ggml_scale(gctx, w, scale);
    }
    struct ggml_cgraph * gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, ids);
    ggml_build_forward_expand(gf, w);
    if (ggml_graph_compute_with_ctx(gctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(1);
    }
    begin_case("route");
    fprintf(out, ",\"k\":%d,\"norm\":%s,\"scale\":%u,\"gating\":\"%s\"", k, norm ? "true" : "false",
            bits(scale), sigmoid ? "sigmoid" : "softmax");
    put_array("logits", l, n_expert);
    fprintf(out, ",\"ids\":[");
    for (int i = 0; i < k; ++i) {
        // ids is a view into the full argsort result; its rows are contiguous
        fprintf(out, "%s%d", i ? "," : "", ((int32_t *) ids->data)[i]);
    }
    fprintf(out, "]");
    put_array("weights", (float *) w->data, k);
    fprintf(out, "}");
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.json\n", argv[0]);
        return 2;
    }
#if defined(__aarch64__)
    ggml_cpu_init();
    if (!ggml_cpu_has_neon() || !ggml_cpu_has_dotprod() || !ggml_cpu_has_fp16_va() ||
        ggml_cpu_has_matmul_int8() || ggml_cpu_has_sve()) {
        fprintf(stderr, "expected a CPU and backend with NEON, dotprod and FP16, without I8MM and SVE\n");
        return 1;
    }
    const char * reference =
        "llama.cpp v0.4.0 (source from npm node-llama-cpp 3.21.1), CPU backend built for aarch64 "
        "-march=armv8.2-a+dotprod+fp16 by scripts/llamacpp-aarch64.sh, run by qemu-aarch64 -cpu cortex-a76";
    const char * generator = "scripts/gen_engine_refs_aarch64.sh";
#else
    if (ggml_backend_score() <= 0) {
        fprintf(stderr, "this CPU lacks the features of the linked backend variant\n");
        return 1;
    }
    ggml_cpu_init();
    const char * reference = "llama.cpp v0.4.0 (npm node-llama-cpp 3.21.1), CPU backend haswell";
    const char * generator = "scripts/gen_engine_refs.sh";
#endif
    struct ggml_init_params params = { 64u << 20, NULL, false };
    gctx = ggml_init(params);
    out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    fprintf(out, "{\"generator\":\"%s\",\"ggml\":\"%s\",\"cases\":[", generator, reference);

    rope_case(GGML_ROPE_TYPE_NORMAL, 64, 10000.0f, 1.0f, 0.0f, 1.0f, 4096);
    rope_case(GGML_ROPE_TYPE_NEOX, 64, 1000000.0f, 1.0f, 0.0f, 1.0f, 32768);
    rope_case(GGML_ROPE_TYPE_NEOX, 48, 10000.0f, 1.0f, 0.0f, 1.0f, 4096);
    rope_case(GGML_ROPE_TYPE_NEOX, 64, 10000.0f, 0.25f, 1.0f, 1.0f, 4096);
    rope_case(GGML_ROPE_TYPE_NORMAL, 64, 500000.0f, 0.125f, 1.0f, 0.9f, 8192);

    const int vis_a[3] = { 37, 30, 1 };
    softmax_case(37, 3, vis_a, 0.125f, 40.0f);
    const int vis_b[4] = { 21, 256, 250, 8 };
    softmax_case(256, 4, vis_b, 0.088388f, 30.0f);
    const int vis_c[2] = { 8, 60 };
    softmax_case(60, 2, vis_c, 1.0f, 4.0f);

    unary_case("silu", 203, 12.0f);
    unary_case("sigmoid", 64, 10.0f);
    swiglu_case(203);
    rms_norm_case(200, 3, 1e-6f);
    rms_norm_case(37, 2, 1e-5f);

    route_case(8, 2, 1, 0.0f, 0, 0);
    route_case(60, 4, 0, 2.5f, 0, 0);
    route_case(128, 8, 1, 0.0f, 0, 0);
    route_case(64, 6, 1, 1.0f, 1, 0);
    route_case(16, 4, 1, 0.0f, 0, 1);
    route_case(128, 8, 1, 0.0f, 0, 1);

    attn_case(GGML_TYPE_F32, 4, 2, 64, 256, 13, 1);
    attn_case(GGML_TYPE_F32, 4, 2, 64, 256, 14, 4);
    attn_case(GGML_TYPE_F16, 4, 2, 64, 256, 13, 1);
    attn_case(GGML_TYPE_F16, 4, 2, 64, 256, 14, 4);

    // appended last, so that the cases above keep their inputs
    gelu_case(4099, 12.0f);
    gelu_case(203, 0.5f);
    geglu_case(2051);
    gelu_table_case();
    // batches of 8 tokens: on aarch64 the F16 cache's products go to tinyBLAS in f16 from 8
    attn_case(GGML_TYPE_F32, 4, 2, 64, 256, 20, 8);
    attn_case(GGML_TYPE_F16, 4, 2, 64, 256, 20, 8);

    fprintf(out, "\n]}\n");
    fclose(out);
    ggml_free(gctx);
    return 0;
}
