/* The trainer's data-parallel part: see dist_train.h and docs/parallel.md.
 *
 * The global batch of a step is grad_accum micro-batches of B sequences, the same for any
 * world size N: rank r runs micro-batches [r * accum/N, (r+1) * accum/N), each with the loss
 * scale 1/accum, so the sum over ranks of the gradients is the gradient of the whole batch.
 * Every rank sees the same losses (gathered), the same gradient norm and the same weights, so
 * every decision of the loop (clipping, detectors, shadow, NaN stop) is taken alike everywhere
 * without another message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/debug.h"
#include "fp8train/dist.h"
#include "fp8train/error.h"
#include "train/dist_train.h"

/* Remove "ranks=..." from an inspect spec (the inspector does not know it); *all = ranks=all. */
static int strip_ranks(char *spec, int *all, char *err, size_t errlen) {
    char out[FP8T_PATH_MAX];
    size_t o = 0;
    *all = 0;
    out[0] = 0;
    char *save = NULL, *copy = strdup(spec);
    if (!copy) return -1;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strncmp(tok, "ranks=", 6) == 0) {
            if (strcmp(tok + 6, "0") == 0)
                *all = 0;
            else if (strcmp(tok + 6, "all") == 0)
                *all = 1;
            else {
                fp8t_errorf(err, errlen,
                            "--inspect: ranks=%s: expected ranks=0 (rank 0's "
                            "statistics only) or ranks=all (every rank's)",
                            tok + 6);
                free(copy);
                return -1;
            }
            continue;
        }
        o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%s", o ? "," : "", tok);
        if (o >= sizeof(out)) break;
    }
    free(copy);
    snprintf(spec, FP8T_PATH_MAX, "%s", out);
    /* "ranks=all" alone means every statistic, on every rank */
    if (!spec[0]) snprintf(spec, FP8T_PATH_MAX, "every=1");
    return 0;
}

int dp_setup(dp_state *d, fp8t_train_config *cfg, char *err, size_t errlen) {
    memset(d, 0, sizeof(*d));
    if (fp8t_dist_init(err, errlen) != 0) return -1;
    d->rank = fp8t_dist_rank();
    d->size = fp8t_dist_size();
    d->active = d->size > 1 || cfg->dp_force;
    d->zero = cfg->zero;
    d->bf16_reduce = cfg->dp_bf16_reduce;
    d->amax_reduce = cfg->amax_reduce;
    d->bucket_bytes = (double)cfg->bucket_mb * 1048576.0;
    snprintf(d->inspect_spec, sizeof(d->inspect_spec), "%s", cfg->inspect);
    if (d->inspect_spec[0] && strstr(d->inspect_spec, "ranks=") &&
        strip_ranks(d->inspect_spec, &d->inspect_all, err, errlen) != 0)
        return -1;
    if (d->inspect_spec[0]) { /* a bad spec is refused before the run directory is touched */
        char e[FP8T_ERR_LEN];
        if (fp8t_inspector_spec_check(d->inspect_spec, e, sizeof(e)) != 0) {
            return fp8t_errorf(err, errlen, "--inspect: %s", e);
        }
    }
    if (cfg->grad_accum % d->size != 0) {
        return fp8t_errorf(
            err, errlen,
            "--grad-accum %d is not a multiple of the %d ranks: each rank "
            "runs grad_accum/N micro-batches of the global batch (use --grad-accum %d)",
            cfg->grad_accum, d->size, (cfg->grad_accum + d->size - 1) / d->size * d->size);
    }
    if (d->zero && d->bf16_reduce) {
        return fp8t_errorf(err, errlen,
                           "--zero 1 reduce-scatters the gradients in FP32; --dp-reduce bf16 "
                           "works with plain data parallel only (drop one of the two)");
    }
    d->n_micro = cfg->grad_accum / d->size;
    d->first_micro = d->rank * d->n_micro;
    d->losses = calloc((size_t)cfg->grad_accum, sizeof(float));
    if (!d->losses) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    /* one voice: progress lines and the summary come from rank 0 */
    if (d->rank != 0) cfg->quiet = 1;
    return 0;
}

/* The buckets, in launch order: walking the points where the backward reports gradients
 * final (the blocks' starts in the parameter table, after the head and the final norm first,
 * the embedding last), a bucket closes once it holds bucket_bytes, or at the embedding. */
