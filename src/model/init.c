/* GPT-2 weight initialization, deterministic in the seed: N(0, 0.02) for matrices and
 * embeddings, N(0, 0.02/sqrt(2L)) for the projections that write into the residual stream
 * (proj, fc2, down), zero biases, unit norm weights. Values are generated on the host (one
 * independent stream per tensor, so the layout of one tensor never shifts another's values)
 * and copied to the device. */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1]: 53 random bits, never 0 so the log below is finite */
static double uniform01(uint64_t *state) {
    return ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Box-Muller: two independent standard normals per pair of uniforms */
static void fill_normal(float *out, size_t n, float stddev, uint64_t *state) {
    const double two_pi = 6.283185307179586476925286766559;
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(uniform01(state)));
        double th = two_pi * uniform01(state);
        out[i] = (float)(stddev * r * cos(th));
        if (i + 1 < n) out[i + 1] = (float)(stddev * r * sin(th));
    }
}

static int is_residual_projection(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot || strcmp(dot, ".w") != 0) return 0;
    size_t len = (size_t)(dot - name);
    return (len >= 4 && !strncmp(dot - 4, "proj", 4)) ||
           (len >= 3 && !strncmp(dot - 3, "fc2", 3)) ||
           (len >= 4 && !strncmp(dot - 4, "down", 4));
}

void fp8t_model_init_weights(fp8t_model *m, uint64_t seed) {
    size_t max_numel = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->info[i].numel > max_numel) max_numel = m->info[i].numel;
    float *host = malloc(max_numel * sizeof(float));
    FP8T_CHECK(host, "out of host memory (%zu floats) for weight init", max_numel);
    const float std_base = 0.02f;
    const float std_resid = std_base / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const fp8t_param_info *p = &m->info[i];
        if (p->ndim == 2) {
            uint64_t state = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
            fill_normal(host, p->numel, is_residual_projection(p->name) ? std_resid : std_base,
                        &state);
        } else {
            /* 1-D tensors: norm weights ("*.w") are 1, biases ("*.b") 0 */
            const char *dot = strrchr(p->name, '.');
            float v = (dot && !strcmp(dot, ".w")) ? 1.0f : 0.0f;
            for (size_t k = 0; k < p->numel; k++) host[k] = v;
        }
        m->ops->to_device(m->be, m->params + p->offset, host, p->numel * sizeof(float));
        m->ops->synchronize(m->be); /* host is refilled next: the copy must have read it */
    }
    free(host);
    model_invalidate_weight_caches(m); /* the cached FP8 weight copies are stale now */
}
