/* The inspector and the NaN tracker on a real model (tiny GPT-2 on the CPU backend):
 * selection by step/layer/module/GEMM/tensor, statistics equal to the numerics library's on
 * the dumped data, scales from the recipe state, .npy dumps that parse and round-trip, block
 * statistics, micro-batches, and NaN/Inf provenance with a hook that poisons one tensor. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fp8train/debug.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "fp8train/model.h"
#include "fp8train/profile.h"
#include "fp8train/recipe.h"
#include "fp8train/stats.h"
#include "test.h"

#define B 2
#define T 16

static char g_root[256];
static size_t g_dump_budget; /* 0: the inspector's default */

/* x [rows, cols] through 1x128 blocks and back (the block quantizer of recipe.h) */
static void block128_image(float *out, const float *x, int rows, int cols, fp8_format fmt) {
    size_t n = (size_t)rows * cols;
    uint8_t *codes = malloc(n);
    float *sc = malloc((size_t)rows * (size_t)((cols + 127) / 128) * sizeof(float));
    fp8t_block_quantize(codes, sc, x, rows, cols, 1, 128, fmt);
    fp8t_block_dequantize(out, codes, sc, rows, cols, 1, 128, fmt);
    free(codes);
    free(sc);
}
static int g_hist_len = 16; /* the amax history length of the next tiny_open */
static unsigned g_disable;  /* the model options' disable bits of the next tiny_open */
static int g_profiled;      /* the next tiny_open's backend wrapped by the op profiler */
static int g_head_chunk;    /* the next tiny_open's head_chunk option (0: auto) */
static int g_vocab;         /* the vocabulary of the next tiny_open (0: the preset's) */

typedef struct {
    fp8t_backend *be;
    fp8t_model *m;
    int tokens[B * T], targets[B * T];
} tiny;

static int tiny_open(tiny *t) {
    char err[512];
    memset(t, 0, sizeof(*t));
    t->be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (t->be && g_profiled) t->be = fp8t_profile_wrap(t->be);
    if (!t->be) {
        printf("  backend: %s\n", err);
        return -1;
    }
    fp8t_model_config cfg;
    fp8t_model_preset(&cfg, "tiny");
    cfg.n_layer = 3;
    if (g_vocab > 0) cfg.vocab_size = g_vocab;
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.history_len = g_hist_len;
    const fp8t_model_options opt = {.disable = g_disable, .head_chunk = g_head_chunk};
    t->m = fp8t_model_create(t->be, &cfg, &pol, &opt, B, T, err, sizeof(err));
    if (!t->m) {
        printf("  model: %s\n", err);
        fp8t_backend_destroy(t->be);
        return -1;
    }
    fp8t_model_init_weights(t->m, 1234);
    for (int i = 0; i < B * T; i++) {
        t->tokens[i] = (i * 37 + 11) % cfg.vocab_size;
        t->targets[i] = (i * 53 + 7) % cfg.vocab_size;
    }
    return 0;
}

static void tiny_close(tiny *t) {
    fp8t_model_destroy(t->m);
    fp8t_backend_destroy(t->be);
}

/* One optimizer step of `micro` micro-batches (no weight update: the statistics are what
 * matters here, and the delayed scales still move through fp8t_model_end_step). */
static float tiny_step_ex(tiny *t, int micro, void (*before_update)(void *, fp8t_model *),
                          void *ctx) {
    float loss = 0;
    fp8t_model_zero_grad(t->m);
    for (int k = 0; k < micro; k++) {
        loss += fp8t_model_forward(t->m, t->tokens, t->targets) / micro;
        fp8t_model_backward(t->m, 1.0f / micro);
    }
    if (before_update) before_update(ctx, t->m);
    fp8t_model_end_step(t->m);
    return loss;
}

static float tiny_step(tiny *t, int micro) { return tiny_step_ex(t, micro, NULL, NULL); }

/* ---- inspector ---- */

typedef struct {
    fp8t_inspector *in;
    int step;
    /* what the test itself reads from the recipe state for layer 1 fc2 fprop input */
    float expect_scale[8];
    double expect_hist_max[8]; /* the amax the step's delayed scale came from */
    int fp8_index;
} inspect_ctx;

static void inspect_hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    inspect_ctx *c = vctx;
    if (s->layer == 1 && s->module == FP8T_MOD_FC2 && s->gemm == FP8T_GEMM_FPROP &&
        s->kind == FP8T_T_INPUT && c->step < 8) {
        int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
        size_t floats = fp8t_recipe_state_floats(n, len);
        float *st = malloc(floats * sizeof(float));
        fp8t_backend *be = fp8t_model_backend(m);
        be->ops->to_host(be, st, fp8t_model_fp8_state(m), floats * sizeof(float));
        fp8t_recipe_state rs;
        fp8t_recipe_state_view(&rs, st, n, len);
        if (c->expect_scale[c->step] == 0) { /* first micro-batch */
            c->expect_scale[c->step] = rs.scale[s->fp8_index];
            c->fp8_index = s->fp8_index;
        }
        free(st);
    }
    fp8t_inspector_observe(c->in, m, s, x);
}

/* Before the scale update of step c->step: the amax the update will compute the scale of the
 * next step from (max over the whole history, slot 0 = this step), read here independently,
 * then the inspector's own note of it. */
static void inspect_before_update(void *vctx, fp8t_model *m) {
    inspect_ctx *c = vctx;
    int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    size_t floats = fp8t_recipe_state_floats(n, len);
    float *st = malloc(floats * sizeof(float));
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_host(be, st, fp8t_model_fp8_state(m), floats * sizeof(float));
    if (c->fp8_index >= 0 && c->step + 1 < 8) {
        double mx = 0;
        for (int i = 0; i < len; i++) mx = fmax(mx, st[(size_t)i * n + c->fp8_index]);
        c->expect_hist_max[c->step + 1] = mx;
    }
    free(st);
    fp8t_inspector_before_scale_update(c->in, m, c->step);
}

static cJSON **read_rows(const char *path, int *n) {
    char *text, err[256];
    size_t len;
    *n = 0;
    if (fp8t_read_file(path, &text, &len, err, sizeof(err))) return NULL;
    cJSON **rows = malloc(sizeof(cJSON *) * 4096);
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && *n < 4096;
         line = strtok_r(NULL, "\n", &save))
        rows[(*n)++] = cJSON_Parse(line);
    free(text);
    return rows;
}

static void free_rows(cJSON **rows, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    free(rows);
}

static double num(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(it) ? it->valuedouble : NAN;
}
static const char *str(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(it) ? it->valuestring : "";
}