static int make_buckets(dp_state *d, const fp8t_model_config *mc, size_t total) {
    const int L = mc->n_layer;
    int count = fp8t_model_param_table(mc, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)count, sizeof(*info));
    size_t *start = calloc((size_t)L + 1, sizeof(size_t)); /* [l]: layer l's first float */
    d->buckets = calloc((size_t)L + 2, sizeof(*d->buckets));
    if (!info || !start || !d->buckets) {
        free(info), free(start);
        return -1;
    }
    fp8t_model_param_table(mc, info, NULL);
    for (int l = 0; l <= L; l++) start[l] = total;
    for (int i = 0; i < count; i++) {
        const int l = info[i].layer;
        if (l < 0) continue;
        if (info[i].offset < start[l]) start[l] = info[i].offset;
        /* start[L]: where the tensors after the blocks (final norm, untied head) begin */
        if (start[L] == total || info[i].offset + info[i].numel > start[L])
            start[L] = info[i].offset + info[i].numel;
    }
    size_t hi = total;
    for (int l = L; l >= -1; l--) {
        const size_t lo = l >= 0 ? start[l] : 0;
        if (hi > lo && ((double)(hi - lo) * sizeof(float) >= d->bucket_bytes || l < 0)) {
            struct dp_bucket *b = &d->buckets[d->n_buckets++];
            b->lo = lo, b->hi = hi, b->layer = l;
            if (d->zero) {
                b->counts = calloc((size_t)d->size, sizeof(size_t));
                if (!b->counts) break;
                size_t off = 0; /* rank r's shard [off, off + counts[r]) cut to [lo, hi) */
                for (int r = 0; r < d->size; r++) {
                    size_t a = off > lo ? off : lo, e = off + d->counts[r];
                    if (e > hi) e = hi;
                    b->counts[r] = e > a ? e - a : 0;
                    off += d->counts[r];
                }
            }
            hi = lo;
        }
    }
    free(info), free(start);
    return d->zero && d->n_buckets && !d->buckets[d->n_buckets - 1].counts ? -1 : 0;
}

int dp_attach(dp_state *d, fp8t_backend *be, fp8t_model *m, const fp8t_model_config *mc,
              char *err, size_t errlen) {
    if (!d->active) return 0;
    const fp8t_backend_ops *ops = be->ops;
    if (!ops->comm_init || !ops->allreduce) {
        return fp8t_errorf(err, errlen,
                           "the %s backend has no collectives: run one process without "
                           "--dp-force",
                           be->name);
    }
    if (ops->comm_init(be, err, errlen) != 0) return -1;
    size_t n = fp8t_model_num_params(m);
    d->counts = calloc((size_t)d->size, sizeof(size_t));
    if (!d->counts) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    /* even shards in floats, the first n % N ranks one more: the split the checkpoint's
     * optimizer shard files are cut by */
    for (int r = 0; r < d->size; r++) {
        size_t lo, hi;
        fp8t_checkpoint_shard(n, d->size, r, &lo, &hi);
        d->counts[r] = hi - lo;
    }
    fp8t_checkpoint_shard(n, d->size, d->rank, &d->shard_lo, &d->shard_hi);
    d->scalar = ops->malloc(be, sizeof(float));
    if (d->zero) {
        size_t bytes = (d->shard_hi - d->shard_lo) * sizeof(float) + sizeof(float);
        d->m_shard = ops->malloc(be, bytes);
        d->v_shard = ops->malloc(be, bytes);
        fp8t_model_release_adam(m); /* what ZeRO-1 saves: (N-1)/N of the moments */
    }
    d->be = be;
    d->grads = fp8t_model_grads(m);
    if (d->bucket_bytes > 0 && ops->reduce_start && ops->reduce_wait &&
        make_buckets(d, mc, n) != 0) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    return 0;
}

void dp_free(dp_state *d, fp8t_backend *be) {
    if (be) {
        if (d->m_shard) be->ops->free(be, d->m_shard);
        if (d->v_shard) be->ops->free(be, d->v_shard);
        if (d->scalar) be->ops->free(be, d->scalar);
    }
    if (d->started && d->be) dp_grads_wait(d);
    for (int i = 0; i < d->n_buckets; i++) free(d->buckets[i].counts);
    free(d->buckets);
    free(d->counts);
    free(d->losses);
    memset(d, 0, sizeof(*d));
}

