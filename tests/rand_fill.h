/* tests/rand_fill.h — the kernel tests' shared helpers: a xorshift generator of floats in [-1, 1)
 * (each test file seeds it with its own TEST_RNG_SEED, so every file keeps its own values), filling,
 * allocation that exits on failure, and a bitwise comparison. Include after check.h. */
#ifndef TREX_TESTS_RAND_FILL_H
#define TREX_TESTS_RAND_FILL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TEST_RNG_SEED
#error "define TEST_RNG_SEED before including rand_fill.h"
#endif

static uint64_t rng_state = TEST_RNG_SEED;

static inline float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline void fill(float *v, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = amp * frand();
}

/* n floats (at least one), or exit(2) */
static inline float *xmalloc_f(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static inline int same_bits(const float *a, const float *b, int64_t n)
{
    return n == 0 || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

#endif
