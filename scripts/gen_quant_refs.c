// Reference (de)quantization data computed by ggml itself, written as a GGUF file with
// ggml's own GGUF writer. Built and run by scripts/gen_quant_refs.sh against the prebuilt
// libggml-base of the npm package node-llama-cpp (see that script for versions).
//
// Usage: gen_quant_refs OUT.gguf
//
// Tensors (names use ggml's type names, e.g. "q4_K"):
//   <type>.q / <type>.f32  random valid blocks of <type> and ggml's dequantization of them
//                          (the type's to_float, or dequantize_row_q8_K for q8_K)
//   quant.input            f32 inputs: edge cases and varied distributions, 32 x 256 values
//   <type>.quant           ggml_quantize_chunk(<type>, quant.input) without an importance
//                          matrix, i.e. ggml's quantize_row_<type>_ref (for iq4_nl, iq4_xs
//                          and iq3_s: quantize_<type> with no weights, as llama-quantize runs)
//   act.q8_1 / act.q8_K    quantize_row_q8_1_ref / quantize_row_q8_K_ref of quant.input
//                          (activation formats, for the dot-product kernels)
//
// Everything is deterministic: a splitmix64 generator and integer-derived floats, no libm.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

// Exported by libggml-base but not declared in the public headers.
void dequantize_row_q8_K(const void * x, float * y, int64_t k);
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);

#define REF_SEED 0x5EED0D0E5EED0D0EULL
#include "ref_rand.h"

// Finite f16 bits of moderate size: random sign, exponent 2^-10 .. 2^5, a few +-0 and
// subnormals (the same recipe as scripts/gen_quant_fixtures.py).
static uint16_t f16_scale_bits(void) {
    uint16_t sign = (uint16_t) (rnd(2) << 15);
    uint16_t exp = (uint16_t) (5 + rnd(16));
    uint16_t man = (uint16_t) rnd(1024);
    uint32_t kind = rnd(16);
    if (kind == 0) return sign;
    if (kind == 1) return sign | man;
    return sign | (uint16_t) (exp << 10) | man;
}

static uint16_t get_u16(const uint8_t * p) { return (uint16_t) (p[0] | (p[1] << 8)); }

// Random valid blocks: random bytes with the scale fields patched to moderate finite values.
static void random_blocks(enum ggml_type t, uint8_t * buf, int n_blocks) {
    const size_t ts = ggml_type_size(t);
    for (size_t i = 0; i < ts * (size_t) n_blocks; ++i) {
        buf[i] = (uint8_t) next_u64();
    }
    for (int b = 0; b < n_blocks; ++b) {
        uint8_t * blk = buf + ts * (size_t) b;
        int offs[2] = {-1, -1};
        switch (t) {
            case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL:
            case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
            case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ4_XS:
                offs[0] = 0; break;
            case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
                offs[0] = 0; offs[1] = 2; break;
            case GGML_TYPE_Q2_K: offs[0] = 80; offs[1] = 82; break;
            case GGML_TYPE_Q3_K: offs[0] = 108; break;
            case GGML_TYPE_Q6_K: offs[0] = 208; break;
            case GGML_TYPE_TQ1_0: offs[0] = 52; break;
            case GGML_TYPE_TQ2_0: offs[0] = 64; break;
            case GGML_TYPE_Q8_K: {
                // f32 scale: random sign, exponent 2^-12 .. 2^3.
                uint32_t bits = (uint32_t) (rnd(2) << 31) | ((uint32_t) (115 + rnd(16)) << 23) | rnd(1u << 23);
                memcpy(blk, &bits, 4);
                break;
            }
            case GGML_TYPE_IQ1_M: {
                // The f16 scale lives in the top nibbles of the four u16 at bytes 48..56.
                uint16_t d = f16_scale_bits();
                for (int k = 0; k < 4; ++k) {
                    uint16_t v = get_u16(blk + 48 + 2 * k);
                    v = (uint16_t) ((v & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12));
                    put_u16(blk + 48 + 2 * k, v);
                }
                break;
            }
            case GGML_TYPE_MXFP4: {
                static const uint8_t extremes[4] = {0, 1, 2, 254};
                blk[0] = b < 4 ? extremes[b] : (uint8_t) (117 + rnd(21));
                break;
            }
            default:
                break; // F16, BF16: any bits (F16 NaNs included)
        }
        for (int k = 0; k < 2; ++k) {
            if (offs[k] >= 0) put_u16(blk + offs[k], f16_scale_bits());
        }
    }
}