int dp_agree(dp_state *d, int rc, char *err, size_t errlen) {
    if (d->size <= 1) return rc;
    /* the lowest failing rank, or size if none failed */
    int who[2] = {rc != 0 ? -d->rank : -d->size, rc != 0};
    fp8t_dist_allreduce_i32(who, 2, FP8T_RED_MAX);
    if (!who[1]) return 0;
    if (rc == 0)
        fp8t_errorf(err, errlen, "rank %d failed (its message is above); every rank stops",
                    -who[0]);
    return -1;
}

void dp_gather_losses(dp_state *d, int accum) {
    (void)accum;
    if (d->size <= 1) return;
    float *mine = malloc((size_t)d->n_micro * sizeof(float));
    if (!mine) fp8t_dist_abort(1);
    memcpy(mine, d->losses + d->first_micro, (size_t)d->n_micro * sizeof(float));
    fp8t_dist_allgather(mine, d->losses, (size_t)d->n_micro * sizeof(float));
    free(mine);
}

static void start_buckets(dp_state *d, int upto_layer) {
    const fp8t_backend_ops *ops = d->be->ops;
    while (d->next_bucket < d->n_buckets && d->buckets[d->next_bucket].layer >= upto_layer) {
        const struct dp_bucket *b = &d->buckets[d->next_bucket++];
        ops->reduce_start(d->be, d->grads + b->lo, b->hi - b->lo, d->zero ? b->counts : NULL,
                          d->bf16_reduce);
    }
}

static void on_grads_ready(void *ctx, int layer) { start_buckets(ctx, layer); }

void dp_grads_arm(dp_state *d, fp8t_model *m) {
    if (!d->n_buckets) return;
    d->next_bucket = 0;
    d->started = 1;
    fp8t_model_set_grads_ready(m, on_grads_ready, d);
}

void dp_grads_flush(dp_state *d, fp8t_model *m) {
    if (!d->n_buckets) return;
    fp8t_model_set_grads_ready(m, NULL,
                               NULL); /* other backwards (the NaN re-run) reduce nothing */
    if (!d->started) d->next_bucket = 0, d->started = 1;
    start_buckets(d, -1);
}

void dp_grads_wait(dp_state *d) {
    if (!d->started) return;
    d->be->ops->reduce_wait(d->be);
    d->started = 0;
}

float dp_grad_norm(dp_state *d, fp8t_backend *be, fp8t_model *m) {
    if (!d->active) return fp8t_model_grad_norm(m);
    const fp8t_backend_ops *ops = be->ops;
    float *g = fp8t_model_grads(m);
    /* the same elementwise sums whether in buckets or at once (backend.h: reduce_start) */
    if (d->n_buckets)
        dp_grads_wait(d);
    else if (d->zero)
        ops->reduce_scatter(be, g, d->counts);
    else
        ops->allreduce(be, g, fp8t_model_num_params(m), FP8T_RED_SUM, d->bf16_reduce);
    /* The norm from one partial sum of squares per shard, added in rank order: plain data
     * parallel and ZeRO-1 (where a rank holds only its shard of the reduced gradients) get
     * the same bits, and one shard (N = 1) is the plain path's sum exactly. */
    float part = 0.0f;
    ops->zero(be, d->scalar, sizeof(float));
    ops->sumsq(be, d->scalar, g + d->shard_lo, d->shard_hi - d->shard_lo);
    ops->to_host(be, &part, d->scalar, sizeof(float));
    float *parts = malloc((size_t)d->size * sizeof(float));
    if (!parts) fp8t_dist_abort(1);
    fp8t_dist_allgather(&part, parts, sizeof(float));
    float sumsq = 0.0f;
    for (int r = 0; r < d->size; r++) sumsq += parts[r];
    free(parts);
    return sqrtf(sumsq);
}