/* Parse a .npy header by hand (not through fp8t_npy_read) and return the data offset. */
static long npy_header(const unsigned char *buf, size_t len, char *dict, size_t dlen) {
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0 || buf[6] != 1 || buf[7] != 0) return -1;
    size_t hl = (size_t)buf[8] | (size_t)buf[9] << 8;
    if (10 + hl > len || ((10 + hl) % 16 != 0 && (10 + hl) % 64 != 0)) return -1;
    snprintf(dict, dlen, "%.*s", (int)hl, (const char *)buf + 10);
    return (long)(10 + hl);
}

static int exact(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static void check_stats_equal(const cJSON *row, const fp8t_stats *s, int operand,
                              const char *what) {
    const char *keys[] = {"min", "max", "mean", "std", "l1", "l2", "amax", "dynamic_range"};
    double vals[] = {s->min, s->max, s->mean, s->std, s->l1, s->l2, s->amax, s->dynamic_range};
    for (int k = 0; k < 8; k++)
        T_CHECK(exact(num(row, keys[k]), vals[k]), "%s %s: json %.17g numerics %.17g", what,
                keys[k], num(row, keys[k]), vals[k]);
    if (operand) {
        const char *ek[] = {"underflow_pct", "saturation_pct", "mse", "cosine", "sqnr_db"};
        double ev[] = {s->underflow_pct, s->saturation_pct, s->mse, s->cosine, s->sqnr_db};
        for (int k = 0; k < 5; k++)
            T_CHECK(exact(num(row, ek[k]), ev[k]), "%s %s: json %.17g numerics %.17g", what,
                    ek[k], num(row, ek[k]), ev[k]);
    } else {
        T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(row, "cosine")) &&
                    cJSON_IsNull(cJSON_GetObjectItem(row, "scale")),
                "%s: a result has error statistics", what);
    }
    T_CHECK(num(row, "n_nan") == (double)s->n_nan && num(row, "n_inf") == (double)s->n_inf,
            "%s: non-finite counts", what);
}

