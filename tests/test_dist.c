/* The data-parallel building blocks in one process (the N = 2 runs are tests/test_dp.sh):
 *   - a process no launcher started is a world of one and its collectives are identities
 *     (BF16 all-reduce: exactly the BF16 rounding), through the dist layer and the CPU op table
 *   - fp8t_model_adamw_range over two shards with their own moment buffers gives the bits of
 *     one fp8t_model_adamw over everything (ZeRO-1's update equals the plain one), also when a
 *     shard boundary cuts a tensor and a run of decayed tensors */
#include <stdint.h>

#include "fp8train/backend.h"
#include "fp8train/dist.h"
#include "fp8train/fp8.h"
#include "fp8train/model.h"
#include "test.h"

static void test_world_of_one(void) {
    char err[512] = "";
    unsetenv("OMPI_COMM_WORLD_SIZE");
    T_ASSERT(fp8t_dist_init(err, sizeof(err)) == 0, "init: %s", err);
    T_CHECK(fp8t_dist_size() == 1 && fp8t_dist_rank() == 0, "size %d rank %d", fp8t_dist_size(),
            fp8t_dist_rank());
    float a[3] = {1.5f, -2.0f, 3.25f}, all[3];
    fp8t_dist_allgather(a, all, sizeof(a));
    T_CHECK(memcmp(a, all, sizeof(a)) == 0, "allgather of one rank copies");
    int flag[2] = {7, -3};
    fp8t_dist_allreduce_i32(flag, 2, FP8T_RED_MAX);
    T_CHECK(flag[0] == 7 && flag[1] == -3, "allreduce of one rank is the identity");
}

static void test_cpu_collectives_identity(void) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "%s", err);
    T_ASSERT(be->ops->comm_init(be, err, sizeof(err)) == 0, "%s", err);
    enum { N = 1001 };
    float *x = be->ops->malloc(be, N * sizeof(float)), ref[N];
    for (int i = 0; i < N; i++)
        ref[i] = ldexpf((float)((i * 2654435761u) % 100003) - 50000, -(i % 40));
    ref[5] = NAN;
    size_t counts[1] = {N};
    for (int c = 0; c < 5; c++) {
        memcpy(x, ref, sizeof(ref));
        if (c == 0) be->ops->allreduce(be, x, N, FP8T_RED_SUM, 0);
        if (c == 1) be->ops->allreduce(be, x, N, FP8T_RED_MAX, 0);
        if (c == 2) be->ops->reduce_scatter(be, x, counts);
        if (c == 3) be->ops->all_gather(be, x, counts);
        if (c == 4) be->ops->broadcast(be, x, N * sizeof(float), 0);
        T_CHECK(memcmp(x, ref, sizeof(ref)) == 0, "collective %d of one rank changed the data",
                c);
    }
    float r16[N];
    bf16_round(r16, ref, N);
    memcpy(x, ref, sizeof(ref));
    be->ops->allreduce(be, x, N, FP8T_RED_SUM, 1);
    T_CHECK(memcmp(x, r16, sizeof(r16)) == 0, "BF16 all-reduce of one rank = the BF16 rounding");
    be->ops->free(be, x);
    fp8t_backend_destroy(be);
}

/* ZeRO-1's AdamW: two shards (cut at odd places) with their own moments == one full update */
static void test_adamw_range_equals_full(void) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "%s", err);
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.seq_len = 16, c.vocab_size = 64,
    c.mlp_hidden = 64;
    fp8t_model *a = fp8t_model_create(be, &c, NULL, NULL, 2, 8, err, sizeof(err));
    fp8t_model *b = fp8t_model_create(be, &c, NULL, NULL, 2, 8, err, sizeof(err));
    T_ASSERT(a && b, "%s", err);
    fp8t_model_init_weights(a, 7);
    fp8t_model_init_weights(b, 7);
    size_t n = fp8t_model_num_params(a);
    float *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) g[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
    memcpy(fp8t_model_grads(a), g, n * sizeof(float));
    memcpy(fp8t_model_grads(b), g, n * sizeof(float));
    /* shards: [0, cut) and [cut, n), cut inside a tensor */
    const size_t cut = n / 3 + 5;
    float *m0 = calloc(cut, sizeof(float)), *v0 = calloc(cut, sizeof(float));
    float *m1 = calloc(n - cut, sizeof(float)), *v1 = calloc(n - cut, sizeof(float));
    for (int t = 1; t <= 3; t++) {
        fp8t_model_adamw(a, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f, 2.5f);
        fp8t_model_adamw_range(b, m0, v0, 0, cut, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f, 2.5f);
        fp8t_model_adamw_range(b, m1, v1, cut, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f, 2.5f);
    }
    T_CHECK(memcmp(fp8t_model_params(a), fp8t_model_params(b), n * sizeof(float)) == 0,
            "weights after 3 sharded AdamW steps differ from the full update");
    T_CHECK(memcmp(fp8t_model_adam_m(a), m0, cut * sizeof(float)) == 0 &&
                memcmp(fp8t_model_adam_m(a) + cut, m1, (n - cut) * sizeof(float)) == 0 &&
                memcmp(fp8t_model_adam_v(a) + cut, v1, (n - cut) * sizeof(float)) == 0,
            "sharded moments differ from the full ones");
    fp8t_model_release_adam(b);
    T_CHECK(fp8t_model_adam_m(b) == NULL && fp8t_model_adam_v(b) == NULL, "moments released");
    free(g), free(m0), free(v0), free(m1), free(v1);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
    fp8t_backend_destroy(be);
}

