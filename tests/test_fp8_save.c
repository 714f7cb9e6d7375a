/* FP8 codes of X kept for the Wgrad (src/model: linear_plan.c's save_x, linear.c) against the switch
 * back to FP32 copies of X, FP8T_DISABLE_FP8_SAVE:
 *  - delayed and current FP8 runs (GPT-2 and Llama, gradient accumulation 2, an FP8 head, mixed
 *    policies, a backend that wants transposed copies) agree bit for bit: losses, gradients,
 *    parameters, FP8 state;
 *  - the backward quantizes exactly once fewer per linear whose Fprop and Wgrad share an FP8
 *    precision, and the forward no more often;
 *  - device memory: an all-FP8 model allocates the expected amount less (no [L, N, C] / [L, N, H]
 *    copies of ln1, ln2, fch_act; FP8 codes and one layer's scratch instead); a BF16 model
 *    allocates the layer copies at its first forward; destroy gives everything back;
 *  - a policy switch FP8 -> BF16 -> FP8 (the trainer's fallback), with frozen shadow-BF16 and
 *    validation forwards in between, stays bit-identical;
 *  - a hooked model sees at each Wgrad the same X its Fprop saw; a hook set between a forward
 *    and its backward leaves the gradients as they were.
 * The models run on a CPU backend whose op table is wrapped to count quantize kernels and device
 * bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/operand_kind.h"
#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "model_state_util.h"
#include "test.h"

static fp8t_backend *cpu;      /* the real backend */
static fp8t_backend counted;   /* a copy whose op table counts, below */
static fp8t_backend counted_t; /* the same, announcing fp8_wants_transpose */
static fp8t_backend_ops counted_ops;
static long n_quantize;

/* live device allocations: pointer and size */
enum { MAX_LIVE = 4096 };
static struct {
    void *p;
    size_t bytes;
} live[MAX_LIVE];
static int n_live, live_overflow;
static size_t live_bytes;

/* make_operand's per-tensor quantize kernel; fc2's of gelu(fch) and down's of SwiGLU (the
 * activation fused into the pass) count as the quantize they replace, and so do gate's and
 * up's dY of SwiGLU's gradients */
static void count_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand_kernel k = fp8t_operand_kernel_of(r);
    n_quantize +=
        k == FP8T_OPK_QUANTIZE || k == FP8T_OPK_QUANTIZE_GELU || k == FP8T_OPK_QUANTIZE_SWIGLU;
    cpu->ops->make_operand(b, r);
}

static void *count_malloc(fp8t_backend *b, size_t bytes) {
    void *p = cpu->ops->malloc(b, bytes);
    if (n_live < MAX_LIVE) {
        live[n_live].p = p;
        live[n_live].bytes = bytes;
        n_live++;
        live_bytes += bytes;
    } else {
        live_overflow = 1;
    }
    return p;
}

static void count_free(fp8t_backend *b, void *p) {
    for (int i = 0; i < n_live; i++)
        if (live[i].p == p) {
            live_bytes -= live[i].bytes;
            live[i] = live[--n_live];
            break;
        }
    cpu->ops->free(b, p);
}

/* A model on the counting backend be; nosave: created with FP8T_DISABLE_FP8_SAVE. */
static fp8t_model *make(fp8t_backend *be, const char *preset, const fp8t_policy *pol, int B,
                        int T, int nosave) {
    fp8t_model_config c;
    fp8t_model_preset(&c, preset);
    /* proj's X is the attention output, a layer save: BF16 saves off in both models, so that
     * the comparison is of the FP8 save alone */
    const fp8t_model_options opt = {.disable = (nosave ? (unsigned)FP8T_DISABLE_FP8_SAVE : 0u) |
                                               (unsigned)FP8T_DISABLE_BF16_SAVES};
    char err[256];
    fp8t_model *m = fp8t_model_create(be, &c, pol, &opt, B, T, err, sizeof(err));
    if (!m)
        printf("  create %s: %s\n", preset, err);
    else
        fp8t_model_init_weights(m, 777);
    return m;
}

static fp8t_policy policy(fp8t_precision prec, const char *overrides) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.history_len = 8;
    char err[256];
    if (overrides && fp8t_policy_add_overrides(&p, overrides, err, sizeof(err)) != 0)
        printf("  policy overrides '%s': %s\n", overrides, err);
    return p;
}

