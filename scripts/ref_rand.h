// Deterministic inputs shared by the reference generators (gen_quant_refs.c,
// gen_cpu_refs.c): a splitmix64 generator and integer-derived floats, no libm, so the
// fixtures they write are the same on every machine. Define REF_SEED before including.

#ifndef REF_RAND_H
#define REF_RAND_H

#include <stdint.h>
#include <string.h>

static uint64_t rng_state = REF_SEED;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Uniform integer in [0, n).
static uint32_t rnd(uint32_t n) { return (uint32_t) (next_u64() % n); }

// 2^e as a float, for -126 <= e <= 127 (exact, built from bits).
static float pow2f(int e) {
    uint32_t bits = (uint32_t) (e + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Uniform in [-1, 1) with 24 significant bits.
static float uniform_pm1(void) { return (float) ((int32_t) rnd(1u << 24) - (1 << 23)) * pow2f(-23); }

// Roughly normal (sum of four uniforms), exact in float.
static float normalish(void) {
    int32_t s = 0;
    for (int i = 0; i < 4; ++i) {
        s += (int32_t) rnd(1u << 22) - (1 << 21);
    }
    return (float) s * pow2f(-21);
}

static void put_u16(uint8_t * p, uint16_t v) { p[0] = (uint8_t) v; p[1] = (uint8_t) (v >> 8); }

#endif
