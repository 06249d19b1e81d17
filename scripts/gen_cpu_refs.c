// Reference activation quantization and dot products computed by ggml's CPU backend, written
// as a GGUF file with ggml's own GGUF writer. Built and run by scripts/gen_cpu_refs.sh (x86:
// linked against one prebuilt CPU backend variant of the npm package node-llama-cpp, see that
// script for versions and the variant) and scripts/gen_cpu_refs_aarch64.sh (aarch64: the same
// llama.cpp release built from source for a Cortex-A76 and run under qemu).
//
// Usage: gen_cpu_refs OUT.gguf
//
// Everything goes through the CPU backend's own type table (ggml_get_type_traits_cpu):
// `from_float` is what the backend runs on activations before a matrix multiplication
// and `vec_dot` is its dot kernel for a weight type against its `vec_dot_type`.
//
// Tensors (names use ggml's type names, e.g. "q4_K"; 2-D tensors are rows of ne0):
//   act.input    f32 [ACT_LEN, ACT_ROWS]: activation rows (weight-like data, exact rounding
//                ties, zero / sparse / tiny / large blocks, random magnitudes)
//   act.<t>      from_float of <t> for each act.input row, t in q8_0, q8_1, q8_K, f16, bf16
//                (block types: the first ACT_Q_LEN elements of each row)
//   edge.input   f32 [EDGE_LEN]: conversion edge cases (f16/bf16 halfway values, f16
//                subnormals and overflow, signed zeros, huge and tiny magnitudes)
//   edge.<t>     from_float of <t> for edge.input (block types: the first EDGE_Q_LEN)
//   w.<t>        weight rows of <t> [W_LEN(t), 2]: row 0 is ggml_quantize_chunk of random
//                weight-like floats, row 1 random valid blocks (random bits, moderate scales)
//   dot.<t>      f32 [ACT_ROWS, 2, n_lengths]: vec_dot(n, w.<t> row i, act row j) for each
//                n of the metadata array dot.<t>.lengths, the activation row taken from
//                act.<vec_dot_type(t)> (f32: act.input); both rows are cut to their first
//                n elements (whole blocks, so a prefix of a row is a row of length n)
//   iqp.*        (x86) the IQ panel product of llama.cpp's AVX2 build: iqp.x f32 [512, 9]
//                activation rows, iqp.<t>.w 16 weight rows of each panel type, iqp.<t>.y<k>
//                f32 [16, k] the graph's MUL_MAT of them with the first k rows (k = 7: vec_dot;
//                8, 9: the panel)
//
// Everything is deterministic: a splitmix64 generator and integer-derived floats, no libm.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"

#if !defined(__aarch64__)
// Exported by every CPU backend variant library: 0 if this CPU lacks the variant's
// features, otherwise a positive priority.
int ggml_backend_score(void);
#endif

#define REF_SEED 0xC0FFEE15C0DE5EEDULL
#include "ref_rand.h"

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// A finite normal f16 of moderate size: random sign, exponent 2^-10 .. 2^4.
static uint16_t f16_scale_bits(void) {
    uint16_t sign = (uint16_t) (rnd(2) << 15);
    uint16_t exp = (uint16_t) (5 + rnd(15));
    uint16_t man = (uint16_t) rnd(1024);
    return sign | (uint16_t) (exp << 10) | man;
}

// Weight-like floats: normal-ish with a different spread per 32, occasional outliers.
static void weight_floats(float * v, int n) {
    for (int j = 0; j < n; j += 32) {
        float spread = pow2f(-6 + (int) rnd(7)) * (1.0f + uniform_pm1() * 0.5f);
        for (int i = j; i < j + 32 && i < n; ++i) {
            float val = normalish() * spread;
            if (rnd(64) == 0) val *= 8.0f;
            v[i] = val;
        }
    }
}

