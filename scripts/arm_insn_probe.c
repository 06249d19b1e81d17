// llama.cpp side of the executed-instruction comparison of scripts/arm_insn_counts.sh: ggml's
// ARM CPU kernels (llama.cpp release v0.4.0 built for -march=armv8.2-a+dotprod+fp16 by
// scripts/llamacpp-aarch64.sh), run under qemu-aarch64 -cpu cortex-a76 with every executed
// instruction logged. crates/quant/examples/arm_insn_probe.rs is the same probe for sluice's
// kernels.
//
// Usage:
//   arm_insn_probe gen DIR     write the inputs both probes read (no counting needed):
//                              DIR/act.f32   ACT_N f32 activation values (one row)
//                              DIR/act4.f32  MM_TOK more rows of ACT_N (batched products)
//                              DIR/w.<type>  ROWS weight rows of ACT_N elements of <type>
//                                            (ggml type names): random valid blocks as
//                                            scripts/gen_cpu_refs.c makes them (random bits,
//                                            moderate f16 / e8m0 scales); F32/F16/BF16:
//                                            ggml_quantize_chunk of weight-like floats
//   arm_insn_probe count DIR   the measured run (under qemu with -d exec,nochain,strace)
//
// `count` prints one line per measured item ("dot <type>" or "quant <act type>") and brackets
// each measurement with getppid() calls, which the strace log shows between the executed
// instructions: after one first marker, every item is
//     warm-up call(s), marker, the measured operation once, marker, three times, marker
// so the log splits into one setup segment and then two segments per item, and
// (segment(3x) - segment(1x)) / 2 is the instruction count of one operation, with the
// marker's own instructions and lazy binding cancelled out. An operation is a matvec for a
// dot kernel (`vec_dot` of the item's weight type for each of ROWS rows against one
// activation row, nrc = 1: the plain vec_dot path, not the repacked gemv) and one
// from_float call of a row of ACT_N values for a quantizer.
//
// Then "mm <type> <tokens>" items: the whole product of the ROWS x ACT_N weight in the CPU
// backend's CPU_REPACK buffer (interleaved as the backend does when it loads a model: Q4_0,
// Q8_0, IQ4_NL and MXFP4 4x4, Q4_K, Q5_K and Q6_K 8x4 on this feature level) with 1 (gemv) or
// MM_TOK (gemm) activation rows, through a one-node graph on one thread: the activation
// quantization, the repacked kernels and the graph's own dispatch.
//
// Everything is deterministic (splitmix64 inputs, see ref_rand.h).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#define REF_SEED 0xA7C0DE5EED5EED01ULL
#include "ref_rand.h"

#define ACT_N 4096
#define ROWS 64
#define MM_TOK 4

static const enum ggml_type W_TYPES[] = {
    GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
    GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
    GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_F16, GGML_TYPE_F32,
    GGML_TYPE_BF16, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
    GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
};
static const enum ggml_type MM_TYPES[] = {
    GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K,
    GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};
static const int MM_TOKS[] = { 1, MM_TOK };
static const enum ggml_type A_TYPES[] = {
    GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q8_K, GGML_TYPE_F16, GGML_TYPE_BF16,
};
#define COUNT(a) ((int) (sizeof a / sizeof a[0]))

static void die(const char * msg, const char * arg) {
    fprintf(stderr, "arm_insn_probe: %s %s\n", msg, arg ? arg : "");
    exit(1);
}

// A finite normal f16 of moderate size: random sign, exponent 2^-10 .. 2^4.
static uint16_t f16_scale_bits(void) {
    uint16_t sign = (uint16_t) (rnd(2) << 15);
    uint16_t exp = (uint16_t) (5 + rnd(15));
    uint16_t man = (uint16_t) rnd(1024);
    return sign | (uint16_t) (exp << 10) | man;
}

// Rows of random valid blocks (as scripts/gen_cpu_refs.c), float types from weight-like floats.
static void random_rows(enum ggml_type t, uint8_t * buf, int64_t n, int64_t rows) {
    if (t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
        float * f = malloc(sizeof(float) * (size_t) (n * rows));
        for (int64_t i = 0; i < n * rows; ++i) {
            f[i] = normalish() * pow2f(-4 + (int) rnd(7));
        }
        ggml_quantize_chunk(t, f, buf, 0, rows, n, NULL);
        free(f);
        return;
    }
    const size_t ts = ggml_type_size(t);
    const int64_t n_blocks = n / ggml_blck_size(t) * rows;
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
            default: die("random_rows: unexpected type", ggml_type_name(t));
        }
        for (int k = 0; k < 2; ++k) {
            if (offs[k] >= 0) put_u16(blk + offs[k], f16_scale_bits());
        }
    }
}

