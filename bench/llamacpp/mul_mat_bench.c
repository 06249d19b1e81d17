// Matrix x vector throughput of llama.cpp's CPU backend (ggml), for comparison with our
// matvec benchmark (crates/quant/examples/matvec_bench.rs). Same output format.
//
// One graph with a single GGML_OP_MUL_MAT: weight [cols, rows] of the given type times an f32
// vector [cols, 1], computed with ggml_backend_graph_compute on the CPU backend with a
// persistent ggml threadpool. Reported: the median time of one compute and the weight bytes
// streamed per second (rows * row_size / median).
//
// Modes:
//   plain   weights in an ordinary CPU buffer (no repacking)
//   repack  weights in the CPU backend's "extra" buffer type (CPU_REPACK), which converts
//           some types (Q4_0, Q4_K, Q6_K, Q8_0, MXFP4, ... depending on the CPU) into
//           interleaved layouts when the data is uploaded, as llama.cpp does for model weights
//           by default. Types it cannot repack are reported as skipped.
//   plain-cold, repack-cold  the same, but rotating over copies of the weights totalling
//           --cold-mib MiB (default 1024, above the last-level cache), one per compute, so
//           the weights come from DRAM as in real decoding. Hot modes reuse one matrix, which
//           stays in cache when it fits (like test-backend-ops).
//
// Usage:
//   mul_mat_bench --backend-dir DIR [--variant NAME] --type q4_K --rows R --cols C
//                 [--threads 1,2] [--modes plain,repack,plain-cold,repack-cold] [--cold-mib 1024]
//                 [--min-time 0.5] [--min-iters 10] [--iters N]
// --variant loads DIR/libggml-cpu-NAME.so (e.g. haswell = AVX2 only) instead of the best
// variant for this CPU. --iters N runs exactly N timed computes and no warm-up (for
// instruction counting under callgrind).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

typedef struct ggml_threadpool *(*threadpool_new_t)(struct ggml_threadpool_params *);
typedef void (*threadpool_free_t)(struct ggml_threadpool *);
typedef void (*set_threadpool_t)(ggml_backend_t, struct ggml_threadpool *);

static void die(const char *msg) {
    fprintf(stderr, "mul_mat_bench: %s\n", msg);
    exit(2);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// xorshift64*: uniform floats in [-1, 1).
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_f32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
    return (float)(r >> 40) / (float)(1u << 23) - 1.0f;
}

static enum ggml_type parse_type(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type)t);
        if (n && strcasecmp(n, name) == 0 && ggml_type_size((enum ggml_type)t) > 0) {
            return (enum ggml_type)t;
        }
    }
    die("unknown type");
    return GGML_TYPE_COUNT;
}

// Parse "1,2,4" into up to `max` ints; returns the count.
static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    char *copy = strdup(s);
    for (char *tok = strtok(copy, ","); tok && n < max; tok = strtok(NULL, ",")) {
        out[n++] = atoi(tok);
    }
    free(copy);
    return n;
}