static void test_inspect_selection_stats_and_dumps(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    char out[400], err[512];
    static int run_no; /* run twice (two dump budgets): a fresh directory each */
    snprintf(out, sizeof(out), "%s/inspect1_%d", g_root, run_no++);
    inspect_ctx c = {0};
    c.in = fp8t_inspector_create("every=2,start=1,end=3,layers=1+head,modules=fc2+head,"
                                 "gemms=fprop+dgrad,tensors=input+grad_output+output,dump=1,"
                                 "block=32",
                                 out, err, sizeof(err));
    T_ASSERT(c.in, "create: %s", err);
    fp8t_inspector_set_dump_budget(c.in, g_dump_budget);
    c.fp8_index = -1;
    fp8t_model_set_hook(t.m, inspect_hook, &c);
    for (int step = 0; step < 5; step++) {
        c.step = step;
        fp8t_inspector_begin_step(c.in, step);
        tiny_step_ex(&t, 2, inspect_before_update, &c);
        fp8t_inspector_end_step(c.in, step);
    }
    fp8t_inspector_destroy(c.in);

    char path[600];
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    int n;
    cJSON **rows = read_rows(path, &n);
    T_ASSERT(rows, "no stats.jsonl");
    /* steps 1 and 3; sites per step: (layer 1 fc2, head) x (fprop input, fprop output,
     * dgrad grad_output) = 6; first micro-batch only */
    T_CHECK(n == 12, "%d rows, expected 12", n);
    int per_step[5] = {0}, checked_operands = 0, checked_results = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *r = rows[i];
        T_ASSERT(r, "row %d does not parse", i);
        int step = (int)num(r, "step"), layer = (int)num(r, "layer");
        if (step >= 0 && step < 5) per_step[step]++;
        T_CHECK(num(r, "micro") == 0, "micro %g", num(r, "micro"));
        const char *module = str(r, "module"), *gemm = str(r, "gemm"), *tensor = str(r, "tensor");
        T_CHECK((layer == 1 && !strcmp(module, "fc2")) ||
                    (layer == -1 && !strcmp(module, "head")),
                "site layer %d %s", layer, module);
        T_CHECK(strcmp(gemm, "wgrad") != 0 && strcmp(tensor, "weight") != 0 &&
                    strcmp(tensor, "dgrad") != 0,
                "unselected %s %s", gemm, tensor);
        /* the dump of this site */
        char name[128], f[900];
        snprintf(name, sizeof(name), "%s.%s.%s.%s", layer < 0 ? "head" : "1", module, gemm,
                 tensor);
        snprintf(f, sizeof(f), "%s/dumps/step_%06d/%s.npy", out, step, name);
        char *raw;
        size_t rawlen;
        T_ASSERT(fp8t_read_file(f, &raw, &rawlen, err, sizeof(err)) == 0, "%s", err);
        char dict[256];
        long off = npy_header((const unsigned char *)raw, rawlen, dict, sizeof(dict));
        int rows_ = (int)num(r, "rows"), cols = (int)num(r, "cols");
        char shape[64];
        snprintf(shape, sizeof(shape), "'shape': (%d, %d)", rows_, cols);
        T_CHECK(off > 0 && strstr(dict, "'descr': '<f4'") &&
                    strstr(dict, "'fortran_order': False") && strstr(dict, shape) &&
                    (size_t)off + (size_t)rows_ * cols * 4 == rawlen,
                "%s header: %s", name, dict);
        char descr[16];
        int ndim;
        int64_t sh[8];
        void *data;
        size_t nbytes;
        T_ASSERT(fp8t_npy_read(f, descr, &ndim, sh, &data, &nbytes, err, sizeof(err)) == 0, "%s",
                 err);
        T_CHECK(ndim == 2 && sh[0] == rows_ && sh[1] == cols && !strcmp(descr, "<f4") &&
                    nbytes == (size_t)rawlen - (size_t)off && !memcmp(data, raw + off, nbytes),
                "%s: npy round trip", name);
        const float *x = data;
        size_t count = (size_t)rows_ * cols;
        int operand = strcmp(tensor, "output") != 0;
        fp8t_stats s;
        if (operand) {
            float scale = (float)num(r, "scale");
            fp8_format fmt = !strcmp(str(r, "fmt"), "e5m2") ? FP8_E5M2 : FP8_E4M3;
            T_CHECK(!strcmp(tensor, "grad_output") == (fmt == FP8_E5M2), "hybrid format %s",
                    str(r, "fmt"));
            fp8t_fp8_stats(&s, x, count, scale, fmt);
            check_stats_equal(r, &s, 1, name);
            /* raw codes and scale_inv */
            snprintf(f, sizeof(f), "%s/dumps/step_%06d/%s.fp8.npy", out, step, name);
            void *codes;
            T_ASSERT(fp8t_npy_read(f, descr, &ndim, sh, &codes, &nbytes, err, sizeof(err)) == 0,
                     "%s", err);
            uint8_t *expect = malloc(count);
            fp8_quantize(expect, x, count, scale, fmt, 1);
            T_CHECK(!strcmp(descr, "|u1") && nbytes == count && !memcmp(codes, expect, count),
                    "%s: fp8 codes", name);
            free(expect);
            free(codes);
            snprintf(f, sizeof(f), "%s/dumps/step_%06d/%s.scale_inv.npy", out, step, name);
            void *si;
            T_ASSERT(fp8t_npy_read(f, descr, &ndim, sh, &si, &nbytes, err, sizeof(err)) == 0,
                     "%s", err);
            T_CHECK(nbytes == 4 && ndim == 1 && sh[0] == 1 &&
                        *(float *)si == (float)num(r, "scale_inv"),
                    "%s: scale_inv", name);
            free(si);
            /* block statistics: worst block SQNR equals the numerics library's */
            size_t nb = (count + 31) / 32;
            fp8t_stats *bs = malloc(nb * sizeof(fp8t_stats));
            fp8t_block_fp8_stats(bs, x, count, 32, scale, fmt);
            double worst = INFINITY;
            for (size_t k = 0; k < nb; k++) worst = fmin(worst, bs[k].sqnr_db);
            T_CHECK(num(r, "n_blocks") == (double)nb && exact(num(r, "block_sqnr_min_db"), worst),
                    "%s: blocks %g worst %g vs %g", name, num(r, "n_blocks"),
                    num(r, "block_sqnr_min_db"), worst);
            free(bs);
            /* what-if: per-tensor current scaling in E5M2 and 1x128 blocks in E4M3, from the
             * numerics library on the dumped data */
            const cJSON *wi = cJSON_GetObjectItem(r, "whatif");
            const cJSON *wc = cJSON_GetObjectItem(wi, "current_e5m2");
            const cJSON *wb = cJSON_GetObjectItem(wi, "block128_e4m3");
            T_ASSERT(wc && wb && cJSON_GetObjectItem(wi, "current_e4m3") &&
                         cJSON_GetObjectItem(wi, "block128_e5m2"),
                     "%s: whatif fields missing", name);
            T_CHECK(!cJSON_GetObjectItem(wi, "mxfp8") && cJSON_GetArraySize(wi) == 4,
                    "%s: the MXFP8 what-if without whatif=all", name);
            fp8t_stats w;
            fp8t_fp8_stats(&w, x, count, fp8t_current_scale(fp8_amax(x, count), 57344.0f, 0, 0),
                           FP8_E5M2);
            T_CHECK(num(wc, "underflow_pct") == w.underflow_pct &&
                        num(wc, "saturation_pct") == w.saturation_pct &&
                        fabs(num(wc, "sqnr_db") - w.sqnr_db) < 1e-9,
                    "%s: whatif current_e5m2 %g %g %g vs %g %g %g", name,
                    num(wc, "underflow_pct"), num(wc, "saturation_pct"), num(wc, "sqnr_db"),
                    w.underflow_pct, w.saturation_pct, w.sqnr_db);
            {
                float *img = malloc(count * sizeof(float));
                block128_image(img, x, rows_, cols, FP8_E4M3);
                fp8t_compare_stats(&w, x, img, count);
                size_t nz = 0, un = 0;
                for (size_t k = 0; k < count; k++)
                    if (isfinite(x[k]) && x[k] != 0) nz++, un += img[k] == 0;
                T_CHECK(fabs(num(wb, "sqnr_db") - w.sqnr_db) < 1e-9 &&
                            num(wb, "underflow_pct") ==
                                (nz ? 100.0 * (double)un / (double)nz : 0) &&
                            num(wb, "saturation_pct") == 0,
                        "%s: whatif block128_e4m3 sqnr %g vs %g", name, num(wb, "sqnr_db"),
                        w.sqnr_db);
                free(img);
            }
            /* the scale is the recipe state's (delayed) for layer 1 fc2, bf16 head too */
            T_CHECK(!strcmp(str(r, "scale_source"), "delayed"), "scale source %s",
                    str(r, "scale_source"));
            if (layer == 1 && !strcmp(gemm, "fprop")) {
                T_CHECK((float)num(r, "scale") == c.expect_scale[step] &&
                            exact(num(r, "amax_history_max"), c.expect_hist_max[step]),
                        "step %d scale %g vs state %g, hist %g vs %g", step, num(r, "scale"),
                        c.expect_scale[step], num(r, "amax_history_max"),
                        c.expect_hist_max[step]);
                if (step == 3)
                    T_CHECK(num(r, "scale") != 1.0 && num(r, "amax_history_max") > 0,
                            "step 3 scale still the initial one: %g", num(r, "scale"));
                /* what the field means: the current scale is the delayed-scaling formula of
                 * that amax (margin 0) */
                T_CHECK((float)num(r, "scale") ==
                            fp8t_delayed_scale((float)num(r, "amax_history_max"), 1.0f,
                                               fp8_format_max(fmt), 0),
                        "step %d: scale %.9g is not fp8_max / amax_history_max %.9g", step,
                        num(r, "scale"), num(r, "amax_history_max"));
            }
            checked_operands++;
        } else {
            fp8t_tensor_stats(&s, x, count);
            check_stats_equal(r, &s, 0, name);
            checked_results++;
        }
        T_CHECK(!strcmp(str(r, "precision"), layer < 0 ? "bf16" : "delayed"), "precision %s",
                str(r, "precision"));
        free(data);
        free(raw);
    }
    T_CHECK(per_step[0] == 0 && per_step[1] == 6 && per_step[2] == 0 && per_step[3] == 6 &&
                per_step[4] == 0,
            "rows per step %d %d %d %d %d", per_step[0], per_step[1], per_step[2], per_step[3],
            per_step[4]);
    T_CHECK(checked_operands == 8 && checked_results == 4, "operands %d results %d",
            checked_operands, checked_results);
    snprintf(path, sizeof(path), "%s/dumps/step_000002", out);
    T_CHECK(access(path, F_OK) != 0, "dumps of an unselected step");
    free_rows(rows, n);
    tiny_close(&t);
}

static void hook_observe_only(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    fp8t_inspector_observe((fp8t_inspector *)ctx, m, s, x);
}

