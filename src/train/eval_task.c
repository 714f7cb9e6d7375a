/* Multiple-choice tasks in llm.c's eval format (HellaSwag and the like): read, write, score.
 *
 * Scoring follows llm.c's evalloader: each completion is placed after the shared context in
 * its own row; the positions that predict completion tokens are the only targets; a
 * completion's score is its mean loss; the lowest mean loss is the model's choice. Examples
 * are packed several per micro-batch when their rows fit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/io.h"
#include "train/eval_internal.h"
#include "util/le.h"

#define TASK_HEADER_INTS 256
#define TASK_START 65535

void fp8t_task_free(fp8t_task *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->ex[i].ctx); /* one block per example */
    free(t->ex);
    memset(t, 0, sizeof(*t));
}

int fp8t_task_add(fp8t_task *t, int label, const int *ctx, int ctx_len, int n_completions,
                  const int *const *comp, const int *comp_len) {
    if (ctx_len < 1 || n_completions < 1 || n_completions > FP8T_TASK_MAX_COMPLETIONS ||
        label < 0 || label >= n_completions)
        return -1;
    size_t total = (size_t)ctx_len;
    for (int c = 0; c < n_completions; c++) {
        if (comp_len[c] < 1) return -1;
        total += (size_t)comp_len[c];
    }
    fp8t_task_example *ex = realloc(t->ex, (size_t)(t->n + 1) * sizeof(*ex));
    if (!ex) return -1;
    t->ex = ex;
    int *block = malloc(total * sizeof(int)); /* [ctx | comp 0 | comp 1 | ...] */
    if (!block) return -1;
    fp8t_task_example *e = &t->ex[t->n];
    memset(e, 0, sizeof(*e));
    e->label = label;
    e->n_completions = n_completions;
    e->ctx_len = ctx_len;
    e->ctx = block;
    memcpy(block, ctx, (size_t)ctx_len * sizeof(int));
    int *p = block + ctx_len;
    for (int i = 0; i < ctx_len; i++)
        t->max_token = ctx[i] > t->max_token ? ctx[i] : t->max_token;
    for (int c = 0; c < n_completions; c++) {
        e->comp_len[c] = comp_len[c];
        e->comp[c] = p;
        memcpy(p, comp[c], (size_t)comp_len[c] * sizeof(int));
        for (int i = 0; i < comp_len[c]; i++)
            t->max_token = comp[c][i] > t->max_token ? comp[c][i] : t->max_token;
        p += comp_len[c];
        int need = ctx_len + comp_len[c] - 1;
        t->longest = need > t->longest ? need : t->longest;
    }
    t->max_completions = n_completions > t->max_completions ? n_completions : t->max_completions;
    t->n++;
    return 0;
}