// Random valid blocks: random bytes with the scale fields patched to moderate finite
// values (float types: weight-like values), so every dot product stays finite.
static void random_row(enum ggml_type t, uint8_t * buf, int64_t n) {
    if (t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
        float * f = malloc(sizeof(float) * (size_t) n);
        for (int64_t i = 0; i < n; ++i) {
            f[i] = normalish() * pow2f(-4 + (int) rnd(7));
        }
        ggml_quantize_chunk(t, f, buf, 0, 1, n, NULL);
        free(f);
        return;
    }
    const size_t ts = ggml_type_size(t);
    const int64_t n_blocks = n / ggml_blck_size(t);
    for (size_t i = 0; i < ts * (size_t) n_blocks; ++i) {
        buf[i] = (uint8_t) next_u64();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        uint8_t * blk = buf + ts * (size_t) b;
        int offs[2] = {-1, -1};
        switch (t) {
            case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL:
            case GGML_TYPE_IQ4_XS:
                offs[0] = 0; break;
            case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
                offs[0] = 0; offs[1] = 2; break;
            case GGML_TYPE_Q2_K: offs[0] = 80; offs[1] = 82; break;
            case GGML_TYPE_Q3_K: offs[0] = 108; break;
            case GGML_TYPE_Q6_K: offs[0] = 208; break;
            case GGML_TYPE_TQ2_0: offs[0] = 64; break;
            case GGML_TYPE_TQ1_0: offs[0] = 52; break;
            case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
            case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S:
                offs[0] = 0; break;
            case GGML_TYPE_IQ1_M: { // the f16 d in the top nibbles of the four scale words
                const uint16_t h = f16_scale_bits();
                for (int w = 0; w < 4; ++w) {
                    uint8_t * p = blk + 48 + 2 * w;
                    p[1] = (uint8_t) ((p[1] & 0x0f) | (((h >> (4 * w)) & 0xf) << 4));
                }
                break;
            }
            case GGML_TYPE_MXFP4: blk[0] = (uint8_t) (117 + rnd(21)); break; // 2^-11 .. 2^9
            default:
                fprintf(stderr, "random_row: unexpected type %s\n", ggml_type_name(t));
                exit(1);
        }
        for (int k = 0; k < 2; ++k) {
            if (offs[k] >= 0) put_u16(blk + offs[k], f16_scale_bits());
        }
    }
}

#define ACT_ROWS 4
#define ACT_Q_LEN 2048
#define ACT_LEN (ACT_Q_LEN + 15)
#define EDGE_Q_LEN 512
#define EDGE_LEN (EDGE_Q_LEN + 13)

// Activation rows. Magnitudes stay below 2^11 so that a Q8_1 block sum (up to 32 times the
// block maximum) fits in f16.
static void make_activations(float * x) {
    for (int r = 0; r < ACT_ROWS; ++r) {
        float * v = x + (size_t) ACT_LEN * r;
        switch (r) {
            case 0: // weight-like
                weight_floats(v, ACT_LEN);
                break;
            case 1: // exact rounding ties: every 32 (and so every 256) has a maximum of
                    // +-127 * 2^e, making the Q8 multipliers exact powers of two, and the
                    // other values are (k + 1/2) * 2^e
                for (int s = 0; s < ACT_LEN; s += 256) {
                    const int e = -8 + (int) rnd(12);
                    const float p = pow2f(e);
                    for (int i = s; i < s + 256 && i < ACT_LEN; ++i) {
                        v[i] = ((float) ((int) rnd(254) - 127) + 0.5f) * p;
                    }
                    for (int j = s; j < s + 256 && j < ACT_LEN; j += 32) {
                        const int len = ACT_LEN - j < 32 ? ACT_LEN - j : 32;
                        v[j + (int) rnd((uint32_t) len)] = (rnd(2) ? -127.0f : 127.0f) * p;
                    }
                }
                break;
            case 2: // block kinds: zero, sparse, tiny, large, one-signed, integers, outlier
                for (int j = 0; j < ACT_LEN; j += 32) {
                    const int len = ACT_LEN - j < 32 ? ACT_LEN - j : 32;
                    float * b = v + j;
                    // the third super-block is zero throughout
                    const int kind = (j >= 512 && j < 768) ? 0 : (int) rnd(8);
                    for (int i = 0; i < len; ++i) {
                        switch (kind) {
                            case 0: b[i] = 0.0f; break;
                            case 1: b[i] = rnd(6) == 0 ? normalish() : 0.0f; break;
                            case 2: b[i] = normalish() * pow2f(-30); break;
                            case 3: b[i] = normalish() * pow2f(9); break;
                            case 4: b[i] = 0.25f + uniform_pm1() + 1.0f; break;
                            case 5: b[i] = -(float) rnd(100); break;
                            case 6: b[i] = uniform_pm1() * pow2f(-12); break;
                            default: b[i] = normalish(); break;
                        }
                    }
                    if (kind == 6) b[(int) rnd((uint32_t) len)] = 5.0f;
                }
                break;
            default: // random magnitude per 32: 2^-10 .. 2^8
                for (int j = 0; j < ACT_LEN; j += 32) {
                    const float scale = pow2f(-10 + (int) rnd(19)) * (1.0f + uniform_pm1() * 0.5f);
                    for (int i = j; i < j + 32 && i < ACT_LEN; ++i) {
                        v[i] = normalish() * scale;
                    }
                }
                break;
        }
    }
}

