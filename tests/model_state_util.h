/* Test helpers shared by the model tests that compare two models bit for bit (a fused or
 * cached path against its switch back): host copies of device buffers, and the comparison of
 * gradients, parameters, FP8 recipe state and per-position losses. */
#ifndef FP8TRAIN_TEST_MODEL_STATE_UTIL_H
#define FP8TRAIN_TEST_MODEL_STATE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "fp8train/recipe.h"

/* Device buffer -> host copy (malloc'd; NULL if out of memory). */
static void *host_copy(fp8t_backend *be, const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (h) be->ops->to_host(be, h, dev, bytes);
    return h;
}

/* Number of buffers of a and b that differ by bits (gradients, parameters, FP8 recipe
 * state); prints the first difference. */
static int diff_model_state(fp8t_backend *be, fp8t_model *a, fp8t_model *b, const char *when) {
    const size_t np = fp8t_model_num_params(a);
    const size_t st =
        fp8t_recipe_state_floats(fp8t_model_fp8_count(a), fp8t_model_fp8_history_len(a));
    struct {
        const char *name;
        const float *pa, *pb;
        size_t n;
    } bufs[3] = {
        {"grads", fp8t_model_grads(a), fp8t_model_grads(b), np},
        {"params", fp8t_model_params(a), fp8t_model_params(b), np},
        {"fp8 state", fp8t_model_fp8_state(a), fp8t_model_fp8_state(b), st},
    };
    int ndiff = 0;
    for (int i = 0; i < 3; i++) {
        const size_t n = bufs[i].n;
        float *ha = host_copy(be, bufs[i].pa, n * sizeof(float));
        float *hb = host_copy(be, bufs[i].pb, n * sizeof(float));
        if (!ha || !hb) {
            ndiff++;
        } else if (memcmp(ha, hb, n * sizeof(float)) != 0) {
            size_t k = 0;
            while (k < n && !memcmp(&ha[k], &hb[k], sizeof(float))) k++;
            if (!ndiff)
                printf("  %s: %s differ at %zu: %.9g vs %.9g\n", when, bufs[i].name, k, ha[k],
                       hb[k]);
            ndiff++;
        }
        free(ha);
        free(hb);
    }
    return ndiff;
}

/* The per-position losses of the last forwards of a and b ([n]) are bit-identical. */
static int same_model_losses(fp8t_backend *be, fp8t_model *a, fp8t_model *b, int n) {
    float *la = host_copy(be, fp8t_model_losses(a), (size_t)n * sizeof(float));
    float *lb = host_copy(be, fp8t_model_losses(b), (size_t)n * sizeof(float));
    int same = la && lb && !memcmp(la, lb, (size_t)n * sizeof(float));
    free(la);
    free(lb);
    return same;
}

#endif