/* The buckets' ops in a world of one: x cut in three, started from the end, one wait: the
 * identity (BF16: exactly the rounding), as the blocking collectives */
static void test_cpu_buckets_identity(void) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "%s", err);
    T_ASSERT(be->ops->comm_init(be, err, sizeof(err)) == 0, "%s", err);
    enum { N = 1001 };
    float *x = be->ops->malloc(be, N * sizeof(float)), ref[N], r16[N];
    for (int i = 0; i < N; i++)
        ref[i] = ldexpf((float)((i * 2654435761u) % 100003) - 50000, -(i % 40));
    bf16_round(r16, ref, N);
    const size_t cut[4] = {0, 300, 301, N};
    for (int c = 0; c < 3; c++) { /* fp32, bf16, reduce-scatter */
        memcpy(x, ref, sizeof(ref));
        for (int k = 2; k >= 0; k--) {
            size_t part[1] = {cut[k + 1] - cut[k]};
            be->ops->reduce_start(be, x + cut[k], part[0], c == 2 ? part : NULL, c == 1);
        }
        be->ops->reduce_wait(be);
        T_CHECK(memcmp(x, c == 1 ? r16 : ref, sizeof(ref)) == 0,
                "bucketed reduction %d of one rank: not the blocking op's result", c);
    }
    be->ops->free(be, x);
    fp8t_backend_destroy(be);
}

/* The backward's grads_ready: layers n_layer, n_layer-1, ..., 0, -1 in that order, and from
 * each report on the gradients of that layer to the end of the table never change again (what
 * lets a bucket's reduction start there). Checked on both architectures and a tied and an
 * untied head, gradients accumulated over two micro-batches. */
typedef struct {
    fp8t_model *m;
    const fp8t_param_info *info;
    int n_info;
    float *snap; /* [n] the gradients as they were when each position was reported final */
    int order[16], n_calls;
} ready_log;

static void on_ready(void *ctx, int layer) {
    ready_log *r = ctx;
    if (r->n_calls < 16) r->order[r->n_calls] = layer;
    r->n_calls++;
    /* the first float of the layer's tensors (or of those after the blocks: layer n_layer) */
    size_t from = 0;
    if (layer >= 0) {
        from = SIZE_MAX;
        for (int i = 0; i < r->n_info; i++)
            if (r->info[i].layer == layer && r->info[i].offset < from) from = r->info[i].offset;
        if (from == SIZE_MAX) { /* layer n_layer: past the last block's tensors */
            from = 0;
            for (int i = 0; i < r->n_info; i++)
                if (r->info[i].layer >= 0 && r->info[i].offset + r->info[i].numel > from)
                    from = r->info[i].offset + r->info[i].numel;
        }
    }
    size_t n = fp8t_model_num_params(r->m);
    memcpy(r->snap + from, fp8t_model_grads(r->m) + from, (n - from) * sizeof(float));
}

static void test_grads_ready(void) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "%s", err);
    for (int variant = 0; variant < 2; variant++) {
        fp8t_model_config c;
        fp8t_model_preset(&c, variant ? "tiny-llama" : "tiny");
        c.n_layer = 3, c.n_embd = 32, c.n_head = 2, c.seq_len = 16, c.vocab_size = 64,
        c.mlp_hidden = 64;
        if (variant) c.n_kv_head = 1, c.untied_head = 1;
        fp8t_model *m = fp8t_model_create(be, &c, NULL, NULL, 2, 8, err, sizeof(err));
        T_ASSERT(m, "%s", err);
        fp8t_model_init_weights(m, 3);
        fp8t_param_info info[FP8T_MAX_PARAM_TENSORS];
        int count = fp8t_model_param_table(&c, info, NULL);
        const size_t n = fp8t_model_num_params(m);
        ready_log r = {.m = m, .info = info, .n_info = count};
        r.snap = malloc(n * sizeof(float));
        int tok[16], tgt[16];
        fp8t_model_zero_grad(m);
        for (int mb = 0; mb < 2; mb++) {
            for (int i = 0; i < 16; i++)
                tok[i] = (i * 7 + mb) % 64, tgt[i] = (i * 5 + 3 * mb) % 64;
            fp8t_model_forward(m, tok, tgt);
            if (mb == 1) fp8t_model_set_grads_ready(m, on_ready, &r);
            fp8t_model_backward(m, 0.5f);
        }
        fp8t_model_set_grads_ready(m, NULL, NULL);
        int want[5] = {3, 2, 1, 0, -1}, same_order = r.n_calls == 5;
        for (int i = 0; same_order && i < 5; i++) same_order = r.order[i] == want[i];
        T_CHECK(same_order, "%s: %d reports, first %d", variant ? "llama" : "gpt2", r.n_calls,
                r.order[0]);
        T_CHECK(memcmp(r.snap, fp8t_model_grads(m), n * sizeof(float)) == 0,
                "%s: a gradient changed after its layer was reported final",
                variant ? "llama" : "gpt2");
        free(r.snap);
        fp8t_model_destroy(m);
    }
    fp8t_backend_destroy(be);
}

int main(void) {
    t_suite = "dist";
    T_RUN(test_world_of_one);
    T_RUN(test_cpu_collectives_identity);
    T_RUN(test_adamw_range_equals_full);
    T_RUN(test_cpu_buckets_identity);
    T_RUN(test_grads_ready);
    T_MAIN_END();
}