#define N_SUPER 32
#define N_INPUT (N_SUPER * 256)

// Inputs for the quantizers: one kind of data per 256-element super-block.
static void make_input(float * x) {
    for (int s = 0; s < N_SUPER; ++s) {
        float * v = x + 256 * s;
        switch (s) {
            case 0: for (int i = 0; i < 256; ++i) v[i] = 0.0f; break;
            case 1: for (int i = 0; i < 256; ++i) v[i] = 0.5f; break;
            case 2: for (int i = 0; i < 256; ++i) v[i] = -3.0f; break;
            case 3: // tiny noise and one outlier per super-block
                for (int i = 0; i < 256; ++i) v[i] = uniform_pm1() * pow2f(-10);
                v[77] = 3.0f;
                break;
            case 4: for (int i = 0; i < 256; ++i) v[i] = 0.125f + (uniform_pm1() + 1.0f); break;
            case 5: for (int i = 0; i < 256; ++i) v[i] = -0.125f - (uniform_pm1() + 1.0f); break;
            case 6: for (int i = 0; i < 256; ++i) v[i] = normalish() * pow2f(-40); break; // f16 scales underflow
            case 7: for (int i = 0; i < 256; ++i) v[i] = normalish() * pow2f(12); break;
            case 8: for (int i = 0; i < 256; ++i) v[i] = (float) ((int) rnd(16) - 8); break;
            case 9: // MXFP4: block maxima a few ulps below a power of two
                for (int j = 0; j < 8; ++j) {
                    float top = pow2f(-3 + j) * (1.0f - (float) (j % 4) * pow2f(-24));
                    for (int i = 0; i < 32; ++i) v[32 * j + i] = uniform_pm1() * top * 0.5f;
                    v[32 * j + (int) rnd(32)] = (j % 2 ? -top : top);
                }
                break;
            case 10: // MXFP4: block maxima exactly a power of two
                for (int j = 0; j < 8; ++j) {
                    float top = pow2f(-4 + 2 * j);
                    for (int i = 0; i < 32; ++i) v[32 * j + i] = uniform_pm1() * top;
                    v[32 * j + 5] = (j % 2 ? -top : top);
                }
                break;
            case 11: // rounding ties: with amax 127 (Q8_0 scale 1) and halves elsewhere
                for (int i = 0; i < 256; ++i) v[i] = (float) ((int) rnd(254) - 127) + 0.5f;
                for (int j = 0; j < 8; ++j) v[32 * j] = 127.0f;
                break;
            case 12: // sparse, and one 32-element sub-block all zero (iq3_s then shifts the
                     // later sub-blocks' grid indices and signs)
                for (int i = 0; i < 256; ++i) v[i] = rnd(8) == 0 ? normalish() : 0.0f;
                for (int i = 64; i < 96; ++i) v[i] = 0.0f;
                break;
            default: { // normal-ish weights, a different spread per 32, occasional outliers
                for (int j = 0; j < 8; ++j) {
                    float spread = pow2f(-6 + (int) rnd(9)) * (1.0f + uniform_pm1() * 0.5f);
                    for (int i = 0; i < 32; ++i) {
                        float val = normalish() * spread;
                        if (rnd(64) == 0) val *= 8.0f;
                        v[32 * j + i] = val;
                    }
                }
                break;
            }
        }
    }
}

static struct ggml_context * gctx;
static struct gguf_context * out;

