/* Fault injection on a small model directly: every perturbation lands exactly where and when
 * the spec says and nowhere else; when=fp8 is respected; amax faults edit the history. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/debug.h"
#include "fp8train/inject.h"
#include "fp8train/model.h"
#include "fp8train/recipe.h"
#include "test.h"

#define B 2
#define T 16
#define MAX_SITES 4096

/* One hook call: where, and the tensor as the GEMM saw it (after the injector). */
typedef struct {
    int step;
    fp8t_tensor_site site;
    float *x; /* host copy, rows*cols */
} site_rec;

typedef struct {
    fp8t_injector *inj;
    int step;
    int n;
    site_rec rec[MAX_SITES];
} recorder;

typedef struct {
    recorder *r;
    /* history slot 0 of every FP8 tensor before / after fp8t_injector_before_scale_update,
     * and the scales after fp8t_model_end_step, per step */
    float *h0_before[8], *h0_after[8], *scale_after[8];
    float *grads[8]; /* all parameter gradients after each step's backward */
    int n_fp8;
    size_t n_params;
} run_log;

static void hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    recorder *r = ctx;
    if (r->inj) fp8t_injector_observe(r->inj, m, s, x);
    if (r->n >= MAX_SITES) return;
    site_rec *e = &r->rec[r->n++];
    e->step = r->step;
    e->site = *s;
    size_t n = (size_t)s->rows * s->cols;
    e->x = malloc(n * sizeof(float));
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_host(be, e->x, x, n * sizeof(float));
}

static void run_log_free(run_log *L) {
    for (int i = 0; i < L->r->n; i++) free(L->r->rec[i].x);
    for (int s = 0; s < 8; s++)
        free(L->h0_before[s]), free(L->h0_after[s]), free(L->scale_after[s]), free(L->grads[s]);
    free(L->r);
}

static fp8t_model_config small_cfg(fp8t_arch arch) {
    fp8t_model_config c = {.arch = arch,
                           .n_layer = 2,
                           .n_embd = 32,
                           .n_head = 2,
                           .seq_len = T,
                           .vocab_size = 64,
                           .mlp_hidden = 64,
                           .rope_theta = 10000.0f,
                           .norm_eps = 1e-5f};
    return c;
}

/* Run `steps` steps (forward + backward, no optimizer so the weights stay fixed) of the small
 * model under policy pol with the fault spec (NULL = clean), recording everything. */
static int run(run_log *L, fp8t_arch arch, const fp8t_policy *pol, const char *spec, int steps) {
    memset(L, 0, sizeof *L);
    L->r = calloc(1, sizeof(recorder));
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!be) return printf("  backend: %s\n", err), -1;
    fp8t_model_config cfg = small_cfg(arch);
    fp8t_model *m = fp8t_model_create(be, &cfg, pol, NULL, B, T, err, sizeof err);
    if (!m) return printf("  model: %s\n", err), fp8t_backend_destroy(be), -1;
    fp8t_model_init_weights(m, 42);
    if (spec) {
        L->r->inj = fp8t_injector_create(spec, err, sizeof err);
        if (!L->r->inj) return printf("  inject: %s\n", err), -1;
    }
    fp8t_model_set_hook(m, hook, L->r);
    L->n_fp8 = fp8t_model_fp8_count(m);
    L->n_params = fp8t_model_num_params(m);
    int len = fp8t_model_fp8_history_len(m);
    float *state = malloc(fp8t_recipe_state_floats(L->n_fp8, len) * sizeof(float));
    int tokens[B * T], targets[B * T];
    for (int step = 0; step < steps; step++) {
        /* a different batch every step, so amaxes move */
        for (int i = 0; i < B * T; i++) {
            tokens[i] = (i * 7 + step * 13 + (i * i) % 5) % cfg.vocab_size;
            targets[i] = (tokens[i] * 3 + 1) % cfg.vocab_size;
        }
        L->r->step = step;
        fp8t_injector_begin_step(L->r->inj, step);
        fp8t_model_zero_grad(m);
        fp8t_model_forward(m, tokens, targets);
        fp8t_model_backward(m, 1.0f);
        L->grads[step] = malloc(L->n_params * sizeof(float));
        be->ops->to_host(be, L->grads[step], fp8t_model_grads(m), L->n_params * sizeof(float));
        L->h0_before[step] = malloc(L->n_fp8 * sizeof(float));
        L->h0_after[step] = malloc(L->n_fp8 * sizeof(float));
        L->scale_after[step] = malloc(L->n_fp8 * sizeof(float));
        be->ops->to_host(be, L->h0_before[step], fp8t_model_fp8_state(m),
                         L->n_fp8 * sizeof(float));
        fp8t_injector_before_scale_update(L->r->inj, m, step);
        be->ops->to_host(be, L->h0_after[step], fp8t_model_fp8_state(m),
                         L->n_fp8 * sizeof(float));
        fp8t_model_end_step(m);
        be->ops->to_host(be, state, fp8t_model_fp8_state(m),
                         fp8t_recipe_state_floats(L->n_fp8, len) * sizeof(float));
        fp8t_recipe_state st;
        fp8t_recipe_state_view(&st, state, L->n_fp8, len);
        memcpy(L->scale_after[step], st.scale, L->n_fp8 * sizeof(float));
    }
    free(state);
    fp8t_injector_destroy(L->r->inj); /* before the backend that owns its scratch */
    L->r->inj = NULL;
    fp8t_model_destroy(m);
    fp8t_backend_destroy(be);
    return 0;
}