// Conversion edge cases (finite inputs only).
static void make_edges(float * v) {
    int i = 0;
    // f16 halfway values: an f16 value plus half its ulp (ties: even and odd mantissas),
    // and one f32 ulp either side of the halfway point
    for (int k = 0; k < 96; ++k) {
        const int e = -14 + (int) rnd(30);               // normal f16 exponents
        const uint32_t m = rnd(1024);
        const uint32_t bits = ((uint32_t) (e + 127) << 23) | (m << 13) | (1u << 12);
        const int32_t nudge = (int32_t) (k % 3) - 1;     // -1, 0, +1 f32 ulp
        v[i++] = from_bits((bits + (uint32_t) nudge) | (rnd(2) << 31));
    }
    // f16 subnormal range and underflow: 2^-26 .. 2^-14
    for (int k = 0; k < 64; ++k) {
        v[i++] = (rnd(2) ? -1.0f : 1.0f) * (1.0f + uniform_pm1() * 0.5f) * pow2f(-26 + (int) rnd(13));
    }
    // around the f16 maximum: 65504 .. 65536 and beyond (overflow to infinity)
    for (int k = 0; k < 32; ++k) {
        v[i++] = (k % 2 ? -1.0f : 1.0f) * (65504.0f + (float) (k * 2));
    }
    // bf16 halfway values (low 16 bits 0x8000) with even and odd kept bits, and neighbours
    for (int k = 0; k < 96; ++k) {
        const uint32_t hi = ((uint32_t) (100 + rnd(60)) << 7) | rnd(128);
        const uint32_t lo = k % 3 == 0 ? 0x8000u : k % 3 == 1 ? 0x7FFFu : 0x8001u;
        v[i++] = from_bits(((hi << 16) | lo) | (rnd(2) << 31));
    }
    // signed zeros and f32 subnormals
    for (int k = 0; k < 32; ++k) {
        v[i++] = k % 4 == 0 ? 0.0f : k % 4 == 1 ? -0.0f : from_bits(rnd(1u << 23) | (rnd(2) << 31));
    }
    // huge magnitudes (bf16 only stays finite; f16 overflows)
    for (int k = 0; k < 32; ++k) {
        v[i++] = (rnd(2) ? -1.0f : 1.0f) * (1.0f + uniform_pm1() * 0.5f) * pow2f(20 + (int) rnd(100));
    }
    // the rest: plain values
    while (i < EDGE_LEN) {
        v[i++] = normalish();
    }
}

static struct ggml_context * gctx;
static struct gguf_context * out;

static void add(const char * name, enum ggml_type t, int64_t ne0, int64_t ne1, int64_t ne2, const void * data) {
    struct ggml_tensor * tensor = ggml_new_tensor_3d(gctx, t, ne0, ne1, ne2);
    ggml_set_name(tensor, name);
    memcpy(tensor->data, data, ggml_nbytes(tensor));
    gguf_add_tensor(out, tensor);
}