int fp8t_task_read(const char *path, fp8t_task *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    char *data = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(path, &data, &len, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "task file: %s", e);
    }
    const uint8_t *b = (const uint8_t *)data;
    int *ctx = NULL;
    const char *why = NULL;
    int bad_example = -1;
    if (len < TASK_HEADER_INTS * 4) {
        fp8t_errorf(err, errlen,
                    "%s: truncated: %zu bytes, the header alone is %d bytes; not an "
                    "llm.c eval file (dev/data/hellaswag.py writes them)",
                    path, len, TASK_HEADER_INTS * 4);
        free(data);
        return -1;
    }
    uint32_t magic = fp8t_load_le32(b), version = fp8t_load_le32(b + 4);
    uint32_t count = fp8t_load_le32(b + 8);
    if (magic != FP8T_TASK_MAGIC) {
        fp8t_errorf(err, errlen, "%s: bad magic %u (an llm.c eval file has %d%s)", path, magic,
                    FP8T_TASK_MAGIC,
                    magic == 20240520 ? "; this is a token shard: use it with --data" : "");
        free(data);
        return -1;
    }
    if (version != 1) {
        fp8t_errorf(err, errlen, "%s: eval file version %u is not supported (1)", path, version);
        free(data);
        return -1;
    }
    if (count > 65536) {
        fp8t_errorf(err, errlen,
                    "%s: header claims %u examples (at most 65536: indices are uint16)", path,
                    count);
        free(data);
        return -1;
    }
    size_t off = TASK_HEADER_INTS * 4;
    for (uint32_t i = 0; i < count; i++) {
        bad_example = (int)i;
        if (len - off < 12) {
            why = "the file ends inside the example header (truncated)";
            break;
        }
        const uint8_t *p = b + off;
        unsigned start = fp8t_load_le16(p), nbytes = fp8t_load_le16(p + 2);
        unsigned index = fp8t_load_le16(p + 4), label = fp8t_load_le16(p + 6);
        unsigned ncomp = fp8t_load_le16(p + 8), ctx_len = fp8t_load_le16(p + 10);
        if (start != TASK_START) {
            why = "missing the start delimiter 65535 (corrupt file)";
            break;
        }
        if (index != (i & 0xFFFFu)) {
            why = "its index does not match its position";
            break;
        }
        if (nbytes % 2 || nbytes < 14 || nbytes > len - off) {
            why = nbytes > len - off ? "its byte count runs past the end of the file (truncated)"
                                     : "its byte count is invalid";
            break;
        }
        if (ncomp < 1 || ncomp > FP8T_TASK_MAX_COMPLETIONS) {
            why = "number of completions not in 1..16";
            break;
        }
        if (label >= ncomp) {
            why = "its label is not a completion index";
            break;
        }
        if (ctx_len < 1) {
            why = "its context is empty";
            break;
        }
        const size_t n16 = nbytes / 2; /* uint16s in the example */
        size_t pos = 6 + (size_t)ctx_len;
        if (pos > n16) {
            why = "its context runs past its byte count";
            break;
        }
        const int *comp[FP8T_TASK_MAX_COMPLETIONS];
        int comp_len[FP8T_TASK_MAX_COMPLETIONS];
        free(ctx);
        ctx = malloc(n16 * sizeof(int)); /* [n16] every token of the example, decoded */
        if (!ctx) {
            why = "out of memory";
            break;
        }
        for (unsigned k = 0; k < ctx_len; k++) ctx[k] = (int)fp8t_load_le16(p + 2 * (6 + k));
        size_t filled = ctx_len;
        for (unsigned c = 0; c < ncomp && !why; c++) {
            if (pos >= n16) {
                why = "a completion runs past its byte count";
                break;
            }
            unsigned cl = fp8t_load_le16(p + 2 * pos);
            pos++;
            if (cl < 1 || pos + cl > n16) {
                why = "a completion length is 0 or runs past its byte count";
                break;
            }
            comp[c] = ctx + filled;
            comp_len[c] = (int)cl;
            for (unsigned k = 0; k < cl; k++)
                ctx[filled + k] = (int)fp8t_load_le16(p + 2 * (pos + k));
            filled += cl;
            pos += cl;
        }
        if (why) break;
        if (pos != n16) {
            why = "its byte count does not match its contents";
            break;
        }
        if (fp8t_task_add(t, (int)label, ctx, (int)ctx_len, (int)ncomp, comp, comp_len) != 0) {
            why = "out of memory";
            break;
        }
        off += nbytes;
    }
    free(ctx);
    if (!why && off != len) {
        fp8t_errorf(err, errlen,
                    "%s: %zu bytes after the %u examples the header announces (wrong "
                    "count in the header?)",
                    path, len - off, count);
        free(data);
        fp8t_task_free(t);
        return -1;
    }
    free(data);
    if (why) {
        fp8t_errorf(err, errlen, "%s: example %d: %s", path, bad_example, why);
        fp8t_task_free(t);
        return -1;
    }
    return 0;
}

int fp8t_task_write(const char *path, const fp8t_task *t, char *err, size_t errlen) {
    size_t total = TASK_HEADER_INTS * 4;
    int longest = 0;
    for (int i = 0; i < t->n; i++) {
        const fp8t_task_example *e = &t->ex[i];
        size_t n16 = 6 + (size_t)e->ctx_len;
        for (int c = 0; c < e->n_completions; c++) n16 += 1 + (size_t)e->comp_len[c];
        if (n16 * 2 > 65535) {
            return fp8t_errorf(err, errlen,
                               "%s: example %d is %zu bytes; the format stores sizes as uint16",
                               path, i, n16 * 2);
        }
        longest = (int)(n16 * 2) > longest ? (int)(n16 * 2) : longest;
        total += n16 * 2;
    }
    if (t->n > 65536) {
        return fp8t_errorf(err, errlen, "%s: %d examples; the format indexes them with uint16",
                           path, t->n);
    }
    uint8_t *buf = calloc(total, 1);
    if (!buf) {
        return fp8t_errorf(err, errlen, "%s: out of memory", path);
    }
    int32_t hdr[4] = {FP8T_TASK_MAGIC, 1, t->n, longest};
    memcpy(buf, hdr, sizeof(hdr));
    uint8_t *p = buf + TASK_HEADER_INTS * 4;
#define PUT16(v)                                                                                 \
    do {                                                                                         \
        unsigned v_ = (unsigned)(v);                                                             \
        p[0] = (uint8_t)v_;                                                                      \
        p[1] = (uint8_t)(v_ >> 8);                                                               \
        p += 2;                                                                                  \
    } while (0)
    for (int i = 0; i < t->n; i++) {
        const fp8t_task_example *e = &t->ex[i];
        size_t n16 = 6 + (size_t)e->ctx_len;
        for (int c = 0; c < e->n_completions; c++) n16 += 1 + (size_t)e->comp_len[c];
        for (int k = 0; k < e->ctx_len; k++)
            if (e->ctx[k] < 0 || e->ctx[k] >= TASK_START) goto bad_token;
        for (int c = 0; c < e->n_completions; c++)
            for (int k = 0; k < e->comp_len[c]; k++)
                if (e->comp[c][k] < 0 || e->comp[c][k] >= TASK_START) goto bad_token;
        PUT16(TASK_START);
        PUT16(n16 * 2);
        PUT16(i & 0xFFFF);
        PUT16(e->label);
        PUT16(e->n_completions);
        PUT16(e->ctx_len);
        for (int k = 0; k < e->ctx_len; k++) PUT16(e->ctx[k]);
        for (int c = 0; c < e->n_completions; c++) {
            PUT16(e->comp_len[c]);
            for (int k = 0; k < e->comp_len[c]; k++) PUT16(e->comp[c][k]);
        }
        continue;
    bad_token:
        fp8t_errorf(err, errlen, "%s: example %d has a token outside 0..65534", path, i);
        free(buf);
        return -1;
    }
#undef PUT16
    int rc = fp8t_write_file_atomic(path, buf, total, err, errlen);
    free(buf);
    return rc;
}