/* Micro-batch k: a learnable pattern with a few ignored targets. */
static void batch(int *tok, int *tgt, int N, int V, int k) {
    for (int i = 0; i < N; i++) {
        tok[i] = (k * 17 + i * 5) % V;
        tgt[i] = i % 13 == 4 ? -1 : (k * 17 + (i + 1) * 5 + (i % 4)) % V;
    }
}

/* Linears whose Fprop and Wgrad share a per-tensor FP8 precision: each saves one quantize of
 * X per micro-batch. */
static long saveable(const fp8t_model *m) {
    long n = 0;
    for (int lin = 0; lin < fp8t_model_num_linears(fp8t_model_get_config(m)); lin++) {
        fp8t_precision f = fp8t_model_gemm_precision(m, lin, FP8T_GEMM_FPROP);
        fp8t_precision w = fp8t_model_gemm_precision(m, lin, FP8T_GEMM_WGRAD);
        n += f == w && (f == FP8T_PREC_DELAYED || f == FP8T_PREC_CURRENT);
    }
    return n;
}

/* What a step of lockstep does besides the training micro-batches. */
typedef struct {
    const fp8t_policy *fallback; /* when set: the policy of steps 3 and 4 (the others: run) */
    const fp8t_policy *run;
    int frozen_forwards; /* shadow (frozen, BF16 policy) and validation forwards */
} extras;

typedef struct {
    long quant_fwd[2], quant_bwd[2], saved_expected;
} calls;

/* Train a (saving) and b (FP8T_DISABLE_FP8_SAVE) side by side for `steps` steps of `accum`
 * micro-batches; every loss, gradient, parameter and FP8 state entry must agree bit for bit. */