static void test_inspect_micro_all_and_current_scaling(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    fp8t_policy pol = *fp8t_model_get_policy(t.m);
    char err[512], out[400];
    T_ASSERT(fp8t_policy_add_overrides(&pol, "layers=0,module=qkv,gemm=fprop,precision=current",
                                       err, sizeof(err)) == 0,
             "%s", err);
    fp8t_model_set_policy(t.m, &pol);
    snprintf(out, sizeof(out), "%s/inspect2", g_root);
    fp8t_inspector *in = fp8t_inspector_create(
        "micro=all,layers=0,modules=qkv,gemms=fprop,tensors=input", out, err, sizeof(err));
    T_ASSERT(in, "%s", err);
    fp8t_model_set_hook(t.m, hook_observe_only, in);
    fp8t_inspector_begin_step(in, 0);
    tiny_step(&t, 3);
    fp8t_inspector_end_step(in, 0);
    fp8t_inspector_destroy(in);
    char path[600];
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    int n;
    cJSON **rows = read_rows(path, &n);
    T_ASSERT(rows && n == 3, "%d rows, expected one per micro-batch", n);
    for (int i = 0; i < n; i++) {
        T_CHECK(num(rows[i], "micro") == i, "micro %g", num(rows[i], "micro"));
        T_CHECK(!strcmp(str(rows[i], "precision"), "current") &&
                    !strcmp(str(rows[i], "scale_source"), "current"),
                "precision %s source %s", str(rows[i], "precision"),
                str(rows[i], "scale_source"));
        /* current scaling: scale = 448 / amax of this tensor */
        T_CLOSE(num(rows[i], "scale"),
                fp8t_current_scale((float)num(rows[i], "amax"), 448.0f, 0, 0), 0, 1e-7);
        T_CHECK(num(rows[i], "saturation_pct") == 0, "current scaling saturated");
    }
    free_rows(rows, n);
    tiny_close(&t);
}

/* Block and rowwise operands carry their own tiles' statistics: the tile shape of the GEMM
 * (block: 1x128 along K, 128x1 for the Wgrad, 128x128 weights; rowwise: a whole K-major row),
 * the tile count, and the worst tile, which can only be worse than the tensor as a whole
 * (sum xx / sum err >= min over tiles of xx_t / err_t; the largest underflow >= the mean);
 * per-tensor rows have none. */
static void test_inspect_tile_stats(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    fp8t_policy pol = *fp8t_model_get_policy(t.m);
    char err[512], out[400];
    T_ASSERT(fp8t_policy_add_overrides(&pol,
                                       "layers=1,precision=block;layers=2,precision=rowwise", err,
                                       sizeof(err)) == 0,
             "%s", err);
    fp8t_model_set_policy(t.m, &pol);
    snprintf(out, sizeof(out), "%s/inspect_tiles", g_root);
    fp8t_inspector *in = fp8t_inspector_create("tensors=operands", out, err, sizeof(err));
    T_ASSERT(in, "%s", err);
    fp8t_model_set_hook(t.m, hook_observe_only, in);
    fp8t_inspector_begin_step(in, 0);
    tiny_step(&t, 1);
    fp8t_inspector_end_step(in, 0);
    fp8t_inspector_destroy(in);
    fp8t_model_set_hook(t.m, NULL, NULL);
    char path[600];
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    int n, with = 0, bad = 0;
    cJSON **rows = read_rows(path, &n);
    T_ASSERT(rows && n > 0, "no rows");
    for (int i = 0; i < n; i++) {
        const cJSON *r = rows[i];
        const int layer = (int)num(r, "layer");
        const char *g = str(r, "gemm"), *k = str(r, "tensor");
        const int scaled = layer == 1 || layer == 2;
        if (!scaled) {
            bad += cJSON_GetObjectItem(r, "n_tiles") != NULL;
            continue;
        }
        with++;
        const double rows_ = num(r, "rows"), cols = num(r, "cols");
        const int weight = !strcmp(k, "weight");
        const int k_rows = !strcmp(g, "wgrad") || (weight && !strcmp(g, "dgrad"));
        double tr, tc;
        if (layer == 2)
            tr = k_rows ? rows_ : 1, tc = k_rows ? 1 : cols;
        else if (weight)
            tr = tc = 128;
        else
            tr = k_rows ? 128 : 1, tc = k_rows ? 1 : 128;
        const double nt = ceil(rows_ / tr) * ceil(cols / tc);
        const int ok =
            num(r, "tile_r") == tr && num(r, "tile_c") == tc && num(r, "n_tiles") == nt &&
            num(r, "tile_sqnr_min_db") <= num(r, "sqnr_db") + 1e-9 &&
            num(r, "tile_underflow_max_pct") >= num(r, "underflow_pct") - 1e-12 &&
            num(r, "tile_sqnr_min_index") < nt && num(r, "tile_underflow_max_index") < nt &&
            !strcmp(str(r, "scale_source"), layer == 1 ? "block" : "rowwise");
        if (!ok && !bad)
            printf(
                "  layer %d %s %s %s: tile %gx%g (want %gx%g), %g tiles, worst %g dB (tensor %g), "
                "underflow %g (tensor %g)\n",
                layer, str(r, "module"), g, k, num(r, "tile_r"), num(r, "tile_c"), tr, tc,
                num(r, "n_tiles"), num(r, "tile_sqnr_min_db"), num(r, "sqnr_db"),
                num(r, "tile_underflow_max_pct"), num(r, "underflow_pct"));
        bad += !ok;
    }
    /* layers 1 and 2: 4 linears x 3 GEMMs x 2 operands each */
    T_CHECK(with == 2 * 4 * 3 * 2 && bad == 0, "%d block/rowwise rows, %d wrong", with, bad);
    free_rows(rows, n);
    tiny_close(&t);
}

static void test_inspect_off_and_spec_errors(void) {
    char err[512], out[400];
    snprintf(out, sizeof(out), "%s/inspect3", g_root);
    const char *bad[] = {"bogus=1",   "every=0",       "layers=3-1", "modules=fc9", "gemms=fwd",
                         "tensors=x", "end=2,start=5", "micro=some", "dump",        "whatif=mx"};
    const char *word[] = {"bogus", "every",  "layers", "fc9",       "fwd",
                          "'x'",   "before", "micro",  "key=value", "whatif=mx: expected"};
    for (int i = 0; i < 10; i++) {
        err[0] = 0;
        fp8t_inspector *in = fp8t_inspector_create(bad[i], out, err, sizeof(err));
        T_CHECK(!in && strstr(err, word[i]), "spec '%s': %s", bad[i], err);
        fp8t_inspector_destroy(in);
    }
    /* outside the selected steps nothing is computed or written */
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    fp8t_inspector *in = fp8t_inspector_create("start=5", out, err, sizeof(err));
    T_ASSERT(in, "%s", err);
    fp8t_model_set_hook(t.m, hook_observe_only, in);
    for (int step = 0; step < 2; step++) {
        fp8t_inspector_begin_step(in, step);
        tiny_step(&t, 1);
        fp8t_inspector_end_step(in, step);
    }
    fp8t_inspector_destroy(in);
    char path[600], *text;
    size_t len;
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    T_CHECK(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0 && len == 0, "%zu bytes",
            len);
    free(text);
    /* a NULL inspector is a no-op */
    fp8t_inspector_begin_step(NULL, 0);
    fp8t_inspector_end_step(NULL, 0);
    tiny_close(&t);
}