static void path_of(char * p, size_t cap, const char * dir, const char * name) {
    if ((size_t) snprintf(p, cap, "%s/%s", dir, name) >= cap) die("path too long:", name);
}

static void write_file(const char * dir, const char * name, const void * data, size_t len) {
    char p[4096];
    path_of(p, sizeof p, dir, name);
    FILE * f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) die("cannot write", p);
}

static void * read_file(const char * dir, const char * name, size_t len) {
    char p[4096];
    path_of(p, sizeof p, dir, name);
    FILE * f = fopen(p, "rb");
    void * buf = malloc(len + 1);
    if (!f || fread(buf, 1, len + 1, f) != len) die("missing or wrong size:", p);
    fclose(f);
    return buf;
}

static void gen(const char * dir) {
    float * x = malloc(sizeof(float) * ACT_N);
    // weight-like activations: a different spread per 32, occasional outliers
    for (int j = 0; j < ACT_N; j += 32) {
        const float spread = pow2f(-6 + (int) rnd(7)) * (1.0f + uniform_pm1() * 0.5f);
        for (int i = j; i < j + 32; ++i) {
            x[i] = normalish() * spread * (rnd(64) == 0 ? 8.0f : 1.0f);
        }
    }
    write_file(dir, "act.f32", x, sizeof(float) * ACT_N);
    free(x);
    char name[64];
    for (int k = 0; k < COUNT(W_TYPES); ++k) {
        const enum ggml_type t = W_TYPES[k];
        const size_t len = ggml_row_size(t, ACT_N) * ROWS;
        uint8_t * w = malloc(len);
        random_rows(t, w, ACT_N, ROWS);
        snprintf(name, sizeof name, "w.%s", ggml_type_name(t));
        write_file(dir, name, w, len);
        free(w);
    }
    float * x4 = malloc(sizeof(float) * ACT_N * MM_TOK);
    for (int i = 0; i < ACT_N * MM_TOK; i += 32) {
        const float spread = pow2f(-6 + (int) rnd(7));
        for (int j = i; j < i + 32; ++j) x4[j] = normalish() * spread;
    }
    write_file(dir, "act4.f32", x4, sizeof(float) * ACT_N * MM_TOK);
    free(x4);
}

static void marker(void) { (void) getppid(); }

static float sink;

static void matvec(const struct ggml_type_traits_cpu * tr, const uint8_t * w, size_t rb,
                   const void * a, float * out) {
    for (int r = 0; r < ROWS; ++r) {
        tr->vec_dot(ACT_N, out + r, 0, w + rb * (size_t) r, 0, a, 0, 1);
    }
}

static void compute(ggml_backend_t cpu, struct ggml_cgraph * g) {
    if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) die("graph compute failed", NULL);
}

