/* bisect's private state, shared by src/tools/bisect.c (the procedure) and
 * src/tools/bisect_report.c (table, bisect.json, report.html). */
#ifndef FP8TRAIN_BISECT_INTERNAL_H
#define FP8TRAIN_BISECT_INTERNAL_H

#include <stddef.h>

#include "fp8train/bisect.h"

/* local path buffers: room for any OUT/bisect/<name>/<file> */
#define BPATH (3 * FP8T_PATH_MAX)

typedef struct {
    const fp8t_bisect_config *cfg;
    fp8t_bisect_result *res;
    char root[FP8T_PATH_MAX]; /* OUT/bisect */
    int start_step;           /* 0, or the step of --resume */
    int n_layer;
    int n_pos;    /* places the layer search runs over: the layers, then the LM
                                  head when the policy runs it in FP8 (position n_layer) */
    int planned;  /* experiments expected in total (for the ETA) */
    double spent; /* seconds in experiments so far */
    int rank;     /* under a launcher: only rank 0 writes bisect's files and
                                  reads the experiments' logs (bisect.c: from_rank0) */
    char *err;
    size_t errlen;
} bisect_ctx;

/* "layer 2", "layers 1-3", "the LM head", "layers 2-3 and the LM head" */
void bisect_span_words(char *buf, size_t len, int n_layer, int lo, int hi);
/* "fprop", "dgrad+wgrad" */
void bisect_gemm_set_name(char *buf, size_t len, unsigned mask);

/* OUT/bisect/bisect.json and OUT/bisect/report.html. 0 ok, -1 with c->err. */
int bisect_write_json(bisect_ctx *c);
int bisect_write_html(bisect_ctx *c);

#endif
