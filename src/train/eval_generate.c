/* Sampling from a model: greedy, temperature and top-k, with a seeded random stream so a run
 * is reproducible. No KV cache: every step runs the forward over the last T tokens (the
 * positions after the current one are padding, which causal attention never looks at). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "train/eval_internal.h"

/* splitmix64: a well-mixed state from any seed, and the next value of the stream */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t fp8t_sample_seed(uint64_t seed) {
    uint64_t s = seed;
    return splitmix64(&s);
}

/* uniform in [0, 1) with 53 random bits */
static double uniform(uint64_t *rng) { return (double)(splitmix64(rng) >> 11) * 0x1.0p-53; }

typedef struct {
    float logit;
    int id;
} cand;

/* descending logit, ascending id on ties: a total order, so the result never depends on qsort */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

int fp8t_sample(const float *logits, int V, float temperature, int top_k, uint64_t *rng) {
    if (temperature <= 0.0f || top_k == 1) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    cand *c = malloc((size_t)V * sizeof(cand));
    if (!c) return 0;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (!isnan(logits[i])) c[n++] = (cand){logits[i], i};
    if (n == 0) {
        free(c);
        return 0;
    }
    int k = n;
    if (top_k > 0 && top_k < n) {
        qsort(c, (size_t)n, sizeof(cand), cand_cmp);
        k = top_k;
    }
    float mx = -INFINITY;
    for (int i = 0; i < k; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0.0;
    for (int i = 0; i < k; i++) sum += exp(((double)c[i].logit - mx) / temperature);
    double u = uniform(rng) * sum, acc = 0.0;
    int chosen = c[k - 1].id;
    for (int i = 0; i < k; i++) {
        acc += exp(((double)c[i].logit - mx) / temperature);
        if (u < acc) {
            chosen = c[i].id;
            break;
        }
    }
    free(c);
    return chosen;
}

int fp8t_generate(fp8t_evaluator *ev, const int *prompt, int n_prompt, int n_new,
                  const fp8t_sample_cfg *cfg, int *out, char *err, size_t errlen) {
    const int T = ev->T, V = ev->V;
    if (n_prompt < 1) {
        return fp8t_errorf(err, errlen, "generate: the prompt is empty; give at least one token");
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            return fp8t_errorf(err, errlen,
                               "generate: prompt token %d (position %d) is outside the "
                               "vocabulary [0, %d)",
                               prompt[i], i, V);
        }
    int *seq = malloc((size_t)(n_prompt + n_new) * sizeof(int)); /* [n_prompt + n_new] */
    if (!seq) {
        return fp8t_errorf(err, errlen, "generate: out of memory");
    }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int));
    uint64_t rng = fp8t_sample_seed(cfg->seed);
    fp8t_backend *be = fp8t_model_backend(ev->m);
    const size_t N = (size_t)ev->B * T;
    int len = n_prompt;
    for (int step = 0; step < n_new; step++) {
        int start = len > T ? len - T : 0, n = len - start;
        for (size_t i = 0; i < N; i++) ev->tokens[i] = 0;
        memcpy(ev->tokens, seq + start, (size_t)n * sizeof(int));
        fp8t_model_forward(ev->m, ev->tokens, NULL);
        const float *logits = fp8t_model_logits(ev->m); /* device [B*T, V] */
        be->ops->to_host(be, ev->row, logits + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        int next = fp8t_sample(ev->row, V, cfg->temperature, cfg->top_k, &rng);
        seq[len++] = next;
        out[step] = next;
    }
    free(seq);
    return 0;
}
