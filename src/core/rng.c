/* core/rng.c — Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 *
 * The 64-bit key is (k0 = low word, k1 = high word); the 64-bit counter is the low half of the
 * 128-bit Philox counter (c0 = low word, c1 = high word, c2 = c3 = 0). Every draw uses one whole
 * block and advances the counter by one, so the value of the i-th draw of a generator depends only on
 * (key, counter + i): no hidden state, no parity. A (seed, stream) pair maps to a key through a
 * bijective mix, so that for a fixed seed distinct streams get distinct keys (and likewise distinct
 * seeds for a fixed stream); distinct keys are distinct permutations of the counter space. */
#include "trex/rng.h"

#include <math.h>

#include "trex/status.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Full 64-bit mixing function (a bijection on uint64_t). */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

trex_rng trex_rng_make(uint64_t seed, uint64_t stream)
{
    trex_rng r;
    r.key = mix64(mix64(seed) + stream * 0x9E3779B97F4A7C15ull);
    r.counter = 0;
    return r;
}

void trex_rng_philox(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4])
{
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void trex_rng_block(uint64_t key, uint64_t counter, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    trex_rng_philox(ctr, k, out);
}

static void next_block(trex_rng *r, uint32_t out[4])
{
    TREX_ASSERT(r);
    trex_rng_block(r->key, r->counter, out);
    r->counter++;
}

uint32_t trex_rng_u32(trex_rng *r)
{
    uint32_t b[4];
    next_block(r, b);
    return b[0];
}

uint64_t trex_rng_u64(trex_rng *r)
{
    uint32_t b[4];
    next_block(r, b);
    return (uint64_t)b[0] | (uint64_t)b[1] << 32;
}

/* 53 random bits -> [0, 1). */
static double u53(uint32_t lo, uint32_t hi)
{
    uint64_t x = ((uint64_t)lo | (uint64_t)hi << 32) >> 11;
    return (double)x * 0x1p-53;
}

double trex_rng_uniform(trex_rng *r)
{
    uint32_t b[4];
    next_block(r, b);
    return u53(b[0], b[1]);
}

uint64_t trex_rng_below(trex_rng *r, uint64_t n)
{
    TREX_ASSERT(n >= 1);
    uint64_t threshold = (0 - n) % n; /* 2^64 mod n: reject [0, threshold) so the rest is n-periodic */
    for (;;) {
        uint64_t x = trex_rng_u64(r);
        if (x >= threshold)
            return x % n;
    }
}

void trex_rng_normal2(trex_rng *r, double out[2])
{
    uint32_t b[4];
    next_block(r, b);
    double u1 = 1.0 - u53(b[0], b[1]); /* (0, 1]: log is finite */
    double u2 = u53(b[2], b[3]);
    double rad = sqrt(-2.0 * log(u1));
    double theta = 6.283185307179586476925286766559 * u2;
    out[0] = rad * cos(theta);
    out[1] = rad * sin(theta);
}

double trex_rng_normal(trex_rng *r)
{
    double z[2];
    trex_rng_normal2(r, z);
    return z[0];
}