int main(int argc, char **argv) {
    const char *backend_dir = NULL, *variant = NULL, *type_name = NULL;
    const char *threads_arg = "1", *modes_arg = "plain,repack";
    long rows = 0, cols = 0;
    double min_time = 0.5;
    int min_iters = 10;
    int exact_iters = -1;
    long cold_mib = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("missing value after an option");
        if (!strcmp(a, "--backend-dir")) backend_dir = v;
        else if (!strcmp(a, "--variant")) variant = v;
        else if (!strcmp(a, "--type")) type_name = v;
        else if (!strcmp(a, "--rows")) rows = atol(v);
        else if (!strcmp(a, "--cols")) cols = atol(v);
        else if (!strcmp(a, "--threads")) threads_arg = v;
        else if (!strcmp(a, "--modes")) modes_arg = v;
        else if (!strcmp(a, "--min-time")) min_time = atof(v);
        else if (!strcmp(a, "--min-iters")) min_iters = atoi(v);
        else if (!strcmp(a, "--iters")) exact_iters = atoi(v);
        else if (!strcmp(a, "--cold-mib")) cold_mib = atol(v);
        else die("unknown option");
        i++;
    }
    if (!backend_dir || !type_name || rows <= 0 || cols <= 0) {
        die("usage: --backend-dir DIR [--variant NAME] --type T --rows R --cols C "
            "[--threads 1,2] [--modes plain,repack,plain-cold,repack-cold] [--cold-mib M] [--min-time S] "
            "[--min-iters N] [--iters N]");
    }

    ggml_log_set(NULL, NULL);  // keep ggml quiet unless something fails hard
    if (variant) {
        char path[4096];
        snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", backend_dir, variant);
        if (!ggml_backend_load(path)) die("cannot load the requested CPU variant");
    } else {
        ggml_backend_load_all_from_path(backend_dir);
    }
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) die("no CPU backend found");
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_t backend = ggml_backend_dev_init(dev, NULL);
    if (!backend) die("cannot initialise the CPU backend");

    ggml_backend_set_n_threads_t set_n_threads =
        (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    threadpool_new_t tp_new = (threadpool_new_t)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    threadpool_free_t tp_free = (threadpool_free_t)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    set_threadpool_t set_tp =
        (set_threadpool_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_threadpool");
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_get_features_t get_features =
        (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    if (!set_n_threads || !tp_new || !tp_free || !set_tp) die("CPU backend lacks thread controls");

    // The features of the loaded variant name it well enough (AVX2 vs AVX512 ...).
    char features[512] = "";
    if (get_features) {
        for (struct ggml_backend_feature *f = get_features(reg); f && f->name; f++) {
            if (strlen(features) + strlen(f->name) + 2 < sizeof features) {
                strcat(features, f->name);
                strcat(features, " ");
            }
        }
    }
    fprintf(stderr, "# ggml CPU backend %s, features: %s\n", variant ? variant : "(best)", features);

    const enum ggml_type type = parse_type(type_name);
    const long blck = ggml_blck_size(type);
    if (cols % blck != 0) die("cols is not a multiple of the block size");
    const size_t row_size = ggml_row_size(type, cols);
    const size_t w_bytes = row_size * (size_t)rows;

    // Random weights: quantize a few distinct rows with ggml's own quantizer (always valid
    // blocks), then repeat them. Speed does not depend on the values.
    const long uniq = rows < 64 ? rows : 64;
    float *src = malloc(sizeof(float) * (size_t)uniq * (size_t)cols);
    uint8_t *wdata = malloc(w_bytes);
    if (!src || !wdata) die("out of memory");
    for (long i = 0; i < uniq * cols; i++) src[i] = rand_f32();
    // (the i-quants that need an importance matrix, and IQ1_M, get a flat one)
    float *imat = NULL;
    if (ggml_quantize_requires_imatrix(type) || type == GGML_TYPE_IQ1_M) {
        imat = malloc(sizeof(float) * (size_t)cols);
        if (!imat) die("out of memory");
        for (long i = 0; i < cols; i++) imat[i] = 1.0f;
    }
    ggml_quantize_chunk(type, src, wdata, 0, uniq, cols, imat);
    free(imat);
    for (long r = uniq; r < rows; r++) {
        memcpy(wdata + (size_t)r * row_size, wdata + (size_t)(r % uniq) * row_size, row_size);
    }
    float *xdata = malloc(sizeof(float) * (size_t)cols);
    if (!xdata) die("out of memory");
    for (long i = 0; i < cols; i++) xdata[i] = rand_f32();

    int threads[16], modes_n = 0;
    int n_threads_list = parse_list(threads_arg, threads, 16);
    char modes[4][16];
    {
        char *copy = strdup(modes_arg);
        for (char *tok = strtok(copy, ","); tok && modes_n < 4; tok = strtok(NULL, ",")) {
            snprintf(modes[modes_n++], sizeof modes[0], "%s", tok);
        }
        free(copy);
    }

    for (int m = 0; m < modes_n; m++) {
        const int repack = !strncmp(modes[m], "repack", 6);
        const int cold = strstr(modes[m], "-cold") != NULL;
        if (strcmp(modes[m], "plain") && strcmp(modes[m], "repack") && strcmp(modes[m], "plain-cold") &&
            strcmp(modes[m], "repack-cold")) {
            die("modes are plain, repack, plain-cold, repack-cold");
        }
        ggml_backend_buffer_type_t wbuft = ggml_backend_get_default_buffer_type(backend);
        if (repack) {
            wbuft = NULL;
            ggml_backend_buffer_type_t *extra = get_extra ? get_extra(dev) : NULL;
            for (; extra && *extra; extra++) {
                if (!strcmp(ggml_backend_buft_name(*extra), "CPU_REPACK")) wbuft = *extra;
            }
            if (!wbuft) {
                fprintf(stderr, "# no CPU_REPACK buffer type, %s skipped\n", modes[m]);
                continue;
            }
        }
        // Cold: enough copies of the weights to total cold_mib, a different one per compute,
        // so that they come from DRAM as in real decoding.
        size_t n_copies = 1;
        if (cold) {
            n_copies = ((size_t)cold_mib * 1024 * 1024 + w_bytes - 1) / w_bytes;
            if (n_copies < 2) n_copies = 2;
        }

        struct ggml_init_params ipw = {
            .mem_size = (n_copies + 1) * ggml_tensor_overhead(),
            .mem_buffer = NULL,
            .no_alloc = true,
        };
        struct ggml_init_params ip = {
            .mem_size = (n_copies + 2) * ggml_tensor_overhead() + n_copies * ggml_graph_overhead_custom(4, false),
            .mem_buffer = NULL,
            .no_alloc = true,
        };
        struct ggml_context *ctx_w = ggml_init(ipw);
        struct ggml_context *ctx = ggml_init(ip);
        struct ggml_tensor **w = malloc(sizeof(*w) * n_copies);
        struct ggml_cgraph **gf = malloc(sizeof(*gf) * n_copies);
        if (!ctx_w || !ctx || !w || !gf) die("out of memory");
        struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 1);
        for (size_t c = 0; c < n_copies; c++) {
            w[c] = ggml_new_tensor_2d(ctx_w, type, cols, rows);
            gf[c] = ggml_new_graph_custom(ctx, 4, false);
            ggml_build_forward_expand(gf[c], ggml_mul_mat(ctx, w[c], x));
        }

        ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, wbuft);
        ggml_backend_buffer_t abuf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        if (!wbuf || !abuf) die("cannot allocate backend buffers");
        if (repack && w[0]->extra == NULL) {
            // init_tensor found no interleaved layout for this type/shape on this CPU.
            printf("llama.cpp\t%s\t%s\t%s\t%ld\t%ld\t-\t0\tnan\tnan\t# not repacked\n", variant ? variant : "best",
                   modes[m], ggml_type_name(type), rows, cols);
        } else {
            for (size_t c = 0; c < n_copies; c++) {
                ggml_backend_tensor_set(w[c], wdata, 0, w_bytes);  // repacks in repack modes
            }
            ggml_backend_tensor_set(x, xdata, 0, sizeof(float) * (size_t)cols);

            for (int ti = 0; ti < n_threads_list; ti++) {
                const int nt = threads[ti];
                struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nt);
                struct ggml_threadpool *tp = tp_new(&tpp);
                if (!tp) die("cannot create a ggml threadpool");
                set_n_threads(backend, nt);
                set_tp(backend, tp);

                size_t next = 0;
                for (int i = 0; exact_iters < 0 && i < 3; i++) {
                    if (ggml_backend_graph_compute(backend, gf[next]) != GGML_STATUS_SUCCESS) die("compute failed");
                    next = (next + 1) % n_copies;
                }
                size_t cap = 1024, n = 0;
                double *times = malloc(sizeof(double) * cap);
                if (!times) die("out of memory");
                const double t_start = now_s();
                while (exact_iters >= 0 ? n < (size_t)exact_iters
                                        : (now_s() - t_start < min_time || n < (size_t)min_iters) && n < 100000) {
                    const double t0 = now_s();
                    ggml_backend_graph_compute(backend, gf[next]);
                    const double t1 = now_s();
                    next = (next + 1) % n_copies;
                    if (n == cap) {
                        cap *= 2;
                        times = realloc(times, sizeof(double) * cap);
                        if (!times) die("out of memory");
                    }
                    times[n++] = t1 - t0;
                }
                if (n > 0) {
                    qsort(times, n, sizeof(double), cmp_double);
                    const double med = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
                    printf("llama.cpp\t%s\t%s\t%s\t%ld\t%ld\t%d\t%zu\t%.2f\t%.2f\n", variant ? variant : "best",
                           modes[m], ggml_type_name(type), rows, cols, nt, n, med * 1e6,
                           (double)w_bytes / med * 1e-9);
                    fflush(stdout);
                }
                free(times);
                set_tp(backend, NULL);
                tp_free(tp);
            }
        }
        ggml_backend_buffer_free(wbuf);
        ggml_backend_buffer_free(abuf);
        ggml_free(ctx);
        ggml_free(ctx_w);
        free(w);
        free(gf);
    }
    free(src);
    free(wdata);
    free(xdata);
    ggml_backend_free(backend);
    return 0;
}