static size_t numel(const site_rec *e) { return (size_t)e->site.rows * e->site.cols; }

static int same_site(const fp8t_tensor_site *a, const fp8t_tensor_site *b) {
    return a->lin == b->lin && a->gemm == b->gemm && a->kind == b->kind;
}

/* Index of the record of (step, lin, gemm, kind), or -1. */
static int find(const run_log *L, int step, int lin, fp8t_gemm_kind g, fp8t_tensor_kind k) {
    for (int i = 0; i < L->r->n; i++) {
        const site_rec *e = &L->r->rec[i];
        if (e->step == step && e->site.lin == lin && e->site.gemm == g && e->site.kind == k)
            return i;
    }
    return -1;
}

static int bit_equal(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static fp8t_policy policy_of(fp8t_precision prec, const char *overrides) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.history_len = 4;
    char err[256];
    if (overrides && fp8t_policy_add_overrides(&p, overrides, err, sizeof err) != 0) {
        printf("  override: %s\n", err);
        exit(1);
    }
    return p;
}

/* lin of (layer, slot) in the small GPT-2 (4 linears per layer). */
#define LIN(layer, slot) ((layer)*4 + (slot))
enum { QKV = 0, PROJ = 1, FC1 = 2, FC2 = 3 };

/* ---------------------------------------------------------------- spec parsing */

static void expect_error(const char *spec, const char *mention) {
    char err[512] = "";
    fp8t_injector *inj = fp8t_injector_create(spec, err, sizeof err);
    T_CHECK(inj == NULL, "spec '%s' should be rejected", spec);
    fp8t_injector_destroy(inj);
    T_CHECK(strstr(err, mention) != NULL, "error for '%s' should mention '%s': %s", spec, mention,
            err);
    T_CHECK(fp8t_injector_check(spec, err, sizeof err) != 0, "check agrees on '%s'", spec);
}

static void test_spec_parsing(void) {
    const char *good[] = {
        "layer=2,module=fc2,gemm=dgrad,kind=scale:64,from=50",
        "layer=1-2,module=fc2,gemm=dgrad,kind=outliers:1e4,from=50,to=80",
        "layer=0,gemm=fprop,tensor=output,kind=nan",
        "layers=all,module=mlp,gemm=wgrad,tensor=input,kind=scale:0.5,when=always",
        "layer=1,gemm=dgrad,kind=outliers:10,when=delayed",
        "module=head,gemm=fprop,tensor=weight,kind=stale-amax,from=3",
        "gemm=dgrad,kind=corrupt-amax:1e6;layer=1,gemm=fprop,kind=nan,seed=7,frac=0.01",
    };
    char err[512];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        fp8t_injector *inj = fp8t_injector_create(good[i], err, sizeof err);
        T_CHECK(inj != NULL, "'%s' should parse: %s", good[i], err);
        T_CHECK(fp8t_injector_fired(inj) == 0, "nothing fired yet");
        fp8t_injector_destroy(inj);
    }
    expect_error("", "empty");
    expect_error("layer=2,kind=nan", "gemm");
    expect_error("layer=2,gemm=dgrad", "kind");
    expect_error("gemm=dgrad,kind=scale", "kind"); /* scale needs :S */
    expect_error("gemm=dgrad,kind=explode", "kind");
    expect_error("gemm=dgrad,kind=nan,colour=red", "colour");
    expect_error("gemm=fprop,tensor=grad_output,kind=nan", "not a tensor of the fprop");
    expect_error("gemm=fprop,tensor=weight,kind=scale:2", "read-only");
    expect_error("gemm=fprop,tensor=output,kind=stale-amax", "amax history");
    expect_error("gemm=dgrad,kind=nan,from=10,to=5", "before");
    expect_error("layer=3-1,gemm=dgrad,kind=nan", "layer");
    expect_error("gemm=dgrad,kind=nan,when=sometimes", "when");
    expect_error("gemm=dgrad,kind=nan,module=ffn", "module");
    expect_error("gemm=dgrad,kind=outliers:1e4,frac=2", "frac");
    expect_error("gemm=dgrad kind=nan", "gemm");
    expect_error("gemm=dgrad,kind=nan,oops", "key=value");
    T_CHECK(strstr(fp8t_injector_help(), "when=fp8") != NULL, "help documents when=fp8");
}

