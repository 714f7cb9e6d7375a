/* NaN/Inf provenance: the first GEMM tensor of a step, in execution order, that holds a
 * non-finite value. Each observed tensor costs one amax on the backend and a 4-byte copy to
 * the host; once a step has its culprit the rest of the step is skipped.
 * A NaN born in a non-GEMM op (softmax, a norm) is reported at the next GEMM tensor that
 * carries it: the name says where to start looking, the backward/forward tag which pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/debug.h"
#include "fp8train/stats.h"

struct fp8t_nan_tracker {
    int step;
    int found;
    char where[160];  /* "layer 2 fc2 fprop output (forward)" */
    fp8t_backend *be; /* owner of dev */
    void *dev;        /* on be: the amax (one float), or a strided site's fp8t_stats_raw */
};

fp8t_nan_tracker *fp8t_nan_tracker_create(void) {
    fp8t_nan_tracker *t = calloc(1, sizeof(*t));
    if (t) t->step = -1;
    return t;
}

void fp8t_nan_tracker_destroy(fp8t_nan_tracker *t) {
    if (!t) return;
    if (t->be && t->dev) t->be->ops->free(t->be, t->dev);
    free(t);
}

void fp8t_nan_tracker_begin_step(fp8t_nan_tracker *t, int step) {
    if (!t) return;
    t->step = step;
    t->found = 0;
    t->where[0] = 0;
}

static void describe(char *buf, size_t len, const fp8t_tensor_site *s) {
    const char *pass = s->gemm == FP8T_GEMM_FPROP ? "forward" : "backward";
    if (s->layer < 0)
        snprintf(buf, len, "%s %s %s (%s)", fp8t_module_name(s->module), fp8t_gemm_name(s->gemm),
                 fp8t_tensor_kind_name(s->kind), pass);
    else
        snprintf(buf, len, "layer %d %s %s %s (%s)", s->layer, fp8t_module_name(s->module),
                 fp8t_gemm_name(s->gemm), fp8t_tensor_kind_name(s->kind), pass);
}

void fp8t_nan_tracker_observe(fp8t_nan_tracker *t, fp8t_model *m, const fp8t_tensor_site *site,
                              float *x) {
    if (!t || t->found || !site || !x || site->rows <= 0 || site->cols <= 0) return;
    fp8t_backend *be = fp8t_model_backend(m);
    if (t->be != be) { /* first use, or a new model on another backend */
        if (t->be && t->dev) t->be->ops->free(t->be, t->dev);
        t->be = be;
        t->dev = be->ops->malloc(be, sizeof(fp8t_stats_raw));
    }
    if (site->ld > site->cols) {
        /* rows inside a wider buffer (a read-only hook's head logits): the floats between
         * them are not the tensor's, so the moments' counts of it instead of the amax */
        fp8t_stats_req req;
        memset(&req, 0, sizeof req);
        req.ld = site->ld;
        fp8t_stats_raw raw;
        be->ops->tensor_stats(be, t->dev, x, site->rows, site->cols, &req);
        be->ops->to_host(be, &raw, t->dev, sizeof raw);
        if (raw.n_nan == 0 && raw.n_inf == 0) return;
    } else {
        /* amax propagates NaN and turns +-Inf into Inf: one scalar says "non-finite". */
        be->ops->zero(be, t->dev, sizeof(float));
        be->ops->amax(be, t->dev, x, (size_t)site->rows * (size_t)site->cols);
        float amax = 0;
        be->ops->to_host(be, &amax, t->dev, sizeof(float));
        if (isfinite(amax)) return;
    }
    t->found = 1;
    describe(t->where, sizeof(t->where), site);
}

int fp8t_nan_tracker_first(const fp8t_nan_tracker *t, char *buf, size_t len) {
    if (!t || !t->found) {
        if (buf && len) buf[0] = 0;
        return 0;
    }
    if (buf && len) snprintf(buf, len, "%s", t->where);
    return 1;
}
