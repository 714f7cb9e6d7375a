/* A small deterministic random source for the op tests (splitmix64). A test that wants its own
 * sequence defines TEST_RNG_SEED before including this header. */
#ifndef FP8TRAIN_TEST_RNG_H
#define FP8TRAIN_TEST_RNG_H

#include <stdint.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9E3779B97F4A7C15ull
#endif

static uint64_t rng_state = TEST_RNG_SEED;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [0, 1) */
static inline double rng_uniform(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }
/* uniform in [0, n) */
static inline int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

#endif