static const struct ggml_type_traits_cpu * cpu_traits(enum ggml_type t) {
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
    if (!tr || !tr->from_float) {
        fprintf(stderr, "no CPU from_float for %s\n", ggml_type_name(t));
        exit(1);
    }
    return tr;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.gguf\n", argv[0]);
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
        "ggml CPU backend of llama.cpp release v0.4.0 (source from node-llama-cpp 3.21.1), built for "
        "aarch64 -march=armv8.2-a+dotprod+fp16 by scripts/llamacpp-aarch64.sh, run by qemu-aarch64 -cpu cortex-a76";
#else
    if (ggml_backend_score() <= 0) {
        fprintf(stderr, "this CPU lacks the features of the linked CPU backend variant\n");
        return 1;
    }
    ggml_cpu_init();
    if (!ggml_cpu_has_avx2() || !ggml_cpu_has_fma() || !ggml_cpu_has_f16c() || ggml_cpu_has_avx512()) {
        fprintf(stderr, "expected a CPU backend built for AVX2/FMA/F16C without AVX-512\n");
        return 1;
    }
    const char * reference =
        "ggml CPU backend from node-llama-cpp 3.21.1 (llama.cpp release v0.4.0), libggml-cpu-haswell.so";
#endif

    struct ggml_init_params params = { 16u << 20, NULL, false };
    gctx = ggml_init(params);
    out = gguf_init_empty();
    gguf_set_val_str(out, "general.architecture", "cpu-kernel-fixture");
    gguf_set_val_str(out, "fixture.generator", "scripts/gen_cpu_refs.c");
    gguf_set_val_str(out, "fixture.reference", reference);

    char name[64];

    // (a) Activation quantization.
    static const enum ggml_type act_types[] = {
        GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q8_K, GGML_TYPE_F16, GGML_TYPE_BF16,
    };
    const int n_act_types = (int) (sizeof act_types / sizeof act_types[0]);
    float * x = malloc(sizeof(float) * ACT_LEN * ACT_ROWS);
    make_activations(x);
    add("act.input", GGML_TYPE_F32, ACT_LEN, ACT_ROWS, 1, x);
    uint8_t * act_q[GGML_TYPE_COUNT] = {0};
    for (int k = 0; k < n_act_types; ++k) {
        const enum ggml_type t = act_types[k];
        const int64_t len = ggml_blck_size(t) == 1 ? ACT_LEN : ACT_Q_LEN;
        const size_t rs = ggml_row_size(t, len);
        act_q[t] = malloc(rs * ACT_ROWS);
        for (int r = 0; r < ACT_ROWS; ++r) {
            cpu_traits(t)->from_float(x + (size_t) ACT_LEN * r, act_q[t] + rs * r, len);
        }
        snprintf(name, sizeof name, "act.%s", ggml_type_name(t));
        add(name, t, len, ACT_ROWS, 1, act_q[t]);
    }
    act_q[GGML_TYPE_F32] = (uint8_t *) x;

    float * e = malloc(sizeof(float) * EDGE_LEN);
    make_edges(e);
    add("edge.input", GGML_TYPE_F32, EDGE_LEN, 1, 1, e);
    uint8_t * eq = malloc(sizeof(float) * EDGE_LEN);
    for (int k = 0; k < n_act_types; ++k) {
        const enum ggml_type t = act_types[k];
        const int64_t len = ggml_blck_size(t) == 1 ? EDGE_LEN : EDGE_Q_LEN;
        cpu_traits(t)->from_float(e, eq, len);
        snprintf(name, sizeof name, "edge.%s", ggml_type_name(t));
        add(name, t, len, 1, 1, eq);
    }

    // (b) Dot products.
    static const enum ggml_type w_types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
        GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4,
        GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_XS,
        GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
        GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
    };
    // Float types: every tail length class of ggml's 32-element loop (the remainder's
    // groups of 8 and 4 and last 0..3 elements), with and without whole 32s before it.
    static const uint32_t len_float[] = {1, 3, 4, 7, 8, 13, 31, 32, 44, 60, 263, 2048, ACT_LEN};
    static const uint32_t len_32[] = {32, 224, 256, 2048};
    static const uint32_t len_256[] = {256, 768, 2048};