/* ---- NaN provenance ---- */

typedef struct {
    fp8t_nan_tracker *tr;
    int layer;
    fp8t_module module;
    fp8t_gemm_kind gemm;
    fp8t_tensor_kind kind;
    float value; /* NaN or Inf */
    int armed;
} nan_ctx;

static void nan_hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    nan_ctx *c = vctx;
    if (c->armed && s->layer == c->layer && s->module == c->module && s->gemm == c->gemm &&
        s->kind == c->kind) {
        fp8t_backend *be = fp8t_model_backend(m);
        be->ops->to_device(be, x + 5, &c->value, sizeof(float));
        c->armed = 0;
    }
    fp8t_nan_tracker_observe(c->tr, m, s, x);
}

static void nan_case(tiny *t, int layer, fp8t_module mod, fp8t_gemm_kind g, fp8t_tensor_kind k,
                     float value, const char *expect) {
    nan_ctx c = {fp8t_nan_tracker_create(), layer, mod, g, k, value, 1};
    fp8t_model_set_hook(t->m, nan_hook, &c);
    fp8t_nan_tracker_begin_step(c.tr, 7);
    tiny_step(t, 1);
    char buf[160];
    int found = fp8t_nan_tracker_first(c.tr, buf, sizeof(buf));
    T_CHECK(found && !strcmp(buf, expect), "expected '%s', got %d '%s'", expect, found, buf);
    /* the next step starts clean */
    fp8t_nan_tracker_begin_step(c.tr, 8);
    T_CHECK(!fp8t_nan_tracker_first(c.tr, buf, sizeof(buf)) && buf[0] == 0, "not reset");
    fp8t_model_set_hook(t->m, NULL, NULL);
    fp8t_nan_tracker_destroy(c.tr);
}

static void test_nan_tracker_names_the_poisoned_tensor(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    /* a clean step: nothing */
    nan_ctx c = {fp8t_nan_tracker_create(), 0, 0, 0, 0, 0, 0};
    fp8t_model_set_hook(t.m, nan_hook, &c);
    fp8t_nan_tracker_begin_step(c.tr, 0);
    tiny_step(&t, 1);
    char buf[160] = "x";
    T_CHECK(!fp8t_nan_tracker_first(c.tr, buf, sizeof(buf)) && !buf[0], "clean step: %s", buf);
    fp8t_nan_tracker_destroy(c.tr);
    nan_case(&t, 2, FP8T_MOD_FC1, FP8T_GEMM_FPROP, FP8T_T_INPUT, NAN,
             "layer 2 fc1 fprop input (forward)");
    nan_case(&t, 0, FP8T_MOD_QKV, FP8T_GEMM_FPROP, FP8T_T_OUTPUT, INFINITY,
             "layer 0 qkv fprop output (forward)");
    nan_case(&t, 1, FP8T_MOD_PROJ, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT, NAN,
             "layer 1 proj dgrad grad_output (backward)");
    nan_case(&t, 1, FP8T_MOD_FC2, FP8T_GEMM_WGRAD, FP8T_T_WGRAD, -INFINITY,
             "layer 1 fc2 wgrad wgrad (backward)");
    nan_case(&t, -1, FP8T_MOD_HEAD, FP8T_GEMM_FPROP, FP8T_T_INPUT, NAN,
             "head fprop input (forward)");
    tiny_close(&t);
}

/* fp8t_inspector_spec_check judges a spec as fp8t_inspector_create does, in the same words
 * (which name the key, not an option). */
static void test_spec_check_matches_create(void) {
    char out[400], e_check[512], e_create[512];
    snprintf(out, sizeof(out), "%s/inspect_check", g_root);
    const char *bad[] = {"bogus=1",   "every=0",       "layers=3-1", "modules=fc9", "gemms=fwd",
                         "tensors=x", "end=2,start=5", "micro=some", "dump",        "layers=x"};
    for (int i = 0; i < 10; i++) {
        e_check[0] = e_create[0] = 0;
        int rc = fp8t_inspector_spec_check(bad[i], e_check, sizeof(e_check));
        fp8t_inspector *in = fp8t_inspector_create(bad[i], out, e_create, sizeof(e_create));
        T_CHECK(rc == -1 && !in && e_check[0] && !strcmp(e_check, e_create),
                "spec '%s': check %d '%s', create '%s'", bad[i], rc, e_check, e_create);
        T_CHECK(strncmp(e_check, "--", 2) != 0, "spec '%s': message names an option: %s", bad[i],
                e_check);
        fp8t_inspector_destroy(in);
    }
    const char *good[] = {NULL,
                          "",
                          "every=2,start=1,end=3,layers=1+head,modules=fc2+head",
                          "gemms=fprop+dgrad,tensors=operands,block=128,dump=1,micro=all",
                          "whatif=all",
                          "whatif=default"};
    for (int i = 0; i < 6; i++) {
        e_check[0] = 0;
        T_CHECK(fp8t_inspector_spec_check(good[i], e_check, sizeof(e_check)) == 0,
                "spec '%s': %s", good[i] ? good[i] : "(null)", e_check);
    }
}

/* amax_history_max is the amax the step's delayed scale came from. With a history of 2 the
 * update after step 1 takes max(amax of step 1, amax of step 0) and the roll then drops step
 * 0's: a huge amax planted as step 0's must still be reported at step 2 (the max of the
 * rolled history would give step 1's real amax), and the scale is 448 / it. */
typedef struct {
    fp8t_inspector *in;
    int step;
} plant_ctx;

static void plant_before_update(void *vctx, fp8t_model *m) {
    plant_ctx *c = vctx;
    if (c->step == 0) {
        int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
        size_t floats = fp8t_recipe_state_floats(n, len);
        float *st = malloc(floats * sizeof(float));
        fp8t_backend *be = fp8t_model_backend(m);
        be->ops->to_host(be, st, fp8t_model_fp8_state(m), floats * sizeof(float));
        for (int t = 0; t < n; t++) st[t] = 1000.0f; /* slot 0: this step's amax */
        be->ops->to_device(be, fp8t_model_fp8_state(m), st, floats * sizeof(float));
        free(st);
    }
    fp8t_inspector_before_scale_update(c->in, m, c->step);
}

