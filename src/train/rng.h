/* Counter-based randomness for the training code: splitmix64 as a generator and as a hash.
 * Everything random in data loading is a hash of (seed, counters), never a hidden state, so a
 * run is reproducible from its seed and position alone. */
#ifndef FP8TRAIN_TRAIN_RNG_H
#define FP8TRAIN_TRAIN_RNG_H

#include <stdint.h>

/* One splitmix64 step: advances *s and returns 64 well-mixed bits. */
static inline uint64_t fp8t_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A hash of three words (order matters). */
static inline uint64_t fp8t_hash3(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t s = a;
    uint64_t h = fp8t_rng_next(&s);
    s = h ^ b;
    h = fp8t_rng_next(&s);
    s = h ^ c;
    return fp8t_rng_next(&s);
}

/* Uniform integer in [0, n), n > 0 (multiply-shift: bias below 2^-32 for the n used here). */
static inline uint64_t fp8t_rng_below(uint64_t *s, uint64_t n) {
    return (uint64_t)(((unsigned __int128)fp8t_rng_next(s) * n) >> 64);
}

/* Uniform double in [0, 1). */
static inline double fp8t_rng_uniform(uint64_t *s) {
    return (double)(fp8t_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