/* ---------------------------------------------------------------- value faults */

/* scale:64 on Dgrad's dY of layer 1 fc2, steps 1-2, in BF16 with when=always: the Dgrad sees
 * exactly 64 dY and returns exactly 64 dX (powers of two commute with rounding); the Wgrad of
 * the same layer, its bias gradient, and every tensor before it are untouched. */
static void test_scale_dgrad_only(void) {
    fp8t_policy pol = policy_of(FP8T_PREC_BF16, NULL);
    run_log clean, hit;
    T_ASSERT(run(&clean, FP8T_ARCH_GPT2, &pol, NULL, 4) == 0, "clean run");
    T_ASSERT(run(&hit, FP8T_ARCH_GPT2, &pol,
                 "layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=1,to=2,when=always", 4) == 0,
             "faulty run");
    T_ASSERT(clean.r->n == hit.r->n, "same sites %d vs %d", clean.r->n, hit.r->n);
    const int lin = LIN(1, FC2);
    for (int step = 0; step < 4; step++) {
        int in_window = step == 1 || step == 2;
        int i_dy = find(&hit, step, lin, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
        int i_dx = find(&hit, step, lin, FP8T_GEMM_DGRAD, FP8T_T_DGRAD);
        T_ASSERT(i_dy >= 0 && i_dx > i_dy, "sites of the fault found");
        for (int i = 0; i < hit.r->n; i++) {
            const site_rec *a = &clean.r->rec[i], *b = &hit.r->rec[i];
            if (a->step != step) continue;
            T_ASSERT(same_site(&a->site, &b->site), "site order differs at %d", i);
            size_t n = numel(a);
            if (!in_window || i < i_dy) {
                T_CHECK(bit_equal(a->x, b->x, n), "step %d site %d (lin %d %s %s) changed", step,
                        i, a->site.lin, fp8t_gemm_name(a->site.gemm),
                        fp8t_tensor_kind_name(a->site.kind));
            } else if (i == i_dy || i == i_dx) {
                int exact = 1;
                for (size_t k = 0; k < n; k++) exact &= b->x[k] == 64.0f * a->x[k];
                T_CHECK(exact, "step %d: %s of the Dgrad is exactly 64x", step,
                        fp8t_tensor_kind_name(a->site.kind));
            } else if (a->site.lin == lin) { /* the Wgrad of the same linear: clean dY, dW */
                T_CHECK(bit_equal(a->x, b->x, n), "step %d: %s %s of the faulty linear changed",
                        step, fp8t_gemm_name(a->site.gemm), fp8t_tensor_kind_name(a->site.kind));
            }
        }
    }
    /* the parameter gradients of layer 1 fc2 (weight and bias) are the clean ones; layer 0's
     * differ in the window (dX flows down) */
    fp8t_param_info *info = calloc(FP8T_MAX_PARAM_TENSORS, sizeof *info);
    fp8t_model_config cfg = small_cfg(FP8T_ARCH_GPT2);
    int nt = fp8t_model_param_table(&cfg, info, NULL);
    for (int step = 0; step < 4; step++) {
        for (int t = 0; t < nt; t++) {
            int eq = bit_equal(clean.grads[step] + info[t].offset,
                               hit.grads[step] + info[t].offset, info[t].numel);
            if (!strcmp(info[t].name, "h.1.fc2.w") || !strcmp(info[t].name, "h.1.fc2.b"))
                T_CHECK(eq, "step %d: gradient %s changed", step, info[t].name);
            if (!strcmp(info[t].name, "h.0.fc1.w"))
                T_CHECK(eq == !(step == 1 || step == 2), "step %d: %s %s", step, info[t].name,
                        eq ? "unchanged in the window" : "changed outside the window");
        }
    }
    free(info);
    run_log_free(&clean);
    run_log_free(&hit);
}

/* the two runs saw the same tensors, bit for bit, at every recorded site */
static int runs_equal(const run_log *a, const run_log *b) {
    int eq = a->r->n == b->r->n;
    for (int i = 0; eq && i < a->r->n; i++)
        eq = bit_equal(a->r->rec[i].x, b->r->rec[i].x, numel(&a->r->rec[i]));
    return eq;
}

/* when=fp8 (the default): nothing happens while the GEMM runs in BF16; the fault fires as soon
 * as that one GEMM is FP8 (here fake quantization), once per step of the window. */
static void test_when_fp8(void) {
    const char *spec = "layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=1,to=2";
    fp8t_policy bf16 = policy_of(FP8T_PREC_BF16, NULL);
    run_log clean, a;
    T_ASSERT(run(&clean, FP8T_ARCH_GPT2, &bf16, NULL, 3) == 0, "clean");
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &bf16, spec, 3) == 0, "bf16 run");
    T_CHECK(runs_equal(&clean, &a), "when=fp8 in BF16 changes nothing");
    run_log_free(&a);

    /* Dgrad of that linear in fake FP8: it fires; the Dgrad input is 64x the clean one up to
     * where the fake cast saturates (the scale follows the data: nothing saturates) */
    fp8t_policy fake = policy_of(FP8T_PREC_BF16, "layers=1,module=fc2,gemm=dgrad,precision=fake");
    run_log f;
    T_ASSERT(run(&f, FP8T_ARCH_GPT2, &fake, spec, 3) == 0, "fake run");
    int i_dy = find(&f, 1, LIN(1, FC2), FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
    T_ASSERT(i_dy >= 0, "site");
    const site_rec *e = &f.r->rec[i_dy], *c = &clean.r->rec[i_dy];
    const size_t n_dy = numel(e);
    int scaled = 1;
    for (size_t k = 0; k < n_dy; k++) scaled &= e->x[k] == 64.0f * c->x[k];
    T_CHECK(scaled, "fires under fake quantization");
    int i_dy0 = find(&f, 0, LIN(1, FC2), FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
    T_CHECK(bit_equal(f.r->rec[i_dy0].x, clean.r->rec[i_dy0].x, n_dy), "not before from");
    /* the same spec on fprop of that linear, whose Fprop is BF16 here: nothing */
    run_log g;
    T_ASSERT(run(&g, FP8T_ARCH_GPT2, &fake, "layer=1,module=fc2,gemm=fprop,kind=scale:64", 2) ==
                 0,
             "fprop run");
    int i_x = find(&g, 1, LIN(1, FC2), FP8T_GEMM_FPROP, FP8T_T_INPUT);
    T_CHECK(bit_equal(g.r->rec[i_x].x, clean.r->rec[i_x].x, numel(&g.r->rec[i_x])),
            "a BF16 Fprop is not perturbed");
    run_log_free(&g);
    run_log_free(&f);

    /* when=delayed: not under fake quantization (current scaling), yes under delayed */
    run_log dl;
    T_ASSERT(run(&dl, FP8T_ARCH_GPT2, &fake,
                 "layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=1,to=2,when=delayed", 3) == 0,
             "when=delayed run");
    T_CHECK(bit_equal(dl.r->rec[i_dy].x, clean.r->rec[i_dy].x, n_dy),
            "when=delayed does not fire under fake quantization");
    run_log_free(&dl);
    fp8t_policy del =
        policy_of(FP8T_PREC_BF16, "layers=1,module=fc2,gemm=dgrad,precision=delayed");
    T_ASSERT(run(&dl, FP8T_ARCH_GPT2, &del,
                 "layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=1,to=2,when=delayed", 3) == 0,
             "when=delayed run");
    scaled = 1;
    for (size_t k = 0; k < n_dy; k++) scaled &= dl.r->rec[i_dy].x[k] == 64.0f * c->x[k];
    T_CHECK(scaled, "when=delayed fires under delayed scaling");
    run_log_free(&dl);

    /* delayed FP8 everywhere but that Dgrad in BF16: nothing fires there either */
    fp8t_policy d = policy_of(FP8T_PREC_FP8, "layers=1,module=fc2,gemm=dgrad,precision=bf16");
    run_log h, hc;
    T_ASSERT(run(&h, FP8T_ARCH_GPT2, &d, spec, 3) == 0, "delayed run");
    T_ASSERT(run(&hc, FP8T_ARCH_GPT2, &d, NULL, 3) == 0, "delayed clean run");
    T_CHECK(runs_equal(&hc, &h), "a BF16 Dgrad in an FP8 run is not perturbed");
    run_log_free(&h);
    run_log_free(&hc);
    run_log_free(&clean);
}

/* when=bf16: the mirror of when=fp8. It fires while the GEMM runs in BF16 (a broken reference)
 * and not once that GEMM is FP8; an amax fault can't take it. */
static void test_when_bf16(void) {
    const char *spec = "layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=1,to=2,when=bf16";
    fp8t_policy bf16 = policy_of(FP8T_PREC_BF16, NULL);
    run_log clean, a, f;
    T_ASSERT(run(&clean, FP8T_ARCH_GPT2, &bf16, NULL, 3) == 0, "clean");
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &bf16, spec, 3) == 0, "bf16 run");
    int i_dy = find(&a, 1, LIN(1, FC2), FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
    int i_dy0 = find(&a, 0, LIN(1, FC2), FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
    T_ASSERT(i_dy >= 0 && i_dy0 >= 0, "sites");
    const size_t n_dy = numel(&a.r->rec[i_dy]);
    int scaled = 1;
    for (size_t k = 0; k < n_dy; k++)
        scaled &= a.r->rec[i_dy].x[k] == 64.0f * clean.r->rec[i_dy].x[k];
    T_CHECK(scaled, "fires in BF16");
    T_CHECK(bit_equal(a.r->rec[i_dy0].x, clean.r->rec[i_dy0].x, n_dy), "not before from");
    run_log_free(&a);

    fp8t_policy fake = policy_of(FP8T_PREC_BF16, "layers=1,module=fc2,gemm=dgrad,precision=fake");
    run_log fc;
    T_ASSERT(run(&fc, FP8T_ARCH_GPT2, &fake, NULL, 3) == 0, "fake clean run");
    T_ASSERT(run(&f, FP8T_ARCH_GPT2, &fake, spec, 3) == 0, "fake run");
    T_CHECK(runs_equal(&fc, &f), "when=bf16 does not fire once that GEMM is FP8");
    run_log_free(&f);
    run_log_free(&fc);
    run_log_free(&clean);
    expect_error("gemm=dgrad,kind=stale-amax,when=bf16", "value faults");
}

/* outliers: a seeded sparse set of positions (frac of the tensor) becomes +-V in the Fprop
 * input only; the Wgrad reads the clean X; the same positions in every run. */
static void test_outliers(void) {
    const char *spec = "layer=0,module=qkv,gemm=fprop,kind=outliers:1e4,from=0,to=1,frac=0.01,"
                       "when=always";
    fp8t_policy pol = policy_of(FP8T_PREC_BF16, NULL);
    run_log clean, a, b;
    T_ASSERT(run(&clean, FP8T_ARCH_GPT2, &pol, NULL, 3) == 0, "clean");
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &pol, spec, 3) == 0, "run a");
    T_ASSERT(run(&b, FP8T_ARCH_GPT2, &pol, spec, 3) == 0, "run b");
    const int lin = LIN(0, QKV);
    int changed_pos_0 = -1;
    for (int step = 0; step < 3; step++) {
        int i = find(&a, step, lin, FP8T_GEMM_FPROP, FP8T_T_INPUT);
        T_ASSERT(i >= 0, "site");
        size_t n = numel(&a.r->rec[i]);
        size_t k_max = (size_t)lround(0.01 * (double)n);
        size_t changed = 0, wrong = 0;
        int first = -1;
        for (size_t p = 0; p < n; p++) {
            float x = a.r->rec[i].x[p], x0 = clean.r->rec[i].x[p];
            if (x != x0) {
                changed++;
                if (first < 0) first = (int)p;
                if (fabsf(x) != 1e4f) wrong++;
            }
        }
        if (step < 2) {
            T_CHECK(changed >= 1 && changed <= k_max, "step %d: %zu positions changed (<= %zu)",
                    step, changed, k_max);
            T_CHECK(changed >= k_max / 2, "step %d: most of the %zu outliers land (%zu)", step,
                    k_max, changed);
            T_CHECK(wrong == 0, "step %d: changed values are +-1e4", step);
        } else {
            T_CHECK(changed == 0, "step %d outside the window: %zu changed", step, changed);
        }
        if (step == 0) changed_pos_0 = first;
        if (step == 1) T_CHECK(first != changed_pos_0, "positions are reseeded per step");
        T_CHECK(bit_equal(a.r->rec[i].x, b.r->rec[i].x, n), "deterministic positions");
        int iw = find(&a, step, lin, FP8T_GEMM_WGRAD, FP8T_T_INPUT);
        T_CHECK(bit_equal(a.r->rec[iw].x, clean.r->rec[iw].x, numel(&a.r->rec[iw])),
                "step %d: the Wgrad's X is clean", step);
        int io = find(&a, step, lin, FP8T_GEMM_FPROP, FP8T_T_OUTPUT);
        T_CHECK(bit_equal(a.r->rec[io].x, clean.r->rec[io].x, numel(&a.r->rec[io])) ==
                    (step == 2),
                "step %d: the Fprop output %s", step, step == 2 ? "is clean" : "is hit");
    }
    run_log_free(&clean);
    run_log_free(&a);
    run_log_free(&b);
}

