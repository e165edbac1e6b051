/* trex/rng.h — a counter-based random number generator (Philox-4x32-10).
 *
 * Every value is a pure function of (key, counter): streams can be split, skipped and replayed, which
 * makes initialisation and sampling reproducible whatever the thread count or the order of calls. */
#ifndef TREX_RNG_H
#define TREX_RNG_H

#include <stdint.h>

typedef struct trex_rng {
    uint64_t key;
    uint64_t counter;
} trex_rng;

/* A generator for (seed, stream), counter 0: key = a bijective mix of (seed, stream), so that for a
 * fixed seed distinct streams have distinct keys. Each draw below uses one whole block and advances
 * the counter by one. */
trex_rng trex_rng_make(uint64_t seed, uint64_t stream);
/* The 4 x 32-bit block at (key, counter), without state. */
void trex_rng_block(uint64_t key, uint64_t counter, uint32_t out[4]);

uint32_t trex_rng_u32(trex_rng *r);
uint64_t trex_rng_u64(trex_rng *r);
double trex_rng_uniform(trex_rng *r);              /* in [0, 1) */
uint64_t trex_rng_below(trex_rng *r, uint64_t n);  /* uniform in [0, n), n >= 1, no modulo bias */
double trex_rng_normal(trex_rng *r);               /* standard normal */
/* Two independent standard normals from one block (Box-Muller, cos and sin); trex_rng_normal returns
 * out[0] of the same block. */
void trex_rng_normal2(trex_rng *r, double out[2]);
/* The raw Philox-4x32-10 bijection on a 128-bit counter and 64-bit key (words little-end first), as
 * in Random123; trex_rng_block(key, counter) is ctr = {lo(counter), hi(counter), 0, 0},
 * key = {lo(key), hi(key)}. */
void trex_rng_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