void dp_adamw(dp_state *d, fp8t_backend *be, fp8t_model *m, float lr, float beta1, float beta2,
              float eps, float weight_decay, int t, float grad_clip, float grad_norm) {
    if (!d->zero) {
        fp8t_model_adamw(m, lr, beta1, beta2, eps, weight_decay, t, grad_clip, grad_norm);
        return;
    }
    fp8t_model_adamw_range(m, d->m_shard, d->v_shard, d->shard_lo, d->shard_hi, lr, beta1, beta2,
                           eps, weight_decay, t, grad_clip, grad_norm);
    be->ops->all_gather(be, fp8t_model_params(m), d->counts);
}

void dp_reduce_amax(dp_state *d, fp8t_backend *be, fp8t_model *m) {
    if (!d->active || !d->amax_reduce) return;
    /* slot 0 of the history ([len][n] first) holds this step's amax of every tensor */
    be->ops->allreduce(be, fp8t_model_fp8_state(m), (size_t)fp8t_model_fp8_count(m), FP8T_RED_MAX,
                       0);
}

void dp_moment_range(const dp_state *d, size_t n, size_t *lo, size_t *hi) {
    if (d->zero)
        fp8t_checkpoint_shard(n, d->size, d->rank, lo, hi);
    else
        *lo = 0, *hi = n;
}

void dp_adam_to_host(dp_state *d, fp8t_backend *be, fp8t_model *m, float *adam_m, float *adam_v) {
    const fp8t_backend_ops *ops = be->ops;
    if (!d->zero) {
        size_t n = fp8t_model_num_params(m);
        ops->to_host(be, adam_m, fp8t_model_adam_m(m), n * sizeof(float));
        ops->to_host(be, adam_v, fp8t_model_adam_v(m), n * sizeof(float));
        return;
    }
    size_t k = d->shard_hi - d->shard_lo;
    ops->to_host(be, adam_m, d->m_shard, k * sizeof(float));
    ops->to_host(be, adam_v, d->v_shard, k * sizeof(float));
}

void dp_adam_to_device(dp_state *d, fp8t_backend *be, fp8t_model *m, const float *adam_m,
                       const float *adam_v, size_t lo) {
    const fp8t_backend_ops *ops = be->ops;
    if (!d->zero) {
        size_t n = fp8t_model_num_params(m);
        ops->to_device(be, fp8t_model_adam_m(m), adam_m, n * sizeof(float));
        ops->to_device(be, fp8t_model_adam_v(m), adam_v, n * sizeof(float));
        return;
    }
    size_t k = d->shard_hi - d->shard_lo;
    ops->to_device(be, d->m_shard, adam_m + (d->shard_lo - lo), k * sizeof(float));
    ops->to_device(be, d->v_shard, adam_v + (d->shard_lo - lo), k * sizeof(float));
}

float dp_bcast_float(dp_state *d, float x, int root) {
    if (d->size > 1) fp8t_dist_bcast(&x, sizeof(x), root);
    return x;
}

void dp_first_where(dp_state *d, char *where, size_t len) {
    if (d->size <= 1) return;
    enum { W = 512 };
    char mine[W], *all = malloc((size_t)W * (size_t)d->size);
    if (!all) fp8t_dist_abort(1);
    snprintf(mine, sizeof(mine), "%s", where);
    fp8t_dist_allgather(mine, all, W);
    where[0] = 0;
    for (int r = 0; r < d->size; r++)
        if (all[(size_t)r * W]) {
            snprintf(where, len, "rank %d: %.*s", r, W, all + (size_t)r * W);
            break;
        }
    free(all);
}

void dp_describe(const dp_state *d, char *buf, size_t len) {
    buf[0] = 0;
    if (!d->active) return;
    char buckets[64] = " after the backward";
    if (d->n_buckets)
        snprintf(buckets, sizeof(buckets), " in %d bucket%s during the backward", d->n_buckets,
                 d->n_buckets == 1 ? "" : "s");
    snprintf(buf, len, "data parallel: %d rank%s (%s), gradients %s%s%s, amax all-reduce %s%s",
             d->size, d->size == 1 ? "" : "s", fp8t_dist_have_mpi() ? "MPI" : "no MPI",
             d->zero ? "reduce-scattered in FP32" : "all-reduced in ",
             d->zero ? "" : (d->bf16_reduce ? "BF16" : "FP32"), buckets,
             d->zero ? ", ZeRO-1 AdamW shards" : "", d->amax_reduce ? "on" : "off");
    if (d->size == 1) {
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, " (--dp-force)");
    }
}