/* nan: one NaN in the Dgrad operand; dX is non-finite; the Wgrad and its dW stay finite. */
static void test_nan(void) {
    fp8t_policy pol = policy_of(FP8T_PREC_FP8, NULL);
    run_log a;
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &pol, "layer=1,module=proj,gemm=dgrad,kind=nan,from=2,to=2",
                 4) == 0,
             "run");
    const int lin = LIN(1, PROJ);
    for (int step = 0; step < 3; step++) {
        int i = find(&a, step, lin, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT);
        size_t nans = 0;
        for (size_t p = 0; p < numel(&a.r->rec[i]); p++) nans += isnan(a.r->rec[i].x[p]);
        T_CHECK(nans == (step == 2 ? 1u : 0u), "step %d: %zu NaNs in the Dgrad's dY", step, nans);
    }
    int idx = find(&a, 2, lin, FP8T_GEMM_DGRAD, FP8T_T_DGRAD);
    size_t bad = 0;
    for (size_t p = 0; p < numel(&a.r->rec[idx]); p++) bad += !isfinite(a.r->rec[idx].x[p]);
    T_CHECK(bad > 0, "the Dgrad result is non-finite");
    int iw = find(&a, 2, lin, FP8T_GEMM_WGRAD, FP8T_T_GRAD_OUTPUT);
    int iww = find(&a, 2, lin, FP8T_GEMM_WGRAD, FP8T_T_WGRAD);
    bad = 0;
    for (size_t p = 0; p < numel(&a.r->rec[iw]); p++) bad += !isfinite(a.r->rec[iw].x[p]);
    for (size_t p = 0; p < numel(&a.r->rec[iww]); p++) bad += !isfinite(a.r->rec[iww].x[p]);
    T_CHECK(bad == 0, "the Wgrad of the same linear is finite (%zu bad)", bad);
    run_log_free(&a);
}