static void lockstep(const char *what, fp8t_model *a, fp8t_model *b, int B, int T, int steps,
                     int accum, const extras *ex, calls *out) {
    const int N = B * T, V = fp8t_model_get_config(a)->vocab_size;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    int *vtok = malloc((size_t)N * sizeof(int)), *vtgt = malloc((size_t)N * sizeof(int));
    fp8t_model *m[2] = {a, b};
    memset(out, 0, sizeof(*out));
    int bad_loss = 0, bad_state = 0, bad_pos = 0;
    char when[256];
    const float dloss = 1.0f / (float)accum;
    fp8t_policy bf16 = policy(FP8T_PREC_BF16, NULL);
    for (int s = 1; s <= steps; s++) {
        if (ex && ex->fallback) {
            const fp8t_policy *p = (s == 3 || s == 4) ? ex->fallback : ex->run;
            for (int k = 0; k < 2; k++) fp8t_model_set_policy(m[k], p);
        }
        for (int k = 0; k < 2; k++) fp8t_model_zero_grad(m[k]);
        for (int j = 0; j < accum; j++) {
            batch(tok, tgt, N, V, s * accum + j);
            float loss[2];
            for (int k = 0; k < 2; k++) {
                if (ex && ex->frozen_forwards && j == 0) {
                    /* the trainer's shadow BF16 forward of this batch and a validation one */
                    fp8t_policy keep = *fp8t_model_get_policy(m[k]);
                    fp8t_model_set_frozen(m[k], 1);
                    fp8t_model_set_policy(m[k], &bf16);
                    fp8t_model_forward(m[k], tok, tgt);
                    fp8t_model_set_policy(m[k], &keep);
                    batch(vtok, vtgt, N, V, 999);
                    fp8t_model_forward(m[k], vtok, vtgt);
                    fp8t_model_set_frozen(m[k], 0);
                }
                long q0 = n_quantize;
                loss[k] = fp8t_model_forward(m[k], tok, tgt);
                long q1 = n_quantize;
                fp8t_model_backward(m[k], dloss);
                out->quant_fwd[k] += q1 - q0;
                out->quant_bwd[k] += n_quantize - q1;
            }
            out->saved_expected += saveable(a);
            if (memcmp(&loss[0], &loss[1], sizeof(float)) && !bad_loss++)
                printf("  %s step %d micro %d: loss %.9g vs %.9g\n", what, s, j, loss[0],
                       loss[1]);
            if (!same_model_losses(cpu, a, b, N) && !bad_pos++)
                printf("  %s step %d micro %d: per-position losses differ\n", what, s, j);
            snprintf(when, sizeof(when), "%s step %d micro %d", what, s, j);
            if (diff_model_state(cpu, a, b, when)) bad_state++;
        }
        for (int k = 0; k < 2; k++) {
            float norm = fp8t_model_grad_norm(m[k]);
            fp8t_model_adamw(m[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, norm);
            fp8t_model_end_step(m[k]);
        }
    }
    snprintf(when, sizeof(when), "%s after the last step", what);
    T_CHECK(!bad_loss, "%s: %d micro-batches with different losses", what, bad_loss);
    T_CHECK(!bad_pos, "%s: %d micro-batches with different per-position losses", what, bad_pos);
    T_CHECK(!bad_state, "%s: %d micro-batches with different gradients/state", what, bad_state);
    T_CHECK(diff_model_state(cpu, a, b, when) == 0, "%s: params or FP8 state differ at the end",
            what);
    free(tok);
    free(tgt);
    free(vtok);
    free(vtgt);
}

/* One save-vs-plain comparison; checks the quantize calls saved. */
static void save_case(fp8t_backend *be, const char *preset, fp8t_precision prec,
                      const char *overrides, fp8t_precision head, const extras *ex,
                      int expect_saving) {
    const int B = 2, T = 16, steps = ex && ex->fallback ? 6 : 3, accum = 2;
    fp8t_policy p = policy(prec, overrides);
    p.head_precision = head;
    fp8t_model *s = make(be, preset, &p, B, T, 0), *q = make(be, preset, &p, B, T, 1);
    T_ASSERT(s && q, "create");
    char what[200];
    snprintf(what, sizeof(what), "%s %s%s%s head %s%s%s", preset, fp8t_precision_name(prec),
             overrides ? " " : "", overrides ? overrides : "", fp8t_precision_name(head),
             be->fp8_wants_transpose ? " transposed" : "", ex ? " with policy switches" : "");
    extras ex2;
    if (ex) {
        ex2 = *ex;
        ex2.run = &p;
    }
    calls c;
    lockstep(what, s, q, B, T, steps, accum, ex ? &ex2 : NULL, &c);
    T_CHECK(c.quant_fwd[0] == c.quant_fwd[1], "%s: forward quantize calls %ld (save) vs %ld",
            what, c.quant_fwd[0], c.quant_fwd[1]);
    T_CHECK(c.quant_bwd[1] - c.quant_bwd[0] == c.saved_expected,
            "%s: backward quantize calls %ld (save) vs %ld (plain), expected %ld fewer", what,
            c.quant_bwd[0], c.quant_bwd[1], c.saved_expected);
    if (expect_saving) T_CHECK(c.saved_expected > 0, "%s: nothing saved", what);
    fp8t_model_destroy(s);
    fp8t_model_destroy(q);
}

static void save_delayed(void) {
    save_case(&counted, "tiny", FP8T_PREC_DELAYED, NULL, FP8T_PREC_BF16, NULL, 1);
    save_case(&counted, "tiny-llama", FP8T_PREC_DELAYED, NULL, FP8T_PREC_BF16, NULL, 1);
    /* an FP8 head: its input lnf is kept anyway, its codes are reused too */
    save_case(&counted, "tiny", FP8T_PREC_DELAYED, NULL, FP8T_PREC_DELAYED, NULL, 1);
}

static void save_current(void) {
    save_case(&counted, "tiny", FP8T_PREC_CURRENT, NULL, FP8T_PREC_BF16, NULL, 1);
    save_case(&counted, "tiny-llama", FP8T_PREC_CURRENT, NULL, FP8T_PREC_CURRENT, NULL, 1);
}

static void save_only_when_allowed(void) {
    /* Fprop delayed, Wgrad current: another scale, X kept in FP32 and quantized again */
    save_case(&counted, "tiny", FP8T_PREC_DELAYED, "gemm=wgrad,precision=current", FP8T_PREC_BF16,
              NULL, 0);
    /* some layers' Wgrads in BF16 or block, or one module's: those keep X in FP32 (Llama up
     * in BF16 keeps ln2 for both up and gate, which still reads its codes) */
    save_case(&counted, "tiny", FP8T_PREC_CURRENT, "layers=0,gemm=wgrad,precision=bf16",
              FP8T_PREC_BF16, NULL, 1);
    save_case(&counted, "tiny-llama", FP8T_PREC_DELAYED,
              "layers=1-2,module=up,gemm=wgrad,precision=bf16", FP8T_PREC_BF16, NULL, 1);
    save_case(&counted, "tiny-llama", FP8T_PREC_DELAYED, "layers=last:1,precision=block",
              FP8T_PREC_BF16, NULL, 1);
}

/* The layout a Hopper backend reads (data_t of the Wgrad's X): the CPU's gemm_fp8 decodes
 * data_t when data is missing. */
static void save_transposed(void) {
    save_case(&counted_t, "tiny", FP8T_PREC_DELAYED, NULL, FP8T_PREC_BF16, NULL, 1);
    save_case(&counted_t, "tiny-llama", FP8T_PREC_CURRENT, NULL, FP8T_PREC_BF16, NULL, 1);
}

/* The trainer's fallback: FP8 for 2 steps, BF16 for 2, FP8 again; with a frozen shadow-BF16
 * forward and a validation forward before each step's first micro-batch. */
static void save_policy_switch(void) {
    fp8t_policy bf16 = policy(FP8T_PREC_BF16, NULL);
    extras ex = {&bf16, NULL, 1};
    save_case(&counted, "tiny", FP8T_PREC_DELAYED, NULL, FP8T_PREC_BF16, &ex, 1);
    save_case(&counted, "tiny-llama", FP8T_PREC_CURRENT, NULL, FP8T_PREC_BF16, &ex, 1);
    /* frozen forwards alone, on an FP8 model that never allocated the layer copies */
    extras fz = {NULL, NULL, 1};
    save_case(&counted, "tiny", FP8T_PREC_DELAYED, NULL, FP8T_PREC_BF16, &fz, 1);
}

/* ---- device memory ---- */

typedef struct {
    size_t created, trained;
} footprint;

/* Live device bytes of a model just created and after two training steps with a policy switch
 * to `then` (NULL: none) before the second; destroy must give every byte back. */
static footprint measure(const char *preset, const fp8t_policy *p, const fp8t_policy *then, int B,
                         int T, int nosave) {
    footprint f = {0, 0};
    const size_t before = live_bytes;
    fp8t_model *m = make(&counted, preset, p, B, T, nosave);
    if (!m) return f;
    f.created = live_bytes - before;
    const int N = B * T, V = fp8t_model_get_config(m)->vocab_size;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    for (int s = 1; s <= 2; s++) {
        if (s == 2 && then) fp8t_model_set_policy(m, then);
        fp8t_model_zero_grad(m);
        batch(tok, tgt, N, V, s);
        fp8t_model_forward(m, tok, tgt);
        fp8t_model_backward(m, 1.0f);
        fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, fp8t_model_grad_norm(m));
        fp8t_model_end_step(m);
    }
    f.trained = live_bytes - before;
    free(tok);
    free(tgt);
    fp8t_model_destroy(m);
    T_CHECK(live_bytes == before, "%s: %zu device bytes still allocated after destroy", preset,
            live_bytes - before);
    return f;
}