static void test_amax_history_max_is_the_scales_amax(void) {
    tiny t;
    g_hist_len = 2;
    int rc = tiny_open(&t);
    g_hist_len = 16;
    T_ASSERT(rc == 0, "model");
    char out[400], err[512];
    snprintf(out, sizeof(out), "%s/inspect_hist", g_root);
    plant_ctx c = {0};
    c.in = fp8t_inspector_create("start=2,end=2,layers=1,modules=fc1,gemms=fprop,tensors=input",
                                 out, err, sizeof(err));
    T_ASSERT(c.in, "create: %s", err);
    fp8t_model_set_hook(t.m, hook_observe_only, c.in);
    for (int step = 0; step < 3; step++) {
        c.step = step;
        fp8t_inspector_begin_step(c.in, step);
        tiny_step_ex(&t, 1, plant_before_update, &c);
        fp8t_inspector_end_step(c.in, step);
    }
    fp8t_inspector_destroy(c.in);
    char path[600];
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    int n;
    cJSON **rows = read_rows(path, &n);
    T_ASSERT(rows && n == 1, "%d rows, expected 1", n);
    T_CHECK(num(rows[0], "amax_history_max") == 1000.0 && (float)num(rows[0], "scale") == 0.448f,
            "amax_history_max %.9g scale %.9g (expected 1000 and 0.448)",
            num(rows[0], "amax_history_max"), num(rows[0], "scale"));
    free_rows(rows, n);
    tiny_close(&t);
}

/* ---- reuse of an earlier site's statistics ----
 * Four inspectors see the same steps: A and B with reuse on and off must write the same file
 * byte for byte; C and D see the Wgrad's dY and X and the Dgrad's W with one element set to
 * NaN (restored before the GEMM): with reuse on (C) those rows are taken from the Fprop's /
 * Dgrad's sites, so C's file is A's; with reuse off (D) they show the NaN, which proves
 * reuse happened where C and A agree. */
typedef struct {
    fp8t_inspector *in[4];
    int poisoned;
} reuse_ctx;

static int repeated_site(const fp8t_tensor_site *s) {
    return (s->gemm == FP8T_GEMM_WGRAD &&
            (s->kind == FP8T_T_GRAD_OUTPUT || s->kind == FP8T_T_INPUT)) ||
           (s->gemm == FP8T_GEMM_DGRAD && s->kind == FP8T_T_WEIGHT);
}

static void reuse_hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    reuse_ctx *c = vctx;
    fp8t_inspector_observe(c->in[0], m, s, x);
    fp8t_inspector_observe(c->in[1], m, s, x);
    const float keep = x[0];
    if (repeated_site(s)) {
        x[0] = NAN;
        c->poisoned++;
    }
    fp8t_inspector_observe(c->in[2], m, s, x);
    fp8t_inspector_observe(c->in[3], m, s, x);
    x[0] = keep;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) len = 0;
    if (buf) buf[len] = 0;
    fclose(f);
    return buf;
}

/* Two inspectors on one model, every step: A writes its lines as it goes (end_step leaves a
 * step's lines to the next step's hook calls), B is flushed after every step. The files are
 * the same bytes; before its flush A still holds lines back, and the flush writes them. */
static void pair_hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    fp8t_inspector **in = vctx;
    fp8t_inspector_observe(in[0], m, s, x);
    fp8t_inspector_observe(in[1], m, s, x);
}

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; p && (p = strchr(p, '\n')); p++) n++;
    return n;
}

static void test_inspect_deferred_lines(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    char out[2][400], err[512], path[2][820];
    fp8t_inspector *in[2];
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof(out[k]), "%s/deferred%d", g_root, k);
        in[k] = fp8t_inspector_create("every=1", out[k], err, sizeof(err));
        T_ASSERT(in[k], "%s", err);
        snprintf(path[k], sizeof(path[k]), "%s/stats.jsonl", out[k]);
    }
    fp8t_model_set_hook(t.m, pair_hook, in);
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < 2; k++) fp8t_inspector_begin_step(in[k], step);
        tiny_step(&t, 1);
        for (int k = 0; k < 2; k++) fp8t_inspector_end_step(in[k], step);
        fp8t_inspector_flush(in[1]);
    }
    fp8t_model_set_hook(t.m, NULL, NULL);
    char *a = read_text(path[0]), *b = read_text(path[1]);
    const int held = count_lines(b) - count_lines(a);
    T_CHECK(held > 0, "A wrote %d lines before its flush, B %d: nothing was deferred",
            count_lines(a), count_lines(b));
    free(a);
    fp8t_inspector_flush(in[0]);
    T_CHECK(fp8t_inspector_write_error(in[0]) == NULL, "write error");
    a = read_text(path[0]);
    T_CHECK(a && b && count_lines(b) > 0 && strcmp(a, b) == 0,
            "deferred lines differ from lines written at once (%d vs %d lines)", count_lines(a),
            count_lines(b));
    free(a), free(b);
    for (int k = 0; k < 2; k++) fp8t_inspector_destroy(in[k]);
    tiny_close(&t);
}