/* A result fault stays: the next layer consumes the perturbed output. Llama, to also cover its
 * shared input (gate and up read the same normalized X). */
static void test_result_and_llama(void) {
    fp8t_policy pol = policy_of(FP8T_PREC_BF16, NULL);
    run_log clean, a, b;
    T_ASSERT(run(&clean, FP8T_ARCH_LLAMA, &pol, NULL, 1) == 0, "clean");
    T_ASSERT(run(&a, FP8T_ARCH_LLAMA, &pol,
                 "layer=0,module=gate,gemm=fprop,kind=scale:4,when=always", 1) == 0,
             "run a");
    T_ASSERT(run(&b, FP8T_ARCH_LLAMA, &pol,
                 "layer=1,module=qkv,gemm=fprop,tensor=output,kind=scale:2,when=always", 1) == 0,
             "run b");
    /* gate input 4x, up input (same buffer) clean */
    int ig = find(&a, 0, 0 * 5 + 2, FP8T_GEMM_FPROP, FP8T_T_INPUT);
    int iu = find(&a, 0, 0 * 5 + 3, FP8T_GEMM_FPROP, FP8T_T_INPUT);
    int ok = 1;
    for (size_t p = 0; p < numel(&a.r->rec[ig]); p++)
        ok &= a.r->rec[ig].x[p] == 4.0f * clean.r->rec[ig].x[p];
    T_CHECK(ok, "gate input scaled");
    T_CHECK(bit_equal(a.r->rec[iu].x, clean.r->rec[iu].x, numel(&a.r->rec[iu])),
            "up reads the clean shared input");
    /* qkv output of layer 1 doubled and it stays: proj's input (attention of it) changes */
    int io = find(&b, 0, 1 * 5 + 0, FP8T_GEMM_FPROP, FP8T_T_OUTPUT);
    int ip = find(&b, 0, 1 * 5 + 1, FP8T_GEMM_FPROP, FP8T_T_INPUT);
    ok = 1;
    for (size_t p = 0; p < numel(&b.r->rec[io]); p++)
        ok &= b.r->rec[io].x[p] == 2.0f * clean.r->rec[io].x[p];
    T_CHECK(ok, "qkv output doubled");
    T_CHECK(!bit_equal(b.r->rec[ip].x, clean.r->rec[ip].x, numel(&b.r->rec[ip])),
            "the perturbed output flows on");
    T_CHECK(fp8t_injector_fired(NULL) == 0, "fired(NULL) is 0");
    run_log_free(&clean);
    run_log_free(&a);
    run_log_free(&b);
}

