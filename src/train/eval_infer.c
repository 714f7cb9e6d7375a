/* What the evaluation runs on the inference model (fp8train/infer.h), through its public API:
 * batched generation with the KV cache (one prefill of the n prompts, right-padded to the
 * longest, then one decode step per new token, every sequence at its own position) and the
 * multiple-choice tasks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/infer.h"

int fp8t_infer_generate(fp8t_infer *m, const int *const *prompts, const int *lens, int n,
                        int n_new, const fp8t_sample_cfg *cfg, int *out, char *err,
                        size_t errlen) {
    const int Bm = fp8t_infer_B(m), Tmax = fp8t_infer_Tmax(m);
    if (n < 1 || n > Bm) {
        return fp8t_errorf(err, errlen,
                           "generate: %d prompts for a model built for batches of %d", n, Bm);
    }
    if (n_new < 1) return 0;
    int T = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1) {
            return fp8t_errorf(err, errlen,
                               "generate: prompt %d is empty; give at least one token", i);
        }
        T = lens[i] > T ? lens[i] : T;
    }
    if (T + n_new - 1 > Tmax) {
        return fp8t_errorf(err, errlen,
                           "generate: the longest prompt (%d tokens) + %d new tokens need %d "
                           "cache positions; the model was built for %d",
                           T, n_new, T + n_new - 1, Tmax);
    }
    const int V = fp8t_infer_config(m)->vocab_size;
    int *tok = calloc((size_t)n * T, sizeof(int)); /* [n, T] right-padded with token 0 */
    int *pos = malloc((size_t)n * sizeof(int));
    int *next = malloc((size_t)n * sizeof(int));
    uint64_t *rng = malloc((size_t)n * sizeof(uint64_t));
    float *logits = malloc((size_t)n * V * sizeof(float));
    int rc = -1;
    if (!tok || !pos || !next || !rng || !logits) {
        fp8t_errorf(err, errlen, "generate: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        memcpy(tok + (size_t)i * T, prompts[i], (size_t)lens[i] * sizeof(int));
        rng[i] = fp8t_sample_seed(cfg->seed + (uint64_t)i);
    }
    if (fp8t_infer_prefill(m, tok, n, T, lens, logits, err, errlen)) goto done;
    for (int j = 0;; j++) {
        for (int i = 0; i < n; i++) {
            next[i] =
                fp8t_sample(logits + (size_t)i * V, V, cfg->temperature, cfg->top_k, &rng[i]);
            out[(size_t)i * n_new + j] = next[i];
            pos[i] = lens[i] + j; /* where the token just sampled goes */
        }
        if (j + 1 == n_new) break;
        if (fp8t_infer_decode(m, next, pos, n, logits, err, errlen)) goto done;
    }
    rc = 0;
done:
    free(tok);
    free(pos);
    free(next);
    free(rng);
    free(logits);
    return rc;
}

/* the inference model's per-position losses of one packed task batch */
typedef struct {
    fp8t_infer *m;
    int B, T;
} task_ctx;

static int task_losses(void *ctx, const int *tokens, const int *targets, float *losses, char *err,
                       size_t errlen) {
    const task_ctx *c = ctx;
    return fp8t_infer_losses(c->m, tokens, targets, c->B, c->T, losses, err, errlen);
}

int fp8t_infer_task_eval(fp8t_infer *m, const fp8t_task *t, int *correct, int *pred, char *err,
                         size_t errlen) {
    /* the packed rows are as long as the longest example, so the model's cache length needs
     * to cover only that */
    const int B = fp8t_infer_B(m), T = t->longest > 0 ? t->longest : 1;
    *correct = 0;
    if (T > fp8t_infer_Tmax(m)) {
        return fp8t_errorf(err, errlen,
                           "task: examples need %d positions but the inference model holds %d", T,
                           fp8t_infer_Tmax(m));
    }
    int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    float *loss = malloc((size_t)B * T * sizeof(float));
    int rc = -1;
    if (!tok || !tgt || !loss)
        fp8t_errorf(err, errlen, "task: out of memory");
    else {
        task_ctx c = {m, B, T};
        rc = fp8t_task_score(t, B, T, fp8t_infer_config(m)->vocab_size, tok, tgt, loss,
                             task_losses, &c, correct, pred, err, errlen);
    }
    free(tok);
    free(tgt);
    free(loss);
    return rc;
}