static void memory_case(const char *preset) {
    const int B = 2, T = 16;
    fp8t_model_config c;
    fp8t_model_preset(&c, preset);
    const size_t N = (size_t)B * T, L = c.n_layer, C = c.n_embd, H = c.mlp_hidden;
    const int llama = c.arch == FP8T_ARCH_LLAMA;
    /* FP32 [L, N, C] ln1 and ln2, [L, N, H] fch_act */
    const size_t fp32_copies = L * N * (2 * C + H) * sizeof(float);
    /* FP8 codes of every layer linear's input (head BF16): qkv, proj, fc1 | gate, up: C;
     * fc2 | down: H */
    const size_t codes = L * N * ((llama ? 4 : 3) * C + H);
    /* the one-layer home of ln1 / ln2 / fch_act */
    const size_t scratch = N * (H > C ? H : C) * sizeof(float);
    /* the plain path's Wgrad quantizes X into a scratch of the largest input, [N, H] (the
     * Fprop's code scratch is as large on both paths: dY's widest, H, is X's widest too) */
    const size_t wgrad_x_scratch = N * H;

    fp8t_policy fp8 = policy(FP8T_PREC_DELAYED, NULL), bf16 = policy(FP8T_PREC_BF16, NULL);
    footprint s = measure(preset, &fp8, NULL, B, T, 0), q = measure(preset, &fp8, NULL, B, T, 1);
    T_CHECK(q.created - s.created == fp32_copies,
            "%s fp8: created with %zu bytes, plain %zu: expected %zu fewer", preset, s.created,
            q.created, fp32_copies);
    const size_t want = fp32_copies + wgrad_x_scratch - codes - scratch;
    T_CHECK(s.trained < q.trained && q.trained - s.trained == want,
            "%s fp8: %zu bytes after training, plain %zu: expected %zu fewer", preset, s.trained,
            q.trained, want);
    /* BF16: every linear (the head too) keeps its X as a BF16 operand, 2 bytes per element,
     * instead of the FP32 layer copies, but Llama's up, which reads gate's (the same X:
     * x-share); the plain path's Wgrad rounds X into a scratch of the widest input, [N, H]
     * (the other BF16 scratch, dY's, is [N, H] on both paths: tiny's vocabulary is smaller
     * than H) */
    const size_t layer_x16 = L * N * (3 * C + H) * 2, head_x16 = N * C * 2;
    const size_t wgrad_x16_scratch = N * H * 2;
    footprint sb = measure(preset, &bf16, NULL, B, T, 0),
              qb = measure(preset, &bf16, NULL, B, T, 1);
    T_CHECK(qb.created - sb.created == fp32_copies, "%s bf16: created with %zu bytes, plain %zu",
            preset, sb.created, qb.created);
    const size_t want16 = fp32_copies + wgrad_x16_scratch - layer_x16 - head_x16 - scratch;
    T_CHECK(sb.trained < qb.trained && qb.trained - sb.trained == want16,
            "%s bf16: %zu bytes after training, plain %zu: expected %zu fewer", preset,
            sb.trained, qb.trained, want16);
    /* FP8, then a switch to BF16: the layers' BF16 operands of X and BF16 weight copies come
     * then, besides the codes (the head is BF16 in both; dY's BF16 scratch grows from the
     * head's [N, V] to [N, H]) */
    /* qkv 3C x C, proj C x C; fc1, fc2 | gate, up, down: H x C */
    const size_t layer_w16 = L * (4 * C * C + (llama ? 3 : 2) * C * H) * 2;
    const size_t V = (size_t)c.vocab_size, dy16_growth = H > V ? N * (H - V) * 2 : 0;
    footprint sw = measure(preset, &fp8, &bf16, B, T, 0);
    const size_t want_sw = s.trained + layer_x16 + layer_w16 + dy16_growth;
    T_CHECK(sw.trained == want_sw, "%s fp8 -> bf16: %zu bytes, expected %zu", preset, sw.trained,
            want_sw);
}