/* ---------------------------------------------------------------- amax faults */

/* stale-amax on the Fprop input of layer 1 fc1: from step 1 slot 0 keeps step 1's amax while
 * the data moves; nothing else in the history is touched. Only in delayed scaling (when=fp8). */
static void test_stale_amax(void) {
    const char *spec = "layer=1,module=fc1,gemm=fprop,kind=stale-amax,from=1";
    fp8t_policy pol = policy_of(FP8T_PREC_FP8, NULL);
    run_log a;
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &pol, spec, 5) == 0, "run");
    const int t = LIN(1, FC1) * 3 + FP8T_ROLE_X;
    float frozen = a.h0_before[1][t];
    T_CHECK(frozen > 0, "amax recorded");
    int moved = 0;
    for (int step = 0; step < 5; step++) {
        if (step >= 2) {
            T_CHECK(a.h0_after[step][t] == frozen, "step %d: slot 0 = %g, frozen %g", step,
                    a.h0_after[step][t], frozen);
            moved |= a.h0_before[step][t] != frozen;
        } else {
            T_CHECK(a.h0_after[step][t] == a.h0_before[step][t], "step %d untouched", step);
        }
        for (int u = 0; u < a.n_fp8; u++)
            if (u != t)
                T_CHECK(a.h0_after[step][u] == a.h0_before[step][u], "step %d: tensor %d touched",
                        step, u);
    }
    T_CHECK(moved, "the data's amax moved (so freezing matters)");
    run_log_free(&a);

    /* that Fprop in current scaling: the history is not read, the fault does not fire */
    fp8t_policy cur =
        policy_of(FP8T_PREC_FP8, "layers=1,module=fc1,gemm=fprop,precision=current");
    run_log b;
    T_ASSERT(run(&b, FP8T_ARCH_GPT2, &cur, spec, 4) == 0, "run current");
    for (int step = 0; step < 4; step++)
        T_CHECK(b.h0_after[step][t] == b.h0_before[step][t], "current: step %d untouched", step);
    run_log_free(&b);
    /* ... unless when=always */
    run_log c;
    T_ASSERT(run(&c, FP8T_ARCH_GPT2, &cur,
                 "layer=1,module=fc1,gemm=fprop,kind=stale-amax,from=1,when=always", 4) == 0,
             "run always");
    T_CHECK(c.h0_after[3][t] == c.h0_before[1][t], "when=always freezes in current scaling too");
    run_log_free(&c);
}