static void test_inspect_reuse_writes_the_same_rows(void) {
    tiny t;
    T_ASSERT(tiny_open(&t) == 0, "model");
    /* delayed everywhere but: layer 0's qkv current scaling, layer 1 block scaling (its
     * Dgrad and Wgrad tile dY differently: no reuse there), layer 2's fc1 Wgrad current (its
     * X and dY under another request than the Fprop's / Dgrad's) */
    fp8t_policy pol = *fp8t_model_get_policy(t.m);
    char err[512];
    T_ASSERT(fp8t_policy_add_overrides(&pol,
                                       "layers=0,module=qkv,precision=current;"
                                       "layers=1,precision=block;"
                                       "layers=2,module=fc1,gemm=wgrad,precision=current",
                                       err, sizeof(err)) == 0,
             "%s", err);
    fp8t_model_set_policy(t.m, &pol);
    reuse_ctx c;
    memset(&c, 0, sizeof c);
    char out[4][400];
    for (int k = 0; k < 4; k++) {
        snprintf(out[k], sizeof(out[k]), "%s/reuse%d", g_root, k);
        c.in[k] = fp8t_inspector_create("micro=all,block=16", out[k], err, sizeof(err));
        T_ASSERT(c.in[k], "%s", err);
        fp8t_inspector_set_reuse(c.in[k], k == 0 || k == 2);
    }
    fp8t_model_set_hook(t.m, reuse_hook, &c);
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < 4; k++) fp8t_inspector_begin_step(c.in[k], step);
        tiny_step(&t, 2);
        for (int k = 0; k < 4; k++) fp8t_inspector_end_step(c.in[k], step);
    }
    fp8t_model_set_hook(t.m, NULL, NULL);
    char *text[4];
    for (int k = 0; k < 4; k++) {
        fp8t_inspector_destroy(c.in[k]);
        char path[600];
        snprintf(path, sizeof(path), "%s/reuse%d/stats.jsonl", g_root, k);
        text[k] = read_text(path);
        T_ASSERT(text[k] && text[k][0], "no rows in %s", path);
    }
    T_CHECK(c.poisoned > 0, "no repeated site seen");
    T_CHECK(strcmp(text[0], text[1]) == 0, "reuse on and off wrote different rows");
    /* line by line: C's rows are A's but where C computed a poisoned tensor (below) */
    int lines_differ = 0, lines_nan = 0;
    int lines_a = 0, lines_c = 0;
    for (const char *p = text[0]; (p = strchr(p, '\n')); p++) lines_a++;
    for (const char *p = text[2]; (p = strchr(p, '\n')); p++) lines_c++;
    T_CHECK(lines_a == lines_c && lines_a > 0, "rows: A %d, C %d", lines_a, lines_c);
    for (char *a = text[0], *q = text[2]; *a && *q;) {
        char *ea = strchr(a, '\n'), *eq = strchr(q, '\n');
        if (!ea || !eq) break;
        if (ea - a != eq - q || memcmp(a, q, (size_t)(ea - a)) != 0) {
            lines_differ++;
            lines_nan += strstr(q, "\"n_nan\":1,") && strstr(q, "\"n_nan\":1,") < eq;
        }
        a = ea + 1, q = eq + 1;
    }
    T_CHECK(lines_differ == lines_nan && lines_nan > 0,
            "%d rows of C differ from A's, %d of them by the NaN", lines_differ, lines_nan);
    /* C shows the NaN exactly where the request differs from the earlier site's: layer 1's
     * Wgrad dY and X (block tiles 128x1 against the Fprop's / Dgrad's 1x128; its 128x128 W
     * is reused) and layer 2 fc1's Wgrad dY and X (current against delayed); D everywhere */
    int n = 0, nan_c = 0, bad_c = 0;
    char path[600];
    snprintf(path, sizeof(path), "%s/reuse2/stats.jsonl", g_root);
    cJSON **rows = read_rows(path, &n);
    T_ASSERT(rows, "rows");
    for (int i = 0; i < n; i++) {
        if (num(rows[i], "n_nan") == 0) continue;
        nan_c++;
        const int layer = (int)num(rows[i], "layer");
        const int wgrad = !strcmp(str(rows[i], "gemm"), "wgrad");
        bad_c +=
            !(wgrad && (layer == 1 || (layer == 2 && !strcmp(str(rows[i], "module"), "fc1"))));
    }
    free_rows(rows, n);
    /* 4 linears of layer 1 + fc1 of layer 2, 2 sites each, 2 micro-batches, 3 steps */
    T_CHECK(nan_c == (4 + 1) * 2 * 2 * 3 && bad_c == 0, "C: %d rows with NaN, %d elsewhere",
            nan_c, bad_c);
    int nan_d = 0;
    snprintf(path, sizeof(path), "%s/reuse3/stats.jsonl", g_root);
    rows = read_rows(path, &n);
    T_ASSERT(rows, "rows");
    for (int i = 0; i < n; i++) nan_d += num(rows[i], "n_nan") != 0;
    T_CHECK(nan_d == c.poisoned, "D: %d rows with NaN, %d sites poisoned", nan_d, c.poisoned);
    T_CHECK(nan_c < nan_d, "no site was reused (C %d, D %d rows with NaN)", nan_c, nan_d);
    free_rows(rows, n);
    for (int k = 0; k < 4; k++) free(text[k]);
    tiny_close(&t);
}

/* ---- a read-only hook (fp8t_model_set_observer) ----
 * The model keeps its FP8 save of X and shows the Wgrad X as NULL; the inspector writes that
 * row from the Fprop X's. Against the same model under a writing hook (every X in FP32, each
 * site computed): the same file, byte for byte, for everything and for the Wgrad X alone
 * (its Fprop X is then computed but not written), with rows flushed mid-step (dumps of
 * results only: the Wgrad X's source may be flushed before it). The observer is shown the
 * head's logits and their FP32 gradient as rows pad(V) apart (the fused cross-entropy's buffer,
 * from the second step on: it needs a backward's dloss); the writing hook packed ones. */
typedef struct {
    fp8t_inspector *in;
    int null_x;
    int strided; /* sites shown with ld > cols */
} observe_ctx;

static void observe_hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    observe_ctx *c = vctx;
    c->null_x += x == NULL;
    c->strided += x && s->ld > s->cols;
    fp8t_inspector_observe(c->in, m, s, x);
}

static void observer_case(const char *spec, const char *name) {
    char *text[2];
    int null_x[2] = {0, 0}, strided[2] = {0, 0};
    for (int ro = 0; ro < 2; ro++) {
        tiny t;
        T_ASSERT(tiny_open(&t) == 0, "model");
        char err[512], out[400], path[600];
        snprintf(out, sizeof(out), "%s/observer_%s%d", g_root, name, ro);
        observe_ctx c = {fp8t_inspector_create(spec, out, err, sizeof(err)), 0, 0};
        T_ASSERT(c.in, "%s", err);
        fp8t_inspector_set_dump_budget(c.in, g_dump_budget);
        if (ro)
            fp8t_model_set_observer(t.m, observe_hook, &c);
        else
            fp8t_model_set_hook(t.m, observe_hook, &c);
        for (int step = 0; step < 3; step++) {
            fp8t_inspector_begin_step(c.in, step);
            tiny_step(&t, 2);
            fp8t_inspector_end_step(c.in, step);
        }
        fp8t_model_set_hook(t.m, NULL, NULL);
        fp8t_inspector_destroy(c.in);
        null_x[ro] = c.null_x;
        strided[ro] = c.strided;
        snprintf(path, sizeof(path), "%s/stats.jsonl", out);
        text[ro] = read_text(path);
        T_ASSERT(text[ro] && text[ro][0], "%s: no rows", spec);
        tiny_close(&t);
    }
    /* 3 layers x 4 linears + the head, 2 micro-batches, 3 steps */
    T_CHECK(null_x[0] == 0 && null_x[1] == (3 * 4 + 1) * 2 * 3, "%s: Wgrad X as NULL: %d, %d",
            spec, null_x[0], null_x[1]);
    /* the head's Y, and its dY at the Dgrad and the Wgrad, in every forward after the first
     * backward: 5 of the 3 steps' 2 micro-batches */
    T_CHECK(strided[0] == 0 && strided[1] == 3 * 5, "%s: strided sites %d, %d", spec, strided[0],
            strided[1]);
    T_CHECK(strcmp(text[0], text[1]) == 0, "%s: rows differ under a read-only hook", spec);
    free(text[0]), free(text[1]);
}