#define COUNT(a) ((int) (sizeof a / sizeof a[0]))
    float * wf = malloc(sizeof(float) * ACT_LEN);
    for (size_t k = 0; k < sizeof w_types / sizeof w_types[0]; ++k) {
        const enum ggml_type t = w_types[k];
        const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
        if (!tr->vec_dot) {
            fprintf(stderr, "no CPU vec_dot for %s\n", ggml_type_name(t));
            return 1;
        }
        const enum ggml_type at = tr->vec_dot_type;
        if (!act_q[at]) {
            fprintf(stderr, "%s: unexpected vec_dot_type %s\n", ggml_type_name(t), ggml_type_name(at));
            return 1;
        }
        const int64_t bs = ggml_blck_size(t);
        const uint32_t * lens = bs == 1 ? len_float : bs == 32 ? len_32 : len_256;
        const int n_lens = bs == 1 ? COUNT(len_float) : bs == 32 ? COUNT(len_32) : COUNT(len_256);
        const int64_t wlen = lens[n_lens - 1];
        const int64_t alen = ggml_blck_size(at) == 1 ? ACT_LEN : ACT_Q_LEN;
        if (wlen > alen) {
            fprintf(stderr, "%s: weight rows longer than activation rows\n", ggml_type_name(t));
            return 1;
        }

        const size_t wrs = ggml_row_size(t, wlen);
        uint8_t * w = malloc(wrs * 2);
        weight_floats(wf, (int) wlen);
        // (the types that need an importance matrix get a flat one; IQ1_M's quantizer
        // needs one too)
        float * imat = NULL;
        if (ggml_quantize_requires_imatrix(t) || t == GGML_TYPE_IQ1_M) {
            imat = malloc(sizeof(float) * (size_t) wlen);
            for (int64_t i = 0; i < wlen; ++i) imat[i] = 1.0f;
        }
        const size_t qsize = ggml_quantize_chunk(t, wf, w, 0, 1, wlen, imat);
        free(imat);
        if (qsize != wrs) {
            fprintf(stderr, "unexpected size for %s\n", ggml_type_name(t));
            return 1;
        }
        random_row(t, w + wrs, wlen);
        snprintf(name, sizeof name, "w.%s", ggml_type_name(t));
        add(name, t, wlen, 2, 1, w);

        const size_t ars = ggml_row_size(at, alen);
        float * dots = malloc(sizeof(float) * ACT_ROWS * 2 * (size_t) n_lens);
        float * d = dots;
        for (int l = 0; l < n_lens; ++l) {
            for (int wi = 0; wi < 2; ++wi) {
                for (int ai = 0; ai < ACT_ROWS; ++ai) {
                    float s = 0.0f;
                    tr->vec_dot((int) lens[l], &s, 0, w + wrs * wi, 0, act_q[at] + ars * ai, 0, 1);
                    *d++ = s;
                }
            }
        }
        snprintf(name, sizeof name, "dot.%s", ggml_type_name(t));
        add(name, GGML_TYPE_F32, ACT_ROWS, 2, n_lens, dots);
        snprintf(name, sizeof name, "dot.%s.lengths", ggml_type_name(t));
        gguf_set_arr_data(out, name, GGUF_TYPE_UINT32, lens, (size_t) n_lens);
        free(dots);
        free(w);
    }