/* corrupt-amax:V writes V into slot 0 of the chosen tensor (dY of layer 0 qkv) in the window;
 * the next delayed scale comes from it: fmt_max / V. */
static void test_corrupt_amax(void) {
    fp8t_policy pol = policy_of(FP8T_PREC_FP8, NULL);
    run_log a;
    T_ASSERT(run(&a, FP8T_ARCH_GPT2, &pol,
                 "layer=0,module=qkv,gemm=dgrad,kind=corrupt-amax:1e6,from=2,to=2", 4) == 0,
             "run");
    const int t = LIN(0, QKV) * 3 + FP8T_ROLE_DY;
    for (int step = 0; step < 4; step++) {
        if (step == 2)
            T_CHECK(a.h0_after[step][t] == 1e6f, "slot 0 = %g", a.h0_after[step][t]);
        else
            T_CHECK(a.h0_after[step][t] == a.h0_before[step][t], "step %d untouched", step);
        for (int u = 0; u < a.n_fp8; u++)
            if (u != t) T_CHECK(a.h0_after[step][u] == a.h0_before[step][u], "others untouched");
    }
    /* hybrid format: dY is E5M2 */
    T_CLOSE(a.scale_after[2][t], FP8_E5M2_MAX / 1e6f, 0, 1e-6);
    T_CHECK(a.scale_after[1][t] > 10 * a.scale_after[2][t], "the scale collapsed (%g -> %g)",
            a.scale_after[1][t], a.scale_after[2][t]);
    /* history 4: the corrupted amax rules the scale while it is in the window of 4 */
    T_CLOSE(a.scale_after[3][t], FP8_E5M2_MAX / 1e6f, 0, 1e-6);
    run_log_free(&a);
}