static void memory(void) {
    memory_case("tiny");
    memory_case("tiny-llama");
    T_CHECK(!live_overflow, "allocation table overflow");
}

/* ---- hooks ---- */

/* Remembers each linear's X at its Fprop and compares it with the X its Wgrad gets. */
typedef struct {
    int n_lin, N;
    float **fprop_x; /* [n_lin] host copies */
    size_t *fprop_n;
    long wgrad_inputs, mismatches;
} x_log;

static void x_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    x_log *h = ctx;
    (void)m;
    if (s->kind != FP8T_T_INPUT || fp8t_model_is_frozen(m)) return;
    const size_t n = (size_t)s->rows * s->cols;
    if (s->gemm == FP8T_GEMM_FPROP) {
        free(h->fprop_x[s->lin]);
        h->fprop_x[s->lin] = host_copy(cpu, x, n * sizeof(float));
        h->fprop_n[s->lin] = n;
    } else if (s->gemm == FP8T_GEMM_WGRAD) {
        float *w = host_copy(cpu, x, n * sizeof(float));
        h->wgrad_inputs++;
        if (!w || !h->fprop_x[s->lin] || h->fprop_n[s->lin] != n ||
            memcmp(w, h->fprop_x[s->lin], n * sizeof(float)))
            h->mismatches++;
        free(w);
    }
}