#if defined(__aarch64__)
    // (c) Repacked products (aarch64 only): the weight in the CPU backend's CPU_REPACK buffer,
    // which interleaves it (Q4_0, Q8_0, IQ4_NL and MXFP4 4x4, Q4_K, Q5_K and Q6_K 8x4 on this feature level), multiplied
    // by 1, 4 and 5 activation rows (gemv; gemm; gemm + gemv for the fifth) through a graph.
    {
        ggml_backend_t cpu = ggml_backend_cpu_init();
        ggml_backend_cpu_set_n_threads(cpu, 1);
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t get_extra =
            (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t repack = NULL;
        for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : NULL; b && *b; ++b) {
            if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) repack = *b;
        }
        if (!repack) {
            fprintf(stderr, "no CPU_REPACK buffer type\n");
            return 1;
        }
        static const enum ggml_type rp_types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4 };
        const int64_t RP_ROWS = 8, RP_LEN = 1024, RP_TOK = 5;
        float * xf = malloc(sizeof(float) * RP_LEN * RP_TOK);
        for (int r = 0; r < RP_TOK; ++r) weight_floats(xf + r * RP_LEN, (int) RP_LEN);
        add("rp.x", GGML_TYPE_F32, RP_LEN, RP_TOK, 1, xf);

        // Near-halves for the Q8_K quantizer (4 rows): each 256-block starts with its largest
        // magnitude M, so iscale = -127/M (inexact); the other elements are floats v whose
        // f32 product v * iscale is exactly a half k + 1/2 while the exact product is not.
        // The ARM build's quantizers fuse that product into the rounding (GCC contracts it),
        // so these tell the roundings apart. No random numbers: the later tensors stay put.
        const int TIE_ROWS = 4;
        float * tie = malloc(sizeof(float) * RP_LEN * TIE_ROWS);
        for (int r = 0; r < TIE_ROWS; ++r) {
            for (int b = 0; b < RP_LEN / 256; ++b) {
                float * blk = tie + r * RP_LEN + b * 256;
                const float M = 100.0f + (float) r + 0.25f * (float) b;
                const float iscale = -127.f / M;
                blk[0] = M;
                for (int j = 1; j < 256; ++j) {
                    const int k = (j * 7 + r * 13 + b * 31) % 119 + 1;
                    const float target = (j % 2 ? 1.0f : -1.0f) * ((float) k + 0.5f);
                    float v = target / iscale;
                    blk[j] = v;
                    for (int step = 0; step < 64; ++step) {
                        volatile float prod = v * iscale;
                        if (prod == target && (double) v * (double) iscale != (double) target) {
                            blk[j] = v;
                            break;
                        }
                        v = nextafterf(v, 2.0f * v);
                    }
                }
            }
        }
        add("tie.x", GGML_TYPE_F32, RP_LEN, TIE_ROWS, 1, tie);
        {
            const size_t qrs = ggml_row_size(GGML_TYPE_Q8_K, RP_LEN);
            uint8_t * tq = malloc(qrs * TIE_ROWS);
            for (int r = 0; r < TIE_ROWS; ++r) {
                cpu_traits(GGML_TYPE_Q8_K)->from_float(tie + r * RP_LEN, tq + qrs * r, RP_LEN);
            }
            add("tie.q8_K", GGML_TYPE_Q8_K, RP_LEN, TIE_ROWS, 1, tq);
            free(tq);
        }
        for (size_t k = 0; k < sizeof rp_types / sizeof rp_types[0]; ++k) {
            const enum ggml_type t = rp_types[k];
            const size_t wrs = ggml_row_size(t, RP_LEN);
            uint8_t * w = malloc(wrs * RP_ROWS);
            for (int r = 0; r < RP_ROWS; ++r) {
                if (r % 2 == 0) {
                    weight_floats(wf, (int) RP_LEN);
                    ggml_quantize_chunk(t, wf, w + wrs * r, 0, 1, RP_LEN, NULL);
                } else {
                    random_row(t, w + wrs * r, RP_LEN);
                }
            }
            snprintf(name, sizeof name, "rp.%s.w", ggml_type_name(t));
            add(name, t, RP_LEN, RP_ROWS, 1, w);
            static const int toks[] = { 1, 4, 5 };
            for (int ti = 0; ti < 3; ++ti) {
                const int nt = toks[ti];
                struct ggml_init_params wp = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
                struct ggml_context * wctx = ggml_init(wp);
                struct ggml_tensor * wt = ggml_new_tensor_2d(wctx, t, RP_LEN, RP_ROWS);
                ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
                ggml_backend_tensor_set(wt, w, 0, wrs * RP_ROWS);
                struct ggml_context * xctx = ggml_init(wp);
                struct ggml_tensor * xt = ggml_new_tensor_2d(xctx, GGML_TYPE_F32, RP_LEN, nt);
                struct ggml_tensor * yt = ggml_mul_mat(xctx, wt, xt);
                struct ggml_cgraph * g = ggml_new_graph(xctx);
                ggml_build_forward_expand(g, yt);
                ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors_from_buft(xctx, ggml_backend_get_default_buffer_type(cpu));
                ggml_backend_tensor_set(xt, xf, 0, sizeof(float) * RP_LEN * nt);
                if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) {
                    fprintf(stderr, "repacked %s: compute failed\n", ggml_type_name(t));
                    return 1;
                }
                float * y = malloc(sizeof(float) * RP_ROWS * nt);
                ggml_backend_tensor_get(yt, y, 0, sizeof(float) * RP_ROWS * nt);
                snprintf(name, sizeof name, "rp.%s.y%d", ggml_type_name(t), nt);
                add(name, GGML_TYPE_F32, RP_ROWS, nt, 1, y);
                // the k-quants' gemm on the near-halves (quantized by ggml_quantize_mat_q8_K_4x4)
                if (nt == 4 && ggml_blck_size(t) == 256) {
                    ggml_backend_tensor_set(xt, tie, 0, sizeof(float) * RP_LEN * nt);
                    if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) {
                        fprintf(stderr, "repacked %s: compute failed\n", ggml_type_name(t));
                        return 1;
                    }
                    ggml_backend_tensor_get(yt, y, 0, sizeof(float) * RP_ROWS * nt);
                    snprintf(name, sizeof name, "tie.%s.y4", ggml_type_name(t));
                    add(name, GGML_TYPE_F32, RP_ROWS, nt, 1, y);
                }
                free(y);
                ggml_backend_buffer_free(xbuf);
                ggml_backend_buffer_free(wbuf);
                ggml_free(xctx);
                ggml_free(wctx);
            }
            free(w);
        }
        free(tie);

        // (d) Plain products of Q4_0 and Q8_0 weights the repack does not take (6 rows, not
        // a multiple of 4), in the default CPU buffer: llamafile_sgemm's tinyBLAS_Q0_ARM for
        // 2 and 5 activation rows (tiles of 3x2 and 3x3 + 3x2), vec_dot for one.
        static const enum ggml_type tb_types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 };
        const int64_t TB_ROWS = 6;
        for (size_t k = 0; k < sizeof tb_types / sizeof tb_types[0]; ++k) {
            const enum ggml_type t = tb_types[k];
            const size_t wrs = ggml_row_size(t, RP_LEN);
            uint8_t * w = malloc(wrs * TB_ROWS);
            for (int r = 0; r < TB_ROWS; ++r) {
                if (r % 2 == 0) {
                    weight_floats(wf, (int) RP_LEN);
                    ggml_quantize_chunk(t, wf, w + wrs * r, 0, 1, RP_LEN, NULL);
                } else {
                    random_row(t, w + wrs * r, RP_LEN);
                }
            }
            snprintf(name, sizeof name, "tb.%s.w", ggml_type_name(t));
            add(name, t, RP_LEN, TB_ROWS, 1, w);
            static const int toks[] = { 1, 2, 5 };
            for (int ti = 0; ti < 3; ++ti) {
                const int nt = toks[ti];
                struct ggml_init_params wp = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
                struct ggml_context * ctx = ggml_init(wp);
                struct ggml_tensor * wt = ggml_new_tensor_2d(ctx, t, RP_LEN, TB_ROWS);
                struct ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, RP_LEN, nt);
                struct ggml_tensor * yt = ggml_mul_mat(ctx, wt, xt);
                struct ggml_cgraph * g = ggml_new_graph(ctx);
                ggml_build_forward_expand(g, yt);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_get_default_buffer_type(cpu));
                ggml_backend_tensor_set(wt, w, 0, wrs * TB_ROWS);
                ggml_backend_tensor_set(xt, xf, 0, sizeof(float) * RP_LEN * nt);
                if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) {
                    fprintf(stderr, "plain %s: compute failed\n", ggml_type_name(t));
                    return 1;
                }
                float * y = malloc(sizeof(float) * TB_ROWS * nt);
                ggml_backend_tensor_get(yt, y, 0, sizeof(float) * TB_ROWS * nt);
                snprintf(name, sizeof name, "tb.%s.y%d", ggml_type_name(t), nt);
                add(name, GGML_TYPE_F32, TB_ROWS, nt, 1, y);
                free(y);
                ggml_backend_buffer_free(buf);
                ggml_free(ctx);
            }
            free(w);
        }
        free(xf);
        ggml_backend_free(cpu);
    }