/* A fault naming a layer or module the model lacks never fires: it is refused up front, with
 * the model's layers / modules in the message. (Issue 13: layer=99 on 4 layers and module=gate
 * on GPT-2 used to be accepted and silently did nothing.) */
static void test_check_model(void) {
    fp8t_model_config gpt, llama;
    T_ASSERT(fp8t_model_preset(&gpt, "tiny") == 0 && fp8t_model_preset(&llama, "tiny-llama") == 0,
             "presets");
    struct {
        const char *spec;
        const fp8t_model_config *cfg;
        int ok;
        const char *needle;
    } cases[] = {
        {"layer=99,module=fc2,gemm=dgrad,kind=scale:64", &gpt, 0, "layer=99"},
        {"layer=2-9,gemm=dgrad,kind=scale:64", &gpt, 0, "end of the range"},
        {"module=gate,gemm=dgrad,kind=scale:64", &gpt, 0, "module=gate"},
        {"module=fc2+up,gemm=fprop,kind=nan", &gpt, 0, "module=up"},
        {"module=fc1,gemm=dgrad,kind=scale:64", &llama, 0, "module=fc1"},
        {"layer=3,module=fc2,gemm=dgrad,kind=scale:64", &gpt, 1, NULL},
        {"layer=all,module=mlp,gemm=dgrad,kind=scale:64", &gpt, 1, NULL},
        {"module=mlp,gemm=dgrad,kind=scale:64", &llama, 1, NULL},
        {"module=gate+head,gemm=fprop,kind=nan", &llama, 1, NULL},
        {"module=attn,gemm=wgrad,kind=scale:2", &gpt, 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        fp8t_injector *inj = fp8t_injector_create(cases[i].spec, err, sizeof err);
        T_ASSERT(inj, "%s: %s", cases[i].spec, err);
        int rc = fp8t_injector_check_model(inj, cases[i].cfg, err, sizeof err);
        fp8t_injector_destroy(inj);
        T_CHECK((rc == 0) == cases[i].ok, "%s: rc %d, err '%s'", cases[i].spec, rc, err);
        if (cases[i].needle)
            T_CHECK(strstr(err, cases[i].needle) != NULL, "%s: '%s' lacks '%s'", cases[i].spec,
                    err, cases[i].needle);
    }
}

int main(void) {
    t_suite = "inject";
    T_RUN(test_check_model);
    T_RUN(test_spec_parsing);
    T_RUN(test_scale_dgrad_only);
    T_RUN(test_when_fp8);
    T_RUN(test_when_bf16);
    T_RUN(test_outliers);
    T_RUN(test_nan);
    T_RUN(test_result_and_llama);
    T_RUN(test_stale_amax);
    T_RUN(test_corrupt_amax);
    T_MAIN_END();
}
