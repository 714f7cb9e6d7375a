/* gpu_test rows for the data-parallel collectives (src/backend/cuda/cuda_comm.cu) in a world
 * of one, which is what one GPU can check: the NCCL path (a real communicator of one rank, the
 * same calls as at N ranks) must leave every buffer as the plain path would, bit for bit, and
 * whole training runs through the data-parallel path (--dp-force, plain and ZeRO-1, the
 * gradients reduced at once or in buckets on the comm stream) must equal the plain run bit for
 * bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/backend.h"
#include "fp8train/fp8.h"
#include "fp8train/train.h"

static int *np_, *nf_;

static void drow(const char *op, const char *shape, double err, int ok, const char *note) {
    printf("%-34s %-24s %10.3e %9.1e  %s%s%s\n", op, shape, err, 0.0, ok ? "PASS" : "FAIL",
           note && *note ? "  " : "", note ? note : "");
    fflush(stdout);
    if (ok)
        (*np_)++;
    else
        (*nf_)++;
}

/* differing elements of two float arrays, bit for bit (any NaN equals any NaN: the device's
 * BF16 conversion may return another NaN payload than the host's) */
static size_t bit_diffs(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += !(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static void collectives(void) {
    char err[512];
    fp8t_backend *g = fp8t_backend_create("cuda", NULL, err, sizeof(err));
    if (!g) {
        drow("collectives: create", "-", 1, 0, err);
        return;
    }
    if (g->ops->comm_init(g, err, sizeof(err)) != 0) {
        drow("collectives: comm_init (NCCL, 1 rank)", "-", 1, 0, err);
        fp8t_backend_destroy(g);
        return;
    }
    const size_t sizes[] = {1, 1000, 1 << 20 | 3};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        float *ref = malloc(n * sizeof(float));
        uint64_t st = 0x1234567u + n;
        for (size_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = ldexpf((float)(int32_t)(st >> 32), -30); /* spread over many binades */
        }
        if (n > 10) x[7] = NAN, x[9] = -INFINITY;
        char shape[32];
        snprintf(shape, sizeof(shape), "n=%zu", n);
        float *d = g->ops->malloc(g, n * sizeof(float));
        size_t counts[1] = {n};
        struct {
            const char *name;
            int which;
        } cases[] = {{"allreduce sum fp32 (1 rank)", 0},
                     {"allreduce max (1 rank)", 1},
                     {"allreduce sum bf16 (1 rank)", 2},
                     {"reduce_scatter (1 rank)", 3},
                     {"all_gather (1 rank)", 4},
                     {"broadcast (1 rank)", 5},
                     /* the buckets: x in three pieces on the comm stream, one wait */
                     {"reduce_start fp32, 3 buckets", 6},
                     {"reduce_start bf16, 3 buckets", 7},
                     {"reduce_start scatter, 3 buckets", 8}};
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            g->ops->to_device(g, d, x, n * sizeof(float));
            memcpy(ref, x, n * sizeof(float));
            switch (cases[c].which) {
            case 0: g->ops->allreduce(g, d, n, FP8T_RED_SUM, 0); break;
            case 1: g->ops->allreduce(g, d, n, FP8T_RED_MAX, 0); break;
            case 2:
                g->ops->allreduce(g, d, n, FP8T_RED_SUM, 1);
                bf16_round(ref, x, n); /* a world of one: the BF16 rounding only */
                break;
            case 3: g->ops->reduce_scatter(g, d, counts); break;
            case 4: g->ops->all_gather(g, d, counts); break;
            case 5: g->ops->broadcast(g, d, n * sizeof(float), 0); break;
            default: {
                const int bf = cases[c].which == 7, rs = cases[c].which == 8;
                size_t cut[4] = {0, n / 3, n / 3 + n / 5, n};
                for (int k2 = 2; k2 >= 0; k2--) { /* from the end, as the backward finishes */
                    size_t part[1] = {cut[k2 + 1] - cut[k2]};
                    g->ops->reduce_start(g, d + cut[k2], part[0], rs ? part : NULL, bf);
                }
                g->ops->reduce_wait(g);
                if (bf) bf16_round(ref, x, n);
                break;
            }
            }
            g->ops->to_host(g, y, d, n * sizeof(float));
            size_t bad = bit_diffs(y, ref, n);
            char note[64] = "";
            if (bad) snprintf(note, sizeof(note), "%zu elements differ", bad);
            drow(cases[c].name, shape, (double)bad, bad == 0, note);
        }
        g->ops->free(g, d);
        free(x), free(y), free(ref);
    }
    fp8t_backend_destroy(g);
}