/* An observer leaves the training numerics alone: the same gradients as no hook at all (a
 * writing hook keeps every saved activation in FP32; an observer keeps the BF16 saves). */
static void observer_keeps_numerics(void) {
    float loss[2][3], norm[2][3];
    for (int ro = 0; ro < 2; ro++) {
        tiny t;
        T_ASSERT(tiny_open(&t) == 0, "model");
        char out[1024], err[512];
        snprintf(out, sizeof(out), "%s/observer_numerics%d", g_root, ro);
        observe_ctx c = {fp8t_inspector_create("micro=all", out, err, sizeof(err)), 0, 0};
        T_ASSERT(c.in, "%s", err);
        if (ro) fp8t_model_set_observer(t.m, observe_hook, &c);
        for (int step = 0; step < 3; step++) {
            fp8t_inspector_begin_step(c.in, step);
            loss[ro][step] = tiny_step(&t, 2);
            norm[ro][step] = fp8t_model_grad_norm(t.m);
            fp8t_inspector_end_step(c.in, step);
        }
        fp8t_model_set_hook(t.m, NULL, NULL);
        fp8t_inspector_destroy(c.in);
        tiny_close(&t);
    }
    for (int step = 0; step < 3; step++)
        T_CHECK(loss[0][step] == loss[1][step] && norm[0][step] == norm[1][step],
                "step %d: loss %.9g / grad norm %.9g without a hook, %.9g / %.9g observed", step,
                loss[0][step], norm[0][step], loss[1][step], norm[1][step]);
}

/* The ops one observed step of tiny ran, as the op profiler names them (its report). */
static char *observed_step_ops(const char *spec) {
    tiny t;
    g_profiled = 1;
    const int ok = tiny_open(&t) == 0;
    g_profiled = 0;
    if (!ok) return NULL;
    char out[1024], err[512];
    snprintf(out, sizeof(out), "%s/observer_ops", g_root);
    observe_ctx c = {fp8t_inspector_create(spec, out, err, sizeof(err)), 0, 0};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = c.in ? open_memstream(&buf, &len) : NULL;
    if (f) {
        fp8t_model_set_observer(t.m, observe_hook, &c);
        fp8t_inspector_begin_step(c.in, 0);
        tiny_step(&t, 1);
        fp8t_inspector_end_step(c.in, 0);
        fp8t_model_set_hook(t.m, NULL, NULL);
        fp8t_profile_report(t.be, f, 1);
        fclose(f);
    }
    fp8t_inspector_destroy(c.in);
    tiny_close(&t);
    return buf;
}

/* An observer keeps GPT-2's GELU passes in FP8 delayed (fc2's operand made from GELU's input,
 * fc1's dY from the GELU backward's, each pass also writing the FP32 tensor the hook is shown):
 * no gelu_forward / gelu_backward op of their own (observer_case checks the rows equal a writing
 * hook's, which runs those ops). */
static void observer_keeps_gelu_passes(void) {
    char *ops = observed_step_ops("every=1");
    T_ASSERT(ops, "no profile report");
    T_CHECK(strstr(ops, "quantize_gelu") && strstr(ops, "quantize_dgelu") &&
                !strstr(ops, "gelu_forward") && !strstr(ops, "gelu_backward"),
            "the observed step's GELU ops:\n%s", ops);
    free(ops);
}

/* Where the unhooked model chunks its head, an observer runs the head's BF16 GEMMs in the same
 * chunks (into the whole-batch logits it is shown): with chunks of 16 of the B * T = 32 tokens,
 * an observed step makes 2 calls of each of the head's three GEMMs (the layers' are FP8). */
static void observer_chunks_head_gemms(void) {
    g_head_chunk = 16;
    char *ops = observed_step_ops("every=1");
    g_head_chunk = 0;
    T_ASSERT(ops, "no profile report");
    const char *l = strstr(ops, "gemm_bf16_rounded ");
    int calls = -1;
    T_CHECK(l && sscanf(l, "gemm_bf16_rounded %d", &calls) == 1 && calls == 3 * (B * T / 16),
            "%d head GEMM calls:\n%s", calls, ops);
    free(ops);
}

static void test_inspect_read_only_hook(void) {
    observer_chunks_head_gemms();
    observer_keeps_gelu_passes();
    observer_keeps_numerics();
    g_vocab = 253; /* not a multiple of 8: the fused head's rows are padded (strided sites) */
    observer_keeps_numerics();
    /* a head the unhooked model chunks: the observer runs the same GEMM calls, chunk by chunk
     * (the dW of the head summed over the chunks in order) */
    g_head_chunk = 16;
    observer_keeps_numerics();
    g_head_chunk = 0;
    /* against a writing hook, which keeps the saved activations in FP32: FP32 saves on both
     * sides, so that the rows compare the hooks alone */
    g_disable = FP8T_DISABLE_BF16_SAVES;
    observer_case("micro=all,block=16", "all");
    observer_case("micro=all,gemms=wgrad,tensors=input", "wgrad_x");
    g_dump_budget = 1000;
    observer_case("micro=all,tensors=input+output,dump=1", "flushed");
    g_dump_budget = 0;
    g_disable = 0;
    g_vocab = 0;
}

int main(void) {
    t_suite = "inspect";
    snprintf(g_root, sizeof(g_root), "/tmp/fp8t_test_inspect_XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_inspect_selection_stats_and_dumps);
    /* again with a pinned budget below one dump: mid-step flushes and writer back pressure */
    g_dump_budget = 1000;
    T_RUN(test_inspect_selection_stats_and_dumps);
    g_dump_budget = 0;
    T_RUN(test_inspect_micro_all_and_current_scaling);
    T_RUN(test_inspect_tile_stats);
    T_RUN(test_inspect_off_and_spec_errors);
    T_RUN(test_spec_check_matches_create);
    T_RUN(test_nan_tracker_names_the_poisoned_tensor);
    T_RUN(test_amax_history_max_is_the_scales_amax);
    T_RUN(test_inspect_reuse_writes_the_same_rows);
    T_RUN(test_inspect_deferred_lines);
    T_RUN(test_inspect_read_only_hook);
    if (!getenv("FP8T_KEEP_TEST_FILES"))
        fp8t_rmtree(g_root);
    else
        printf("kept %s\n", g_root);
    T_MAIN_END();
}