#endif

#if defined(__x86_64__)
    // (e) The IQ panel product (x86 only: ggml-cpu/iqp.cpp, taken by an AVX2 build for these
    // types when the row count is a multiple of 8 and the batch has at least 8 rows): plain
    // products of 16 rows of 512 with 8 and 9 activation rows through a graph (vec_dot gives
    // the 7-row product). Rows alternate between ggml_quantize_chunk (flat importance
    // matrix) and random valid blocks.
    {
        ggml_backend_t cpu = ggml_backend_cpu_init();
        ggml_backend_cpu_set_n_threads(cpu, 1);
        static const enum ggml_type iqp_types[] = { GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_IQ2_XXS,
            GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ4_XS };
        const int64_t IQP_ROWS = 16, IQP_LEN = 512, IQP_TOK = 9;
        float * xf = malloc(sizeof(float) * IQP_LEN * IQP_TOK);
        for (int r = 0; r < IQP_TOK; ++r) weight_floats(xf + r * IQP_LEN, (int) IQP_LEN);
        add("iqp.x", GGML_TYPE_F32, IQP_LEN, IQP_TOK, 1, xf);
        float * imat = malloc(sizeof(float) * IQP_LEN);
        for (int64_t i = 0; i < IQP_LEN; ++i) imat[i] = 1.0f;
        for (size_t k = 0; k < sizeof iqp_types / sizeof iqp_types[0]; ++k) {
            const enum ggml_type t = iqp_types[k];
            const size_t wrs = ggml_row_size(t, IQP_LEN);
            uint8_t * w = malloc(wrs * IQP_ROWS);
            for (int r = 0; r < IQP_ROWS; ++r) {
                if (r % 2 == 0) {
                    weight_floats(wf, (int) IQP_LEN);
                    ggml_quantize_chunk(t, wf, w + wrs * r, 0, 1, IQP_LEN, imat);
                } else {
                    random_row(t, w + wrs * r, IQP_LEN);
                }
            }
            snprintf(name, sizeof name, "iqp.%s.w", ggml_type_name(t));
            add(name, t, IQP_LEN, IQP_ROWS, 1, w);
            static const int toks[] = { 7, 8, 9 };
            for (int ti = 0; ti < 3; ++ti) {
                const int nt = toks[ti];
                struct ggml_init_params wp = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
                struct ggml_context * ctx = ggml_init(wp);
                struct ggml_tensor * wt = ggml_new_tensor_2d(ctx, t, IQP_LEN, IQP_ROWS);
                struct ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, IQP_LEN, nt);
                struct ggml_tensor * yt = ggml_mul_mat(ctx, wt, xt);
                struct ggml_cgraph * g = ggml_new_graph(ctx);
                ggml_build_forward_expand(g, yt);
                ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_get_default_buffer_type(cpu));
                ggml_backend_tensor_set(wt, w, 0, wrs * IQP_ROWS);
                ggml_backend_tensor_set(xt, xf, 0, sizeof(float) * IQP_LEN * nt);
                if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) {
                    fprintf(stderr, "panel %s: compute failed\n", ggml_type_name(t));
                    return 1;
                }
                float * y = malloc(sizeof(float) * IQP_ROWS * nt);
                ggml_backend_tensor_get(yt, y, 0, sizeof(float) * IQP_ROWS * nt);
                snprintf(name, sizeof name, "iqp.%s.y%d", ggml_type_name(t), nt);
                add(name, GGML_TYPE_F32, IQP_ROWS, nt, 1, y);
                free(y);
                ggml_backend_buffer_free(buf);
                ggml_free(ctx);
            }
            free(w);
        }
        free(imat);
        free(xf);
        ggml_backend_free(cpu);
    }
#endif

    if (!gguf_write_to_file(out, argv[1], false)) {
        fprintf(stderr, "failed to write %s\n", argv[1]);
        return 1;
    }
    gguf_free(out);
    ggml_free(gctx);
    for (int k = 0; k < n_act_types; ++k) free(act_q[act_types[k]]);
    free(x);
    free(e);
    free(eq);
    free(wf);
    return 0;
}