// The "mm" items: products of the repacked weights (see the top of the file); the first
// activation row is `x`, the others from DIR/act4.f32.
static void mm_items(const char * dir, const float * x) {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = NULL;
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : NULL; b && *b; ++b) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) repack = *b;
    }
    if (!repack) die("no CPU_REPACK buffer type", NULL);
    float * xs = malloc(sizeof(float) * ACT_N * MM_TOK);
    float * x4 = read_file(dir, "act4.f32", sizeof(float) * ACT_N * MM_TOK);
    memcpy(xs, x, sizeof(float) * ACT_N);
    memcpy(xs + ACT_N, x4, sizeof(float) * ACT_N * (MM_TOK - 1));
    free(x4);
    float * y = malloc(sizeof(float) * ROWS * MM_TOK);
    char name[64];
    for (int k = 0; k < COUNT(MM_TYPES); ++k) {
        const enum ggml_type t = MM_TYPES[k];
        const size_t rb = ggml_row_size(t, ACT_N);
        snprintf(name, sizeof name, "w.%s", ggml_type_name(t));
        uint8_t * w = read_file(dir, name, rb * ROWS);
        for (int ti = 0; ti < COUNT(MM_TOKS); ++ti) {
            const int nt = MM_TOKS[ti];
            struct ggml_init_params p = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
            struct ggml_context * wctx = ggml_init(p);
            struct ggml_tensor * wt = ggml_new_tensor_2d(wctx, t, ACT_N, ROWS);
            ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
            if (!wbuf) die("cannot allocate a repacked weight of", ggml_type_name(t));
            ggml_backend_tensor_set(wt, w, 0, rb * ROWS);
            struct ggml_context * xctx = ggml_init(p);
            struct ggml_tensor * xt = ggml_new_tensor_2d(xctx, GGML_TYPE_F32, ACT_N, nt);
            struct ggml_tensor * yt = ggml_mul_mat(xctx, wt, xt);
            struct ggml_cgraph * g = ggml_new_graph(xctx);
            ggml_build_forward_expand(g, yt);
            ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors_from_buft(
                xctx, ggml_backend_get_default_buffer_type(cpu));
            ggml_backend_tensor_set(xt, xs, 0, sizeof(float) * ACT_N * (size_t) nt);
            printf("mm %s %d\n", ggml_type_name(t), nt);
            compute(cpu, g); // warm-up
            marker();
            compute(cpu, g);
            marker();
            for (int i = 0; i < 3; ++i) compute(cpu, g);
            marker();
            ggml_backend_tensor_get(yt, y, 0, sizeof(float) * ROWS * (size_t) nt);
            for (int i = 0; i < ROWS * nt; ++i) sink += y[i];
            ggml_backend_buffer_free(xbuf);
            ggml_backend_buffer_free(wbuf);
            ggml_free(xctx);
            ggml_free(wctx);
        }
        free(w);
    }
    free(y);
    free(xs);
    ggml_backend_free(cpu);
}

static void count(const char * dir) {
    ggml_cpu_init();
    if (!ggml_cpu_has_neon() || !ggml_cpu_has_dotprod() || !ggml_cpu_has_fp16_va() ||
        ggml_cpu_has_matmul_int8() || ggml_cpu_has_sve()) {
        die("expected a CPU and backend with NEON, dotprod and FP16, without I8MM and SVE", NULL);
    }
    float * x = read_file(dir, "act.f32", sizeof(float) * ACT_N);
    uint8_t * a = malloc(sizeof(float) * ACT_N * 2);
    float out[ROWS];
    char name[64];
    marker();
    for (int k = 0; k < COUNT(W_TYPES); ++k) {
        const enum ggml_type t = W_TYPES[k];
        const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
        const enum ggml_type at = tr->vec_dot_type;
        if (!tr->vec_dot) die("no vec_dot for", ggml_type_name(t));
        if (at == GGML_TYPE_F32) {
            memcpy(a, x, sizeof(float) * ACT_N);
        } else {
            ggml_get_type_traits_cpu(at)->from_float(x, a, ACT_N);
        }
        const size_t rb = ggml_row_size(t, ACT_N);
        snprintf(name, sizeof name, "w.%s", ggml_type_name(t));
        uint8_t * w = read_file(dir, name, rb * ROWS);
        printf("dot %s\n", ggml_type_name(t));
        matvec(tr, w, rb, a, out); // warm-up: lazy binding, first-touch
        marker();
        matvec(tr, w, rb, a, out);
        marker();
        for (int i = 0; i < 3; ++i) matvec(tr, w, rb, a, out);
        marker();
        sink += out[0];
        free(w);
    }
    for (int k = 0; k < COUNT(A_TYPES); ++k) {
        const enum ggml_type t = A_TYPES[k];
        ggml_from_float_t q = ggml_get_type_traits_cpu(t)->from_float;
        if (!q) die("no from_float for", ggml_type_name(t));
        printf("quant %s\n", ggml_type_name(t));
        q(x, a, ACT_N);
        marker();
        q(x, a, ACT_N);
        marker();
        for (int i = 0; i < 3; ++i) q(x, a, ACT_N);
        marker();
        sink += (float) a[0];
    }
    free(a);
    mm_items(dir, x);
    free(x);
    // the sum of the first row's result of every matvec, the first byte of every quantized
    // row and every result of every repacked product (the same sum in the same order as the
    // Rust probe: equal bits, equal results)
    uint32_t bits;
    memcpy(&bits, &sink, sizeof bits);
    printf("checksum %08x\n", bits);
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s gen|count DIR\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "gen") == 0) {
        gen(argv[2]);
    } else if (strcmp(argv[1], "count") == 0) {
        count(argv[2]);
    } else {
        die("unknown mode", argv[1]);
    }
    return 0;
}