int fp8t_task_score(const fp8t_task *t, int B, int T, int V, int *tokens, int *targets,
                    float *losses, fp8t_task_losses_fn fn, void *ctx, int *correct, int *pred,
                    char *err, size_t errlen) {
    *correct = 0;
    if (t->n == 0) return 0;
    if (t->max_completions > B || t->longest > T) {
        return fp8t_errorf(err, errlen,
                           "task: examples need %d rows of %d tokens but the evaluation model "
                           "is [%d, %d]; raise --batch / --seq-len (seq-len at most the model's)",
                           t->max_completions, t->longest, B, T);
    }
    if (t->max_token >= V) {
        return fp8t_errorf(err, errlen,
                           "task: token %d is outside the model's vocabulary (%d); the task "
                           "was tokenized for another model",
                           t->max_token, V);
    }
    int first = 0;
    while (first < t->n) {
        /* pack examples [first, last) into the B rows */
        int rows = 0, last = first;
        while (last < t->n && rows + t->ex[last].n_completions <= B)
            rows += t->ex[last++].n_completions;
        for (size_t i = 0; i < (size_t)B * T; i++) {
            tokens[i] = 0;
            targets[i] = -1;
        }
        int r = 0;
        for (int i = first; i < last; i++) {
            const fp8t_task_example *e = &t->ex[i];
            for (int c = 0; c < e->n_completions; c++, r++) {
                int *tok = tokens + (size_t)r * T, *tgt = targets + (size_t)r * T;
                memcpy(tok, e->ctx, (size_t)e->ctx_len * sizeof(int));
                /* the last completion token is a target only; it is no input when it would not fit */
                int n_in = e->comp_len[c] - (e->ctx_len + e->comp_len[c] > T ? 1 : 0);
                memcpy(tok + e->ctx_len, e->comp[c], (size_t)n_in * sizeof(int));
                for (int k = 0; k < e->comp_len[c]; k++) tgt[e->ctx_len - 1 + k] = e->comp[c][k];
            }
        }
        if (fn(ctx, tokens, targets, losses, err, errlen) != 0) return -1;
        r = 0;
        for (int i = first; i < last; i++) {
            const fp8t_task_example *e = &t->ex[i];
            int best = -1;
            double best_loss = 0.0;
            for (int c = 0; c < e->n_completions; c++, r++) {
                const float *lr = losses + (size_t)r * T + (e->ctx_len - 1);
                double s = 0.0;
                for (int k = 0; k < e->comp_len[c]; k++) s += lr[k];
                double mean = s / e->comp_len[c];
                if (best < 0 || mean < best_loss) {
                    best = c;
                    best_loss = mean;
                }
            }
            if (pred) pred[i] = best;
            *correct += best == e->label;
        }
        first = last;
    }
    return 0;
}

/* the training model's per-position losses of one packed batch */
static int evaluator_losses(void *ctx, const int *tokens, const int *targets, float *losses,
                            char *err, size_t errlen) {
    fp8t_evaluator *ev = ctx;
    float l = fp8t_model_forward(ev->m, tokens, targets);
    if (isnan(l)) {
        return fp8t_errorf(err, errlen, "task: the forward pass failed (see the message above)");
    }
    fp8t_backend *be = fp8t_model_backend(ev->m);
    be->ops->to_host(be, losses, fp8t_model_losses(ev->m), (size_t)ev->B * ev->T * sizeof(float));
    return 0;
}

int fp8t_task_eval(fp8t_evaluator *ev, const fp8t_task *t, int *correct, int *pred, char *err,
                   size_t errlen) {
    return fp8t_task_score(t, ev->B, ev->T, ev->V, ev->tokens, ev->targets, ev->losses,
                           evaluator_losses, ev, correct, pred, err, errlen);
}