/* 6 steps of tiny on the GPU: plain, --dp-force, --dp-force --zero 1; metrics.jsonl equal */
static int run(const char *dir, int force, int zero, float bucket_mb, fp8t_train_result *res,
               char *err, size_t errlen) {
    fp8t_train_config c;
    fp8t_train_config_default(&c);
    snprintf(c.device, sizeof(c.device), "cuda");
    snprintf(c.out_dir, sizeof(c.out_dir), "%s", dir);
    c.steps = 6, c.batch = 4, c.seq_len = 64, c.grad_accum = 2, c.quiet = 1, c.val_every = 0;
    c.dp_force = force, c.zero = zero, c.bucket_mb = bucket_mb;
    return fp8t_train_run(&c, res, err, errlen);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}

/* metrics rows without the timing fields, which differ from run to run */
static void strip_timing(char *s) {
    const char *keys[] = {",\"tokens_per_s\":", ",\"elapsed_s\":"};
    for (int k = 0; k < 2; k++)
        for (char *p = strstr(s, keys[k]); p; p = strstr(p, keys[k])) {
            char *e = p + strlen(keys[k]);
            while (*e && *e != ',' && *e != '}') e++;
            memmove(p, e, strlen(e) + 1);
        }
}

static void training(void) {
    char tmpl[] = "/tmp/fp8t_gpu_dist.XXXXXX";
    if (!mkdtemp(tmpl)) {
        drow("dp training: mkdtemp", "-", 1, 0, "cannot create a temporary directory");
        return;
    }
    /* the default buckets (25 MiB: tiny's gradients in one, after the backward, on the comm
     * stream), no buckets, and one bucket per layer */
    enum { NR = 6 };
    const char *names[NR] = {"plain",
                             "dpforce",
                             "dpforce-zero1",
                             "dpforce-nobucket",
                             "dpforce-layer-buckets",
                             "dpforce-zero1-layer-buckets"};
    const float bucket_mb[NR] = {25, 25, 25, 0, 0.001f, 0.001f};
    const int zero[NR] = {0, 0, 1, 0, 0, 1};
    char *metrics[NR] = {NULL};
    for (int i = 0; i < NR; i++) {
        char dir[256], path[300], err[2048];
        snprintf(dir, sizeof(dir), "%s/%s", tmpl, names[i]);
        fp8t_train_result res;
        if (run(dir, i > 0, zero[i], bucket_mb[i], &res, err, sizeof(err)) != 0) {
            drow("dp training: run", names[i], 1, 0, err);
            continue;
        }
        snprintf(path, sizeof(path), "%s/metrics.jsonl", dir);
        metrics[i] = slurp(path);
        if (metrics[i]) strip_timing(metrics[i]);
    }
    for (int i = 1; i < NR; i++) {
        int ok = metrics[0] && metrics[i] && strcmp(metrics[0], metrics[i]) == 0;
        char op[64];
        snprintf(op, sizeof(op), "train tiny %s == plain", names[i]);
        drow(op, "6 steps, fp8", ok ? 0 : 1, ok,
             ok ? "losses and norms bit-identical" : "metrics differ");
    }
    for (int i = 0; i < NR; i++) free(metrics[i]);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl); /* only the directory made above */
    if (system(cmd) != 0) fprintf(stderr, "gpu_test: could not remove %s\n", tmpl);
}

void gpu_test_collectives(int *n_pass, int *n_fail) {
    np_ = n_pass, nf_ = n_fail;
    printf("== cuda: data-parallel collectives, world of one (NCCL path vs plain)\n");
    collectives();
    training();
}