static void hooked_case(const char *preset, int hook_from_step) {
    const int B = 2, T = 16, N = B * T, steps = 3;
    fp8t_policy p = policy(FP8T_PREC_DELAYED, NULL);
    fp8t_model *s = make(&counted, preset, &p, B, T, 0), *q = make(&counted, preset, &p, B, T, 1);
    T_ASSERT(s && q, "create");
    const int n_lin = fp8t_model_num_linears(fp8t_model_get_config(s));
    x_log h[2];
    for (int k = 0; k < 2; k++) {
        memset(&h[k], 0, sizeof(h[k]));
        h[k].n_lin = n_lin;
        h[k].fprop_x = calloc((size_t)n_lin, sizeof(float *));
        h[k].fprop_n = calloc((size_t)n_lin, sizeof(size_t));
    }
    fp8t_model *m[2] = {s, q};
    const int V = fp8t_model_get_config(s)->vocab_size;
    int tok[32], tgt[32];
    long hooked_micro = 0, bad = 0;
    for (int st = 1; st <= steps; st++) {
        if (st == hook_from_step)
            for (int k = 0; k < 2; k++) fp8t_model_set_hook(m[k], x_hook, &h[k]);
        for (int k = 0; k < 2; k++) fp8t_model_zero_grad(m[k]);
        for (int j = 0; j < 2; j++) {
            batch(tok, tgt, N, V, st * 2 + j);
            for (int k = 0; k < 2; k++) {
                fp8t_model_forward(m[k], tok, tgt);
                fp8t_model_backward(m[k], 0.5f);
            }
            hooked_micro += st >= hook_from_step;
            if (diff_model_state(cpu, s, q, preset)) bad++;
        }
        for (int k = 0; k < 2; k++) {
            fp8t_model_adamw(m[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, st, 1.0f,
                             fp8t_model_grad_norm(m[k]));
            fp8t_model_end_step(m[k]);
        }
    }
    T_CHECK(bad == 0, "%s hooked from step %d: %ld micro-batches differ from the plain path",
            preset, hook_from_step, bad);
    for (int k = 0; k < 2; k++) {
        T_CHECK(h[k].wgrad_inputs == hooked_micro * n_lin,
                "%s %s: the hook saw %ld Wgrad inputs, expected %ld", preset,
                k ? "plain" : "saving", h[k].wgrad_inputs, hooked_micro * n_lin);
        T_CHECK(h[k].mismatches == 0, "%s %s: %ld Wgrad inputs differ from the Fprop's X", preset,
                k ? "plain" : "saving", h[k].mismatches);
        for (int i = 0; i < n_lin; i++) free(h[k].fprop_x[i]);
        free(h[k].fprop_x);
        free(h[k].fprop_n);
    }
    fp8t_model_destroy(s);
    fp8t_model_destroy(q);
}

static void hooked(void) {
    hooked_case("tiny", 1);
    hooked_case("tiny-llama", 1);
    /* the inspector switched on after steps that kept only FP8 codes */
    hooked_case("tiny", 2);
    hooked_case("tiny-llama", 3);
}

/* A hook set between a forward and its backward: the Wgrads whose forward kept X's codes run
 * from them (a note on stderr) and show the hook no X; the gradients are those of the same
 * model without the hook. */
static void hook_set_before_backward(void) {
    const int B = 2, T = 16, N = B * T;
    fp8t_policy p = policy(FP8T_PREC_DELAYED, NULL);
    fp8t_model *a = make(&counted, "tiny", &p, B, T, 0), *b = make(&counted, "tiny", &p, B, T, 0);
    T_ASSERT(a && b, "create");
    const int n_lin = fp8t_model_num_linears(fp8t_model_get_config(a));
    const long n_saving = saveable(a);
    x_log h;
    memset(&h, 0, sizeof(h));
    h.n_lin = n_lin;
    h.fprop_x = calloc((size_t)n_lin, sizeof(float *));
    h.fprop_n = calloc((size_t)n_lin, sizeof(size_t));
    int tok[32], tgt[32];
    batch(tok, tgt, N, fp8t_model_get_config(a)->vocab_size, 5);
    fp8t_model_forward(a, tok, tgt);
    fp8t_model_forward(b, tok, tgt);
    fp8t_model_set_hook(a, x_hook, &h);
    fp8t_model_backward(a, 1.0f);
    fp8t_model_backward(b, 1.0f);
    T_CHECK(diff_model_state(cpu, a, b, "hook set before the backward") == 0,
            "gradients differ from the unhooked model's");
    /* every linear kept its X (FP8 codes; the BF16 head a BF16 operand): the hook sees no
     * Wgrad input */
    T_CHECK(n_saving == n_lin - 1 && h.wgrad_inputs == 0,
            "the hook saw %ld Wgrad inputs, expected none", h.wgrad_inputs);
    for (int i = 0; i < n_lin; i++) free(h.fprop_x[i]);
    free(h.fprop_x);
    free(h.fprop_n);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
}

int main(void) {
    t_suite = "fp8_save";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!cpu) {
        printf("FAIL fp8_save: cpu backend: %s\n", err);
        return 1;
    }
    counted_ops = *cpu->ops;
    counted_ops.make_operand = count_make_operand;
    counted_ops.malloc = count_malloc;
    counted_ops.free = count_free;
    counted = *cpu;
    counted.ops = &counted_ops;
    counted_t = counted;
    counted_t.fp8_wants_transpose = 1;
    T_RUN(save_delayed);
    T_RUN(save_current);
    T_RUN(save_only_when_allowed);
    T_RUN(save_transposed);
    T_RUN(save_policy_switch);
    T_RUN(memory);
    T_RUN(hooked);
    T_RUN(hook_set_before_backward);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