static void add(const char * name, enum ggml_type t, int64_t n, const void * data) {
    struct ggml_tensor * tensor = ggml_new_tensor_1d(gctx, t, n);
    ggml_set_name(tensor, name);
    memcpy(tensor->data, data, ggml_nbytes(tensor));
    gguf_add_tensor(out, tensor);
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.gguf\n", argv[0]);
        return 2;
    }
    struct ggml_init_params params = { 64u << 20, NULL, false };
    gctx = ggml_init(params);
    out = gguf_init_empty();
    gguf_set_val_str(out, "general.architecture", "quant-fixture");
    gguf_set_val_str(out, "fixture.generator", "scripts/gen_quant_refs.c");
    gguf_set_val_str(out, "fixture.reference", "ggml from node-llama-cpp 3.21.1 (llama.cpp release v0.4.0), libggml-base.so");

    static const enum ggml_type deq_types[] = {
        GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
        GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
        GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ1_S, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_S,
        GGML_TYPE_IQ4_XS, GGML_TYPE_IQ1_M, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4,
    };
    char name[64];
    for (size_t k = 0; k < sizeof deq_types / sizeof deq_types[0]; ++k) {
        const enum ggml_type t = deq_types[k];
        const int64_t bs = ggml_blck_size(t);
        const int n_blocks = bs == 1 ? 256 : bs == 32 ? 8 : 4;
        const int64_t n = bs * n_blocks;
        uint8_t * q = malloc(ggml_type_size(t) * (size_t) n_blocks);
        float * y = malloc(sizeof(float) * (size_t) n);
        random_blocks(t, q, n_blocks);
        if (t == GGML_TYPE_Q8_K) {
            dequantize_row_q8_K(q, y, n);
        } else {
            const struct ggml_type_traits * tr = ggml_get_type_traits(t);
            if (!tr->to_float) {
                fprintf(stderr, "no to_float for %s\n", ggml_type_name(t));
                return 1;
            }
            tr->to_float(q, y, n);
        }
        snprintf(name, sizeof name, "%s.q", ggml_type_name(t));
        add(name, t, n, q);
        snprintf(name, sizeof name, "%s.f32", ggml_type_name(t));
        add(name, GGML_TYPE_F32, n, y);
        free(q);
        free(y);
    }

    float * x = malloc(sizeof(float) * N_INPUT);
    make_input(x);
    add("quant.input", GGML_TYPE_F32, N_INPUT, x);

    static const enum ggml_type quant_types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K,
        GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_TQ1_0,
        GGML_TYPE_TQ2_0, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_S,
    };
    uint8_t * qbuf = malloc(ggml_row_size(GGML_TYPE_F32, N_INPUT));
    for (size_t k = 0; k < sizeof quant_types / sizeof quant_types[0]; ++k) {
        const enum ggml_type t = quant_types[k];
        const size_t bytes = ggml_quantize_chunk(t, x, qbuf, 0, 1, N_INPUT, NULL);
        if (bytes != ggml_row_size(t, N_INPUT)) {
            fprintf(stderr, "unexpected size for %s\n", ggml_type_name(t));
            return 1;
        }
        snprintf(name, sizeof name, "%s.quant", ggml_type_name(t));
        add(name, t, N_INPUT, qbuf);
    }
    ggml_get_type_traits(GGML_TYPE_Q8_1)->from_float_ref(x, qbuf, N_INPUT);
    add("act.q8_1", GGML_TYPE_Q8_1, N_INPUT, qbuf);
    quantize_row_q8_K_ref(x, qbuf, N_INPUT);
    add("act.q8_K", GGML_TYPE_Q8_K, N_INPUT, qbuf);

    if (!gguf_write_to_file(out, argv[1], false)) {
        fprintf(stderr, "failed to write %s\n", argv[1]);
        return 1;
    }
    gguf_free(out);
    ggml_free(gctx);
    free(x);
    free(qbuf);
    return 0;
}
