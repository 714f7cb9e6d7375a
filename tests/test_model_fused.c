/* The model's two memory-traffic savings against their switches back to the plain paths:
 *  - fused softmax + cross-entropy (one pass per micro-batch, FP8T_DISABLE_FUSED_XENT off):
 *    losses and gradients bit for bit, with dloss 1 and with gradient accumulation, with a
 *    dloss that changes, with the logits read after a training forward;
 *  - dY quantized once per linear backward (FP8T_DISABLE_CODE_REUSE off): delayed and
 *    current FP8 runs bit for bit, and the backend's quantize kernel run once fewer per linear;
 *  - BF16 operands (FP8T_DISABLE_BF16_OPERANDS off): BF16 runs (all-BF16, mixed with FP32 and
 *    FP8, hooked, fake quantization) bit for bit against gemm_bf16 on the FP32 operands, with
 *    a BF16 operand made once per weight per step and once per X and dY per micro-batch
 *    (GPT-2's fc2 input by the GELU step's kernel instead), and the biases added in the GEMM (no
 *    bias_add) unless a hook must see the output without them;
 *  - GELU applied by fc2's rounding pass (FP8T_DISABLE_GELU_FUSION off) and the bias
 *    gradients taken by the Dgrad's pass over dY (FP8T_DISABLE_BIAS_GRAD_FUSION off): bit for
 *    bit, with the one-pass kernels run where they apply and not where they do not;
 *  - and the others (options.disable bits), each alone and all at once (ALL_FUSION).
 * Two models run side by side on a CPU backend whose op table is wrapped to count calls (of
 * make_operand: by the kernel each request runs, operand_kind.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/operand_kind.h"
#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "model_state_util.h"
#include "test.h"

static fp8t_backend *cpu;    /* the real backend */
static fp8t_backend counted; /* a copy whose op table counts the calls below */
static fp8t_backend_ops counted_ops;
static long n_quantize, n_xent, n_to_bf16, n_bias_add, n_gelu16, n_qgelu, n_h16cs, n_qcs,
    n_bias_bwd;

static void count_xent(fp8t_backend *b, float *losses, float *dlogits, const float *logits,
                       const int *targets, int N, int V, float dloss) {
    n_xent++;
    cpu->ops->softmax_xent(b, losses, dlogits, logits, targets, N, V, dloss);
}

static long n_xent16;
static void count_xent16(fp8t_backend *b, float *losses, uint16_t *dlogits, float *amax_out,
                         float *dlogits32, const float *logits, int ld, const int *targets, int N,
                         int V, float dloss) {
    n_xent++;
    n_xent16++;
    cpu->ops->softmax_xent_bf16(b, losses, dlogits, amax_out, dlogits32, logits, ld, targets, N,
                                V, dloss);
}

static long n_qgelu_bias, n_gelu_bwd_bias, n_fp8_bias;
static void count_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                           const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                           int acc, int fast, float *amax_out, const float *bias) {
    n_fp8_bias += bias != NULL;
    cpu->ops->gemm_fp8(b, C, A, B, M, N, K, transA, transB, acc, fast, amax_out, bias);
}
static void count_gelu_bwd_bias(fp8t_backend *b, float *dx, const float *x, const float *bias,
                                const float *dout, int rows, int cols) {
    n_gelu_bwd_bias++;
    cpu->ops->gelu_backward_bias(b, dx, x, bias, dout, rows, cols);
}

/* make_operand, counted by the one-pass kernel that makes the request (operand_kind.h). The
 * fused GELU backward counts as the column-sum rounding it extends, and as a consumer of the
 * deferred fc1 bias when it gets one; n_gbwd counts it alone. The per-tensor and BF16 SwiGLU
 * kernels count as the plain rounding they extend (n_swiglu / n_dswiglu count them alone). The residual add folded into
 * the norm counts as the norm's fusion. */
static long n_gbwd, n_ln16;
static long n_swiglu, n_dswiglu; /* operands made with SwiGLU's step / a gradient's */
static long n_scaled;
static void count_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand_kernel k = fp8t_operand_kernel_of(r);
    n_scaled += k == FP8T_OPK_SCALED;
    if (k == FP8T_OPK_SCALED || k == FP8T_OPK_QUANTIZE_SWIGLU || k == FP8T_OPK_BF16_SWIGLU) {
        n_swiglu += r->step == FP8T_STEP_SWIGLU;
        n_dswiglu += r->step == FP8T_STEP_DSWIGLU_GATE || r->step == FP8T_STEP_DSWIGLU_UP;
    }
    switch (k) {
    case FP8T_OPK_QUANTIZE_SWIGLU:
    case FP8T_OPK_QUANTIZE: n_quantize++; break;
    case FP8T_OPK_QUANTIZE_COLSUM: n_qcs++; break;
    case FP8T_OPK_QUANTIZE_GELU: n_qgelu++, n_qgelu_bias += r->bias != NULL; break;
    case FP8T_OPK_QUANTIZE_DGELU: n_gbwd++, n_qcs++, n_gelu_bwd_bias += r->bias != NULL; break;
    case FP8T_OPK_BF16_SWIGLU:
    case FP8T_OPK_BF16: n_to_bf16++; break;
    case FP8T_OPK_BF16_COLSUM: n_h16cs++; break;
    case FP8T_OPK_BF16_GELU: n_gelu16++; break;
    case FP8T_OPK_BF16_DGELU: n_gbwd++, n_h16cs++, n_gelu_bwd_bias += r->bias != NULL; break;
    case FP8T_OPK_BF16_LAYERNORM:
    case FP8T_OPK_BF16_ADD_LAYERNORM:
    case FP8T_OPK_BF16_RMSNORM:
    case FP8T_OPK_BF16_ADD_RMSNORM: n_ln16++; break;
    default: break;
    }
    cpu->ops->make_operand(b, r);
}

/* the residual adds that take their linear's bias (without one, add_bias is the plain add) */
static long n_add_bias, n_res_add; /* add_bias with / without a bias */
static void count_add_bias(fp8t_backend *b, float *out, uint16_t *out16, const float *a,
                           const float *y, const float *bias, int N, int OC) {
    n_add_bias += bias != NULL;
    n_res_add += bias == NULL;
    cpu->ops->add_bias(b, out, out16, a, y, bias, N, OC);
}

static void count_bias_bwd(fp8t_backend *b, float *dbias, const float *dout, int N, int OC) {
    n_bias_bwd++;
    cpu->ops->bias_backward(b, dbias, dout, N, OC);
}

static void count_bias_add(fp8t_backend *b, float *out, const float *bias, int N, int OC) {
    n_bias_add++;
    cpu->ops->bias_add(b, out, bias, N, OC);
}

enum {
    PLAIN_XENT = FP8T_DISABLE_FUSED_XENT,
    NO_REUSE = FP8T_DISABLE_CODE_REUSE,
    NO_BF16_OPERANDS = FP8T_DISABLE_BF16_OPERANDS,
    NO_GELU_FUSION = FP8T_DISABLE_GELU_FUSION,
    NO_BIAS_GRAD_FUSION = FP8T_DISABLE_BIAS_GRAD_FUSION,
    NO_BF16_XENT = FP8T_DISABLE_BF16_XENT,
    NO_GELU_BWD_FUSION = FP8T_DISABLE_GELU_BWD_FUSION,
    NO_RESIDUAL_BIAS = FP8T_DISABLE_RESIDUAL_BIAS,
    NO_LN_FUSION = FP8T_DISABLE_LN_FUSION,
    NO_BF16_SAVES = FP8T_DISABLE_BF16_SAVES
};
static int make_vocab; /* when > 0: the preset's vocab_size replaced (odd sizes pad the logits) */
static int make_extra; /* switches every model made gets (both sides of a pair) */

/* A model on the counting backend; switches = PLAIN_XENT | NO_REUSE ...: the model options'
 * FP8T_DISABLE_* bits of the create. */
static fp8t_model *make(const char *preset, const fp8t_policy *pol, int B, int T, int switches) {
    fp8t_model_config c;
    if (!strcmp(preset, "tiny-llama-gqa")) {
        /* tiny-llama with the Llama-3 / Qwen2 features: 4 query heads on 2 K/V heads, its own
         * LM head, q/k/v biases, llama3 RoPE */
        fp8t_model_preset(&c, "tiny-llama");
        c.n_kv_head = 2, c.untied_head = 1, c.qkv_bias = 1;
        c.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 64};
    } else {
        fp8t_model_preset(&c, preset);
    }
    if (make_vocab > 0) c.vocab_size = make_vocab;
    switches |= make_extra;
    const fp8t_model_options opt = {.disable = (unsigned)switches};
    char err[256];
    fp8t_model *m = fp8t_model_create(&counted, &c, pol, &opt, B, T, err, sizeof(err));
    if (!m)
        printf("  create %s: %s\n", preset, err);
    else
        fp8t_model_init_weights(m, 4321);
    return m;
}

static fp8t_policy policy(fp8t_precision prec) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.history_len = 8;
    return p;
}

/* Micro-batch k: a learnable pattern with a few ignored targets. */
static void batch(int *tok, int *tgt, int N, int V, int k) {
    for (int i = 0; i < N; i++) {
        tok[i] = (k * 13 + i * 7) % V;
        tgt[i] = i % 11 == 5 ? -1 : (k * 13 + (i + 1) * 7 + (i % 3)) % V;
    }
}

static int same_bits(float a, float b) { return !memcmp(&a, &b, sizeof(float)); }

/* Train a (fused/reusing) and b (plain) side by side for `steps` steps of `accum`
 * micro-batches, micro-batch j of a step with backward dloss[j % n_dloss]; every loss and
 * every gradient must agree bit for bit. Returns the calls of softmax_xent / quantize made by
 * each model. */
typedef struct {
    long xent[2], quant[2], quant_bwd[2], to_bf16[2], bias_add[2], gelu16[2], qgelu[2];
    long h16cs[2], qcs[2], bias_bwd[2]; /* BF16 / FP8 operands with colsum, bias_backward */
    long fp8_bias[2];                   /* gemm_fp8 calls given a bias */
    long xent16[2];                     /* softmax_xent_bf16 (also counted in xent) */
    long gbwd[2];                       /* DGELU operands */
    long add_bias[2];
    long res_add[2]; /* add_bias without a bias: a residual add of its own */
    long ln16[2];    /* (ADD_)LAYERNORM operands */
    long swiglu[2], dswiglu[2];
    long scaled[2]; /* scaled operands (block / rowwise make_operand) */
} calls;

static void lockstep(const char *what, fp8t_model *a, fp8t_model *b, int B, int T, int steps,
                     int accum, const float *dloss, int n_dloss, calls *out) {
    const int N = B * T, V = fp8t_model_get_config(a)->vocab_size;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    fp8t_model *m[2] = {a, b};
    memset(out, 0, sizeof(*out));
    int bad_loss = 0, bad_state = 0, bad_pos = 0;
    char when[128];
    for (int s = 1; s <= steps; s++) {
        for (int k = 0; k < 2; k++) fp8t_model_zero_grad(m[k]);
        for (int j = 0; j < accum; j++) {
            batch(tok, tgt, N, V, s * accum + j);
            float loss[2];
            for (int k = 0; k < 2; k++) {
                long x0 = n_xent, q0 = n_quantize, h0 = n_to_bf16, b0 = n_bias_add, g0 = n_gelu16,
                     qg0 = n_qgelu, hc0 = n_h16cs, qc0 = n_qcs, bb0 = n_bias_bwd,
                     fb0 = n_fp8_bias, x16 = n_xent16, gw0 = n_gbwd, ab0 = n_add_bias,
                     ra0 = n_res_add, l0 = n_ln16, sw0 = n_swiglu, dsw0 = n_dswiglu,
                     sc0 = n_scaled;
                loss[k] = fp8t_model_forward(m[k], tok, tgt);
                long q1 = n_quantize;
                fp8t_model_backward(m[k], dloss[j % n_dloss]);
                out->to_bf16[k] += n_to_bf16 - h0;
                out->bias_add[k] += n_bias_add - b0;
                out->gelu16[k] += n_gelu16 - g0;
                out->qgelu[k] += n_qgelu - qg0;
                out->h16cs[k] += n_h16cs - hc0;
                out->qcs[k] += n_qcs - qc0;
                out->bias_bwd[k] += n_bias_bwd - bb0;
                out->fp8_bias[k] += n_fp8_bias - fb0;
                out->xent[k] += n_xent - x0;
                out->xent16[k] += n_xent16 - x16;
                out->gbwd[k] += n_gbwd - gw0;
                out->add_bias[k] += n_add_bias - ab0;
                out->res_add[k] += n_res_add - ra0;
                out->ln16[k] += n_ln16 - l0;
                out->swiglu[k] += n_swiglu - sw0;
                out->dswiglu[k] += n_dswiglu - dsw0;
                out->scaled[k] += n_scaled - sc0;
                out->quant[k] += n_quantize - q0;
                out->quant_bwd[k] += n_quantize - q1;
            }
            if (!same_bits(loss[0], loss[1]) && !bad_loss++)
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
}

/* ---- fused softmax + cross-entropy ---- */

static void xent_case(const char *preset, fp8t_precision prec, int accum, const float *dloss,
                      int n_dloss, long want_fused_xent) {
    const int B = 2, T = 16, steps = 3;
    fp8t_policy p = policy(prec);
    fp8t_model *f = make(preset, &p, B, T, 0), *q = make(preset, &p, B, T, PLAIN_XENT);
    if (!f || !q) {
        T_FAIL("create %s", preset);
        fp8t_model_destroy(f);
        fp8t_model_destroy(q);
        return;
    }
    char what[96];
    snprintf(what, sizeof(what), "%s %s accum %d", preset, fp8t_precision_name(prec), accum);
    calls c;
    lockstep(what, f, q, B, T, steps, accum, dloss, n_dloss, &c);
    /* plain: a loss pass and a gradient pass per micro-batch */
    T_CHECK(c.xent[1] == 2L * steps * accum, "%s: plain path made %ld xent passes", what,
            c.xent[1]);
    T_CHECK(c.xent[0] == want_fused_xent, "%s: fused path made %ld xent passes, expected %ld",
            what, c.xent[0], want_fused_xent);
    fp8t_model_destroy(f);
    fp8t_model_destroy(q);
}

static void xent_dloss_one(void) {
    const float one = 1.0f;
    /* the first micro-batch of a model runs plain (its dloss is learnt by that backward),
     * every later one makes a single pass */
    xent_case("tiny", FP8T_PREC_BF16, 1, &one, 1, 3 + 1);
    xent_case("tiny-llama", FP8T_PREC_FP8, 1, &one, 1, 3 + 1);
    xent_case("tiny", FP8T_PREC_FP32, 2, &one, 1, 6 + 1);
}

static void xent_grad_accumulation(void) {
    /* the trainer's 1/accum, not a power of two: folded into the forward's d, so no
     * rescaling rounds differently */
    const float third = 1.0f / 3.0f;
    xent_case("tiny", FP8T_PREC_FP8, 3, &third, 1, 9 + 1);
    xent_case("tiny-llama", FP8T_PREC_BF16, 3, &third, 1, 9 + 1);
}

static void xent_dloss_changes(void) {
    /* a dloss that differs from the previous backward's: the logits are rebuilt by the head
     * GEMM and the plain pass runs (2 extra passes each time dloss changes) */
    const float d[3] = {0.25f, 0.7f, 0.7f};
    /* 3 steps x 3 micro-batches: 2 passes for the first (plain), 1 for each of the other 8,
     * plus 1 for each of the 5 later dloss changes (0.25 -> 0.7 -> 0.7 -> 0.25 -> ...) */
    xent_case("tiny", FP8T_PREC_BF16, 3, d, 3, 2 + 8 + 5);
    /* an FP8 head (current scaling) is rebuilt exactly too */
    const int B = 2, T = 16;
    fp8t_policy p = policy(FP8T_PREC_CURRENT);
    p.head_precision = FP8T_PREC_CURRENT;
    fp8t_model *f = make("tiny-llama", &p, B, T, 0),
               *q = make("tiny-llama", &p, B, T, PLAIN_XENT);
    T_ASSERT(f && q, "create");
    calls c;
    lockstep("tiny-llama fp8 head, changing dloss", f, q, B, T, 2, 3, d, 3, &c);
    fp8t_model_destroy(f);
    fp8t_model_destroy(q);
}

/* The logits of a training forward stay readable: fp8t_model_logits rebuilds them. */
static void xent_logits_readable(void) {
    const int B = 2, T = 16;
    fp8t_precision heads[2] = {FP8T_PREC_BF16, FP8T_PREC_DELAYED};
    for (int h = 0; h < 2; h++) {
        fp8t_policy p = policy(FP8T_PREC_FP8);
        p.head_precision = heads[h];
        fp8t_model *f = make("tiny", &p, B, T, 0), *q = make("tiny", &p, B, T, PLAIN_XENT);
        T_ASSERT(f && q, "create");
        const int N = B * T, V = fp8t_model_get_config(f)->vocab_size;
        const size_t nl = (size_t)N * V;
        int tok[32], tgt[32];
        fp8t_model *m[2] = {f, q};
        float *lg[2][2];
        for (int k = 0; k < 2; k++) {
            batch(tok, tgt, N, V, 1);
            fp8t_model_forward(m[k], tok, tgt);
            fp8t_model_backward(m[k], 1.0f); /* f fuses from now on */
            fp8t_model_zero_grad(m[k]);
            batch(tok, tgt, N, V, 2);
            fp8t_model_forward(m[k], tok, NULL);
            lg[k][0] = host_copy(cpu, fp8t_model_logits(m[k]), nl * sizeof(float));
            long x0 = n_xent;
            fp8t_model_forward(m[k], tok, tgt);
            lg[k][1] = host_copy(cpu, fp8t_model_logits(m[k]), nl * sizeof(float));
            fp8t_model_backward(m[k], 1.0f);
            if (k == 0)
                T_CHECK(n_xent - x0 == 2, "head %s: %ld xent passes after a logits read",
                        fp8t_precision_name(heads[h]), n_xent - x0);
        }
        int ok = 1;
        for (int k = 0; k < 2; k++)
            ok &= lg[k][0] && lg[k][1] && !memcmp(lg[k][0], lg[k][1], nl * 4);
        T_CHECK(ok, "head %s: logits after a forward with targets differ from those without",
                fp8t_precision_name(heads[h]));
        T_CHECK(lg[0][1] && lg[1][1] && !memcmp(lg[0][1], lg[1][1], nl * 4),
                "head %s: fused and plain logits differ", fp8t_precision_name(heads[h]));
        T_CHECK(diff_model_state(cpu, f, q, "after a logits read") == 0,
                "head %s: gradients differ", fp8t_precision_name(heads[h]));
        for (int k = 0; k < 2; k++) free(lg[k][0]), free(lg[k][1]);
        fp8t_model_destroy(f);
        fp8t_model_destroy(q);
    }
}

/* Frozen forwards (validation) and hooked models keep the plain path. */
static void noop_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)ctx, (void)m, (void)s, (void)x;
}

static void xent_not_fused_when_frozen_or_hooked(void) {
    const int B = 2, T = 16;
    fp8t_policy p = policy(FP8T_PREC_BF16);
    fp8t_model *f = make("tiny", &p, B, T, 0);
    T_ASSERT(f, "create");
    const int N = B * T, V = fp8t_model_get_config(f)->vocab_size;
    int tok[32], tgt[32];
    batch(tok, tgt, N, V, 3);
    fp8t_model_forward(f, tok, tgt);
    fp8t_model_backward(f, 1.0f);
    const size_t nl = (size_t)N * V;
    fp8t_model_set_frozen(f, 1);
    fp8t_model_forward(f, tok, NULL);
    float *l0 = host_copy(cpu, fp8t_model_logits(f), nl * sizeof(float));
    long x0 = n_xent;
    fp8t_model_forward(f, tok, tgt);
    T_CHECK(n_xent - x0 == 1, "frozen forward: %ld xent passes", n_xent - x0);
    float *l1 = host_copy(cpu, fp8t_model_logits(f), nl * sizeof(float));
    T_CHECK(n_xent - x0 == 1 && l0 && l1 && !memcmp(l0, l1, nl * 4),
            "a frozen forward changed the logits");
    fp8t_model_set_frozen(f, 0);
    fp8t_model_set_hook(f, noop_hook, NULL);
    x0 = n_xent;
    fp8t_model_forward(f, tok, tgt);
    fp8t_model_backward(f, 1.0f);
    T_CHECK(n_xent - x0 == 2, "hooked model: %ld xent passes (plain path: 2)", n_xent - x0);
    free(l0);
    free(l1);
    fp8t_model_destroy(f);
}

/* ---- the switch tests' common run ---- */

/* One switch test: r with the defaults and q with `switches` off (the plain path), the same
 * policy (prec plus overrides), both hooked when asked, trained side by side for PAIR_STEPS
 * steps of PAIR_ACCUM micro-batches by lockstep (which checks them bit for bit). The caller
 * checks pr->c and destroys pr->r and pr->q. Returns 0 when a model could not be made. */
#define PAIR_B 2
#define PAIR_T 16
#define PAIR_STEPS 3
#define PAIR_ACCUM 2
typedef struct {
    fp8t_model *r, *q;
    calls c;
    char what[200];
} pair_run;

static int run_pair(pair_run *pr, const char *preset, fp8t_precision prec, const char *overrides,
                    int hooked, int switches, const char *label) {
    fp8t_policy p = policy(prec);
    char err[256];
    memset(pr, 0, sizeof(*pr));
    if (overrides && fp8t_policy_add_overrides(&p, overrides, err, sizeof(err)) != 0) {
        T_CHECK(0, "%s", err);
        return 0;
    }
    pr->r = make(preset, &p, PAIR_B, PAIR_T, 0);
    pr->q = make(preset, &p, PAIR_B, PAIR_T, switches);
    if (!pr->r || !pr->q) {
        T_CHECK(0, "create %s", preset);
        fp8t_model_destroy(pr->r);
        fp8t_model_destroy(pr->q);
        return 0;
    }
    if (hooked) {
        fp8t_model_set_hook(pr->r, noop_hook, NULL);
        fp8t_model_set_hook(pr->q, noop_hook, NULL);
    }
    snprintf(pr->what, sizeof(pr->what), "%s %s%s%s%s %s", preset, fp8t_precision_name(prec),
             overrides ? " " : "", overrides ? overrides : "", hooked ? " hooked" : "", label);
    const float d = 1.0f / PAIR_ACCUM;
    lockstep(pr->what, pr->r, pr->q, PAIR_B, PAIR_T, PAIR_STEPS, PAIR_ACCUM, &d, 1, &pr->c);
    return 1;
}

/* ---- dY quantized once per linear backward ---- */

/* Linears whose Dgrad and Wgrad share a per-tensor FP8 precision: the quantize calls saved
 * per backward. */
static long reusable(const fp8t_model *m) {
    long n = 0;
    for (int lin = 0; lin < fp8t_model_num_linears(fp8t_model_get_config(m)); lin++) {
        fp8t_precision d = fp8t_model_gemm_precision(m, lin, FP8T_GEMM_DGRAD);
        fp8t_precision w = fp8t_model_gemm_precision(m, lin, FP8T_GEMM_WGRAD);
        n += d == w && (d == FP8T_PREC_DELAYED || d == FP8T_PREC_CURRENT);
    }
    return n;
}

static void reuse_case(const char *preset, fp8t_precision prec, const char *overrides,
                       int hooked) {
    pair_run pr;
    if (!run_pair(&pr, preset, prec, overrides, hooked, NO_REUSE, "code reuse")) return;
    fp8t_model *r = pr.r, *q = pr.q;
    const calls c = pr.c;
    const char *what = pr.what;
    const int steps = PAIR_STEPS, accum = PAIR_ACCUM;

    const long saved = hooked ? 0 : reusable(r) * steps * accum;
    T_CHECK(c.quant_bwd[1] - c.quant_bwd[0] == saved,
            "%s: backward quantize calls %ld (reuse) vs %ld (plain), expected %ld fewer", what,
            c.quant_bwd[0], c.quant_bwd[1], saved);
    T_CHECK(c.quant[1] - c.quant[0] == saved, "%s: forward quantize calls changed", what);
    if (!hooked && !overrides)
        T_CHECK(saved > 0, "%s: nothing to reuse (%ld linears)", what, reusable(r));
    fp8t_model_destroy(r);
    fp8t_model_destroy(q);
}

static void reuse_delayed(void) {
    reuse_case("tiny", FP8T_PREC_DELAYED, NULL, 0);
    reuse_case("tiny-llama", FP8T_PREC_DELAYED, NULL, 0);
    reuse_case("tiny-llama-gqa", FP8T_PREC_DELAYED, NULL, 0);
}

static void reuse_current(void) {
    reuse_case("tiny", FP8T_PREC_CURRENT, NULL, 0);
    reuse_case("tiny-llama", FP8T_PREC_CURRENT, NULL, 0);
}

static void reuse_only_when_allowed(void) {
    /* Dgrad delayed, Wgrad current: different scales, no reuse; BF16 Wgrad in some layers */
    reuse_case("tiny", FP8T_PREC_DELAYED, "gemm=wgrad,precision=current", 0);
    reuse_case("tiny-llama", FP8T_PREC_CURRENT, "layers=0,gemm=wgrad,precision=bf16", 0);
    /* a hook may change dY between the two GEMMs */
    reuse_case("tiny", FP8T_PREC_DELAYED, NULL, 1);
}

/* ---- BF16 operands: rounded once, shared, cached; the bias in the GEMM ---- */

static void bf16_case(const char *preset, fp8t_precision prec, const char *overrides,
                      int hooked) {
    pair_run pr;
    if (!run_pair(&pr, preset, prec, overrides, hooked, NO_BF16_OPERANDS, "bf16 operands"))
        return;
    fp8t_model *r = pr.r, *q = pr.q;
    const calls c = pr.c;
    const char *what = pr.what;
    const int B = PAIR_B, T = PAIR_T, steps = PAIR_STEPS, accum = PAIR_ACCUM;

    T_CHECK(c.to_bf16[1] == 0, "%s: the plain path called to_bf16 %ld times", what, c.to_bf16[1]);
    /* a frozen (validation) forward: its operands go to scratch, nothing is recorded */
    {
        const int N = B * T, V = fp8t_model_get_config(r)->vocab_size;
        int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
        batch(tok, tgt, N, V, 99);
        fp8t_model_set_frozen(r, 1);
        fp8t_model_set_frozen(q, 1);
        float lr = fp8t_model_forward(r, tok, tgt), lq = fp8t_model_forward(q, tok, tgt);
        T_CHECK(same_bits(lr, lq) && same_model_losses(cpu, r, q, N),
                "%s: frozen forward loss %.9g vs plain %.9g", what, lr, lq);
        fp8t_model_set_frozen(r, 0);
        fp8t_model_set_frozen(q, 0);
        T_CHECK(diff_model_state(cpu, r, q, "after a frozen forward") == 0,
                "%s: a frozen forward changed the state differently", what);
        free(tok);
        free(tgt);
    }
    const fp8t_model_config *cfg = fp8t_model_get_config(r);
    const int n_lin = fp8t_model_num_linears(cfg);
    if (prec == FP8T_PREC_BF16 && !overrides) {
        /* every GEMM BF16: the weights once per step; X once per micro-batch (the Wgrad takes
         * the Fprop's operand unless hooked) and dY once (twice when hooked); GPT-2's fc2
         * input comes rounded from GELU itself unless hooked */
        const long per_micro = hooked ? 4L * n_lin : 2L * n_lin;
        const long gelu16 = cfg->arch == FP8T_ARCH_GPT2 && !hooked ? (long)cfg->n_layer : 0;
        /* the head's dY comes rounded from softmax_xent_bf16 in every micro-batch but the
         * model's first (unhooked) */
        const long xent16 = hooked ? 0 : (long)steps * accum - 1;
        /* and GPT-2's qkv and fc1 inputs come rounded from their LayerNorm, Llama's qkv and
         * gate inputs from their RMSNorm */
        const long ln16 = !hooked ? 2L * cfg->n_layer : 0;
        /* and Llama's up takes the operand gate made of the same X */
        const long xshare = cfg->arch == FP8T_ARCH_LLAMA && !hooked ? (long)cfg->n_layer : 0;
        const long want =
            (long)steps * (n_lin + accum * (per_micro - gelu16 - ln16 - xshare)) - xent16;
        T_CHECK(c.ln16[0] == (long)steps * accum * ln16 && c.ln16[1] == 0,
                "%s: layernorm_forward_bf16 called %ld times (plain %ld), expected %ld", what,
                c.ln16[0], c.ln16[1], (long)steps * accum * ln16);
        T_CHECK(c.xent16[0] == xent16 && c.xent16[1] == 0,
                "%s: softmax_xent_bf16 called %ld times (plain %ld), expected %ld", what,
                c.xent16[0], c.xent16[1], xent16);
        T_CHECK(c.to_bf16[0] + c.h16cs[0] == want,
                "%s: to_bf16 (+ to_bf16_colsum) called %ld (+ %ld) times, expected %ld", what,
                c.to_bf16[0], c.h16cs[0], want);
        T_CHECK(c.gelu16[0] == (long)steps * accum * gelu16 && c.gelu16[1] == 0,
                "%s: gelu_forward_bf16 called %ld times (plain %ld), expected %ld", what,
                c.gelu16[0], c.gelu16[1], (long)steps * accum * gelu16);
        /* GPT-2's layer linears have biases (a qkv_bias Llama's qkv): added in the GEMM unless a
         * hook watches */
        const long biases = cfg->arch == FP8T_ARCH_GPT2 ? 4L * cfg->n_layer
                            : cfg->qkv_bias             ? (long)cfg->n_layer
                                                        : 0;
        /* (plain: qkv and fc1 with bias_add; proj and fc2 leave theirs to the residual add;
         * a Llama's only biases are qkv's, Qwen2 style) */
        const long plain_biases = hooked || cfg->arch != FP8T_ARCH_GPT2 ? biases : biases / 2;
        T_CHECK(c.bias_add[1] == (long)steps * accum * plain_biases,
                "%s: the plain path added %ld biases, expected %ld", what, c.bias_add[1],
                (long)steps * accum * plain_biases);
        T_CHECK(c.bias_add[0] == (hooked ? (long)steps * accum * biases : 0),
                "%s: bias_add called %ld times (plain %ld)", what, c.bias_add[0], c.bias_add[1]);
        /* and their gradients come from the Dgrad's rounding pass over dY */
        T_CHECK(c.bias_bwd[1] == (long)steps * accum * biases &&
                    c.bias_bwd[0] == (hooked ? c.bias_bwd[1] : 0) &&
                    c.h16cs[0] == (hooked ? 0 : (long)steps * accum * biases),
                "%s: bias_backward %ld (plain %ld), to_bf16_colsum %ld", what, c.bias_bwd[0],
                c.bias_bwd[1], c.h16cs[0]);
    } else {
        T_CHECK(c.to_bf16[0] > 0, "%s: no BF16 operand made (the head is BF16)", what);
    }
    fp8t_model_destroy(r);
    fp8t_model_destroy(q);
}

static void bf16_operands(void) {
    bf16_case("tiny", FP8T_PREC_BF16, NULL, 0);
    bf16_case("tiny-llama", FP8T_PREC_BF16, NULL, 0);
    bf16_case("tiny-llama-gqa", FP8T_PREC_BF16, NULL, 0);
    bf16_case("tiny", FP8T_PREC_BF16, NULL, 1);
}

static void bf16_operands_mixed(void) {
    /* BF16 Fprop with an FP32 Wgrad: X is not kept as BF16; FP8 layers around BF16 ones and
     * the BF16 head; fake quantization (its GEMM stays gemm_bf16) */
    bf16_case("tiny", FP8T_PREC_BF16, "gemm=wgrad,precision=fp32", 0);
    bf16_case("tiny-llama", FP8T_PREC_DELAYED, "layers=1-2,precision=bf16", 0);
    bf16_case("tiny", FP8T_PREC_CURRENT, "layers=0,gemm=dgrad,precision=bf16", 0);
    bf16_case("tiny", FP8T_PREC_FAKE, NULL, 0);
}

/* ---- GELU applied by fc2's rounding pass ---- */

/* want_bias_per_micro: fc1's bias left to fc2's pass (FP8 fc1, delayed fc2) */
static void gelu_case(const char *overrides, fp8t_precision prec, int hooked, long want_per_micro,
                      long want_bias_per_micro) {
    /* the deferred-bias ops are counted over both models (the plain one never calls them) */
    const long qb0 = n_qgelu_bias, gb0 = n_gelu_bwd_bias;
    pair_run pr;
    if (!run_pair(&pr, "tiny", prec, overrides, hooked, NO_GELU_FUSION, "gelu fusion")) return;
    fp8t_model *r = pr.r, *q = pr.q;
    const calls c = pr.c;
    const char *what = pr.what;
    const int steps = PAIR_STEPS, accum = PAIR_ACCUM;

    const long wb = (long)steps * accum * want_bias_per_micro;
    /* the backward adds the deferred bias only where fch was kept in FP32: a BF16 copy of fch
     * took the bias when it was made (these cases' layers all run below FP32, so they keep
     * BF16 copies unless FP8TRAIN_NO_BF16_SAVES) */
    const long wb_bwd = (make_extra & NO_BF16_SAVES) || hooked ? wb : 0;
    T_CHECK(n_qgelu_bias - qb0 == wb && n_gelu_bwd_bias - gb0 == wb_bwd,
            "%s: deferred fc1 biases %ld forward / %ld backward, expected %ld / %ld", what,
            n_qgelu_bias - qb0, n_gelu_bwd_bias - gb0, wb, wb_bwd);
    T_CHECK(c.fp8_bias[1] - c.fp8_bias[0] == wb,
            "%s: FP8 GEMMs given a bias %ld vs plain %ld, expected %ld fewer", what,
            c.fp8_bias[0], c.fp8_bias[1], wb);
    const long fused = c.gelu16[0] + c.qgelu[0], want = (long)steps * accum * want_per_micro;
    T_CHECK(fused == want && c.gelu16[1] + c.qgelu[1] == 0,
            "%s: fc2 applied GELU %ld times (plain %ld), expected %ld", what, fused,
            c.gelu16[1] + c.qgelu[1], want);
    fp8t_model_destroy(r);
    fp8t_model_destroy(q);
}

static void gelu_fusion(void) {
    const long L = 4; /* tiny's layers */
    /* BF16 fc1 adds its bias in the GEMM: nothing to defer */
    gelu_case(NULL, FP8T_PREC_BF16, 0, L, 0);
    gelu_case(NULL, FP8T_PREC_DELAYED, 0, L, L);
    /* current scaling needs the amax of GELU's output before its pass: not fused */
    gelu_case(NULL, FP8T_PREC_CURRENT, 0, 0, 0);
    /* a hook sees GELU's output; an FP32 Wgrad reads it: not fused */
    gelu_case(NULL, FP8T_PREC_DELAYED, 1, 0, 0);
    gelu_case("module=fc2,gemm=wgrad,precision=fp32", FP8T_PREC_DELAYED, 0, 0, 0);
    /* mixed: layers 0-1 delayed (deferred), 2-3 BF16 */
    gelu_case("layers=2-3,precision=bf16", FP8T_PREC_DELAYED, 0, L, L / 2);
    /* current-scaled fc1 into a delayed fc2: deferred */
    gelu_case("module=fc1,precision=current", FP8T_PREC_DELAYED, 0, L, L);
    /* fch kept in FP32 (FP8TRAIN_NO_BF16_SAVES): the backward adds the deferred bias */
    make_extra = NO_BF16_SAVES;
    gelu_case(NULL, FP8T_PREC_DELAYED, 0, L, L);
    gelu_case("layers=2-3,precision=bf16", FP8T_PREC_DELAYED, 0, L, L / 2);
    make_extra = 0;
}

/* ---- bias gradients from the Dgrad's pass over dY ---- */

static void colsum_case(const char *preset, fp8t_precision prec, int hooked) {
    pair_run pr;
    if (!run_pair(&pr, preset, prec, NULL, hooked, NO_BIAS_GRAD_FUSION, "bias-grad fusion"))
        return;
    fp8t_model *r = pr.r, *q = pr.q;
    const calls c = pr.c;
    const char *what = pr.what;
    const int steps = PAIR_STEPS, accum = PAIR_ACCUM;

    const fp8t_model_config *cfg = fp8t_model_get_config(r);
    const long biases = cfg->arch == FP8T_ARCH_GPT2 ? 4L * cfg->n_layer
                        : cfg->qkv_bias             ? (long)cfg->n_layer
                                                    : 0;
    const long fused = hooked ? 0 : (long)steps * accum * biases;
    T_CHECK(c.qcs[0] + c.h16cs[0] == fused && c.qcs[1] + c.h16cs[1] == 0,
            "%s: fused column sums %ld (plain %ld), expected %ld", what, c.qcs[0] + c.h16cs[0],
            c.qcs[1] + c.h16cs[1], fused);
    T_CHECK(c.bias_bwd[1] - c.bias_bwd[0] == fused, "%s: bias_backward %ld vs plain %ld", what,
            c.bias_bwd[0], c.bias_bwd[1]);
    fp8t_model_destroy(r);
    fp8t_model_destroy(q);
}

static void bias_grad_fusion(void) {
    colsum_case("tiny", FP8T_PREC_DELAYED, 0);
    colsum_case("tiny", FP8T_PREC_CURRENT, 0);
    colsum_case("tiny", FP8T_PREC_BF16, 0);
    colsum_case("tiny", FP8T_PREC_DELAYED, 1);
    colsum_case("tiny-llama", FP8T_PREC_DELAYED, 0);     /* no biases: nothing to fuse */
    colsum_case("tiny-llama-gqa", FP8T_PREC_DELAYED, 0); /* qkv's bias (Qwen2) */
    colsum_case("tiny-llama-gqa", FP8T_PREC_BF16, 0);
}

/* ---- the head's gradient written as its BF16 operand by the cross-entropy pass ---- */

/* Against FP8T_DISABLE_BF16_XENT (the FP32 fused pass, then to_bf16 in the backward): bit
 * for bit, with softmax_xent_bf16 in every micro-batch but the first where the head's three
 * GEMMs are BF16 (not with an FP8 head or a hook), and one to_bf16 fewer each time. vocab: odd
 * sizes pad the logits rows (V = 251 -> 256 floats apart). */
static void bf16_xent_case(const char *preset, int vocab, fp8t_precision prec,
                           const char *overrides, int hooked, long want) {
    pair_run pr;
    make_vocab = vocab;
    int ok = run_pair(&pr, preset, prec, overrides, hooked, NO_BF16_XENT, "bf16 xent");
    make_vocab = 0;
    if (!ok) return;
    char what[240];
    snprintf(what, sizeof what, "%s vocab %d", pr.what, vocab);
    T_CHECK(pr.c.xent16[0] == want && pr.c.xent16[1] == 0,
            "%s: softmax_xent_bf16 called %ld times (switched off: %ld), expected %ld", what,
            pr.c.xent16[0], pr.c.xent16[1], want);
    T_CHECK(pr.c.to_bf16[1] - pr.c.to_bf16[0] == want,
            "%s: to_bf16 called %ld times vs %ld switched off, expected %ld fewer", what,
            pr.c.to_bf16[0], pr.c.to_bf16[1], want);
    T_CHECK(pr.c.xent[0] == pr.c.xent[1], "%s: %ld cross-entropy passes vs %ld", what,
            pr.c.xent[0], pr.c.xent[1]);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void bf16_xent(void) {
    const long fused = (long)PAIR_STEPS * PAIR_ACCUM - 1;
    bf16_xent_case("tiny", 251, FP8T_PREC_BF16, NULL, 0, fused);
    bf16_xent_case("tiny", 256, FP8T_PREC_BF16, NULL, 0, fused);
    bf16_xent_case("tiny-llama", 61, FP8T_PREC_DELAYED, NULL, 0, fused); /* the head stays BF16 */
    bf16_xent_case("tiny-llama-gqa", 61, FP8T_PREC_DELAYED, NULL, 0, fused); /* untied head */
    bf16_xent_case("tiny", 251, FP8T_PREC_CURRENT, "module=head,precision=current", 0, 0);
    bf16_xent_case("tiny", 251, FP8T_PREC_BF16, "module=head,gemm=wgrad,precision=fp32", 0, 0);
    bf16_xent_case("tiny", 251, FP8T_PREC_BF16, NULL, 1, 0);
}

/* A dloss that changes with an odd vocabulary: the padded logits are rebuilt packed and the
 * plain pass runs, bit for bit the path without the BF16 gradient. When they cannot be rebuilt
 * (the weights changed in between), the BF16 gradient is scaled: within BF16 rounding of the
 * plain path's. */
static void bf16_xent_dloss_changes(void) {
    const float d[3] = {0.25f, 0.7f, 0.7f};
    make_vocab = 251;
    xent_case("tiny", FP8T_PREC_BF16, 3, d, 3, 2 + 8 + 5);
    const int B = 2, T = 16;
    fp8t_policy p = policy(FP8T_PREC_BF16);
    fp8t_model *f = make("tiny", &p, B, T, 0),
               *q = make("tiny", &p, B, T, NO_BF16_XENT | PLAIN_XENT);
    make_vocab = 0;
    T_ASSERT(f && q, "create");
    const int N = B * T, V = 251;
    int tok[32], tgt[32];
    fp8t_model *m[2] = {f, q};
    for (int k = 0; k < 2; k++) {
        batch(tok, tgt, N, V, 1);
        fp8t_model_forward(m[k], tok, tgt);
        fp8t_model_backward(m[k], 1.0f); /* f fuses from now on, with dloss 1 */
        batch(tok, tgt, N, V, 2);
        fp8t_model_forward(m[k], tok, tgt);
        /* the weights change between the forward and its backward: no rebuild possible */
        fp8t_model_adamw(m[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, 1.0f);
        fp8t_model_zero_grad(m[k]);
        long x0 = n_xent;
        fp8t_model_backward(m[k], 0.375f);
        if (k == 0) T_CHECK(n_xent == x0, "the backward made a cross-entropy pass");
    }
    size_t np = fp8t_model_num_params(f);
    float *gf = host_copy(cpu, fp8t_model_grads(f), np * 4),
          *gq = host_copy(cpu, fp8t_model_grads(q), np * 4);
    double num = 0, den = 0;
    int finite = 1;
    for (size_t i = 0; i < np; i++) {
        finite &= isfinite(gf[i]) != 0;
        num += ((double)gf[i] - gq[i]) * ((double)gf[i] - gq[i]);
        den += (double)gq[i] * gq[i];
    }
    /* a BF16 operand carries 2^-9 relative rounding; scaling afterwards moves it by a few
     * roundings more, far below 1% of the gradient's norm, while a missing scale would be
     * off by 0.375 / 1 (62%) */
    T_CHECK(finite && den > 0 && sqrt(num / den) < 1e-2,
            "rescaled BF16 gradient: relative difference %.3g from the plain path's",
            den > 0 ? sqrt(num / den) : -1.0);
    free(gf);
    free(gq);
    fp8t_model_destroy(f);
    fp8t_model_destroy(q);
}

/* ---- GELU's backward applied by fc1's Dgrad rounding pass ---- */

static void gelu_bwd_case(const char *preset, fp8t_precision prec, const char *overrides,
                          int hooked, long want_per_micro) {
    pair_run pr;
    if (!run_pair(&pr, preset, prec, overrides, hooked, NO_GELU_BWD_FUSION, "gelu bwd fusion"))
        return;
    const long want = (long)PAIR_STEPS * PAIR_ACCUM * want_per_micro;
    T_CHECK(pr.c.gbwd[0] == want && pr.c.gbwd[1] == 0,
            "%s: fc1's Dgrad applied GELU's backward %ld times (switched off: %ld), expected %ld",
            pr.what, pr.c.gbwd[0], pr.c.gbwd[1], want);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void gelu_bwd_fusion(void) {
    const long L = 4; /* tiny's layers */
    gelu_bwd_case("tiny", FP8T_PREC_BF16, NULL, 0, L);
    gelu_bwd_case("tiny", FP8T_PREC_DELAYED, NULL, 0, L); /* with the deferred fc1 bias */
    gelu_bwd_case("tiny", FP8T_PREC_DELAYED, "layers=2-3,precision=bf16", 0, L);
    /* current scaling needs dY's amax before its pass; a hook sees dY; the Wgrad rounds dY in
     * another precision; the bias gradient is read from dY in FP32 (colsum switched off is
     * the bias-grad test's business): not fused */
    gelu_bwd_case("tiny", FP8T_PREC_CURRENT, NULL, 0, 0);
    gelu_bwd_case("tiny", FP8T_PREC_DELAYED, NULL, 1, 0);
    gelu_bwd_case("tiny", FP8T_PREC_DELAYED, "module=fc1,gemm=wgrad,precision=bf16", 0, 0);
    gelu_bwd_case("tiny", FP8T_PREC_BF16, "layers=0,module=fc1,gemm=dgrad,precision=current", 0,
                  L - 1);
    gelu_bwd_case("tiny-llama", FP8T_PREC_DELAYED, NULL, 0, 0); /* SwiGLU: nothing to fuse */
}

/* ---- SwiGLU in down's rounding pass, its gradients in gate's and up's ---- */

/* want_fwd / want_bwd: operands made with SwiGLU's step per micro-batch (down's X, one per
 * layer) and with its gradients' (gate's and up's dY, two per layer), with the switch on; none
 * with it off; the same bits either way */
static void swiglu_case(fp8t_precision prec, const char *overrides, int hooked, int switches,
                        long want_fwd, long want_bwd) {
    pair_run pr;
    if (!run_pair(&pr, "tiny-llama", prec, overrides, hooked, switches, "swiglu fusion")) return;
    const long micro = (long)PAIR_STEPS * PAIR_ACCUM;
    T_CHECK(pr.c.swiglu[0] == micro * want_fwd && pr.c.dswiglu[0] == micro * want_bwd,
            "%s: SwiGLU steps %ld (expected %ld), gradient steps %ld (expected %ld)", pr.what,
            pr.c.swiglu[0], micro * want_fwd, pr.c.dswiglu[0], micro * want_bwd);
    const long off_fwd = switches & FP8T_DISABLE_SWIGLU_FUSION ? 0 : micro * want_fwd;
    const long off_bwd = switches & FP8T_DISABLE_SWIGLU_BWD_FUSION ? 0 : micro * want_bwd;
    T_CHECK(pr.c.swiglu[1] == off_fwd && pr.c.dswiglu[1] == off_bwd,
            "%s, switched off: SwiGLU steps %ld, gradient steps %ld", pr.what, pr.c.swiglu[1],
            pr.c.dswiglu[1]);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void swiglu_fusion(void) {
    const long L = 4; /* tiny-llama's layers */
    const int both = FP8T_DISABLE_SWIGLU_FUSION | FP8T_DISABLE_SWIGLU_BWD_FUSION;
    swiglu_case(FP8T_PREC_ROWWISE, NULL, 0, both, L, 2 * L);
    swiglu_case(FP8T_PREC_ROWWISE, NULL, 0, FP8T_DISABLE_SWIGLU_FUSION, L, 2 * L);
    swiglu_case(FP8T_PREC_ROWWISE, NULL, 0, FP8T_DISABLE_SWIGLU_BWD_FUSION, L, 2 * L);
    /* a layer in BF16: its down and its gate/up Dgrads take the BF16 kernels */
    swiglu_case(FP8T_PREC_ROWWISE, "layers=0,precision=bf16", 0, both, L, 2 * L);
    /* up's Dgrad in BF16: neither gradient is fused (both or neither) */
    swiglu_case(FP8T_PREC_ROWWISE, "layers=1,module=up,gemm=dgrad,precision=bf16", 0, both, L,
                2 * (L - 1));
    /* the Wgrad of gate in BF16: its dY cannot come from the Dgrad's pass */
    swiglu_case(FP8T_PREC_ROWWISE, "module=gate,gemm=wgrad,precision=bf16", 0, both, L, 0);
    /* a hook wants SwiGLU's output and dY in FP32 */
    swiglu_case(FP8T_PREC_ROWWISE, NULL, 1, both, 0, 0);
    /* per-tensor FP8 with the scale known before the pass (delayed), and BF16 operands */
    swiglu_case(FP8T_PREC_DELAYED, NULL, 0, both, L, 2 * L);
    swiglu_case(FP8T_PREC_DELAYED, NULL, 0, FP8T_DISABLE_SWIGLU_BWD_FUSION, L, 2 * L);
    swiglu_case(FP8T_PREC_BF16, NULL, 0, both, L, 2 * L);
    swiglu_case(FP8T_PREC_BF16, NULL, 1, both, 0, 0);
    /* a BF16 layer among delayed ones takes the BF16 kernels, its neighbours the FP8 ones */
    swiglu_case(FP8T_PREC_DELAYED, "layers=2,precision=bf16", 0, both, L, 2 * L);
    /* up's Dgrad in BF16 under a delayed Wgrad: up's Wgrad cannot take the Dgrad's dY */
    swiglu_case(FP8T_PREC_DELAYED, "layers=1,module=up,gemm=dgrad,precision=bf16", 0, both, L,
                2 * (L - 1));
    /* current scaling takes its scale from the values: they must exist first */
    swiglu_case(FP8T_PREC_CURRENT, NULL, 0, both, 0, 0);
}

/* ---- up taking the X operand gate made ---- */

/* want_per_micro: X operands up does not make per micro-batch (one per layer that shares) */
static void x_share_case(fp8t_precision prec, const char *overrides, int hooked,
                         long want_per_micro) {
    pair_run pr;
    if (!run_pair(&pr, "tiny-llama", prec, overrides, hooked, FP8T_DISABLE_X_SHARE, "x share"))
        return;
    const long micro = (long)PAIR_STEPS * PAIR_ACCUM;
    /* (gate's BF16 operand comes from ln2's pass only while up takes it: counted as a norm) */
    const long saved = (pr.c.to_bf16[1] - pr.c.to_bf16[0]) + (pr.c.ln16[1] - pr.c.ln16[0]) +
                       (pr.c.scaled[1] - pr.c.scaled[0]) + (pr.c.quant[1] - pr.c.quant[0]);
    T_CHECK(saved == micro * want_per_micro, "%s: %ld operand passes fewer (expected %ld)",
            pr.what, saved, micro * want_per_micro);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void x_share(void) {
    const long L = 4; /* tiny-llama's layers */
    x_share_case(FP8T_PREC_BF16, NULL, 0, L);
    x_share_case(FP8T_PREC_ROWWISE, NULL, 0, L);
    /* up in another precision than gate, in layer 1 */
    x_share_case(FP8T_PREC_BF16, "layers=1,module=up,precision=rowwise", 0, L - 1);
    /* per-tensor FP8 keeps a scale per linear; a hook sees each input site */
    x_share_case(FP8T_PREC_DELAYED, NULL, 0, 0);
    x_share_case(FP8T_PREC_BF16, NULL, 1, 0);
}

/* ---- proj's and fc2's bias left to the residual add ---- */

/* want_per_micro: add_bias calls per micro-batch; the FP8 GEMMs given a bias and the bias_add
 * calls drop by as many as add_bias takes over */
static void residual_bias_case(fp8t_precision prec, const char *overrides, int hooked,
                               long want_per_micro) {
    pair_run pr;
    if (!run_pair(&pr, "tiny", prec, overrides, hooked, NO_RESIDUAL_BIAS, "residual bias"))
        return;
    const long want = (long)PAIR_STEPS * PAIR_ACCUM * want_per_micro;
    const calls c = pr.c;
    T_CHECK(c.add_bias[0] == want && c.add_bias[1] == 0,
            "%s: add_bias called %ld times (switched off: %ld), expected %ld", pr.what,
            c.add_bias[0], c.add_bias[1], want);
    T_CHECK((c.fp8_bias[1] - c.fp8_bias[0]) + (c.bias_add[1] - c.bias_add[0]) == want,
            "%s: biases added elsewhere: gemm_fp8 %ld vs %ld, bias_add %ld vs %ld", pr.what,
            c.fp8_bias[0], c.fp8_bias[1], c.bias_add[0], c.bias_add[1]);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void residual_bias(void) {
    const long L = 4; /* tiny's layers: proj and fc2 each */
    residual_bias_case(FP8T_PREC_DELAYED, NULL, 0, 2 * L);
    residual_bias_case(FP8T_PREC_CURRENT, NULL, 0, 2 * L);
    residual_bias_case(FP8T_PREC_FP32, NULL, 0, 2 * L);
    residual_bias_case(FP8T_PREC_BF16, NULL, 0, 0); /* the bias rides in the BF16 epilogue */
    residual_bias_case(FP8T_PREC_DELAYED, "layers=0-1,precision=bf16", 0, L);
    residual_bias_case(FP8T_PREC_DELAYED, NULL, 1, 0); /* hooked: the plain path */
}

/* ---- the norms writing their output as the next linear's BF16 operand ---- */

/* want_per_micro: the norms' fused operand passes per micro-batch; add_per_micro: residual adds
 * of their own (add_bias without a bias) per micro-batch (-1: not checked) */
static void ln_case2(const char *preset, fp8t_precision prec, const char *overrides, int hooked,
                     long want_per_micro, long add_per_micro) {
    pair_run pr;
    if (!run_pair(&pr, preset, prec, overrides, hooked, NO_LN_FUSION, "ln fusion")) return;
    const long want = (long)PAIR_STEPS * PAIR_ACCUM * want_per_micro;
    T_CHECK(pr.c.ln16[0] == want && pr.c.ln16[1] == 0,
            "%s: layernorm_forward_bf16 called %ld times (switched off: %ld), expected %ld",
            pr.what, pr.c.ln16[0], pr.c.ln16[1], want);
    T_CHECK(pr.c.to_bf16[1] - pr.c.to_bf16[0] == want, "%s: to_bf16 %ld vs %ld", pr.what,
            pr.c.to_bf16[0], pr.c.to_bf16[1]);
    if (add_per_micro >= 0) {
        const long want_add = (long)PAIR_STEPS * PAIR_ACCUM * add_per_micro;
        T_CHECK(pr.c.res_add[0] == want_add, "%s: %ld residual adds of their own, expected %ld",
                pr.what, pr.c.res_add[0], want_add);
    }
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void ln_case(const char *preset, fp8t_precision prec, const char *overrides, int hooked,
                    long want_per_micro) {
    ln_case2(preset, prec, overrides, hooked, want_per_micro, -1);
}

static void ln_fusion(void) {
    const long L = 4; /* tiny's layers: ln1 -> qkv, ln2 -> fc1 */
    ln_case("tiny", FP8T_PREC_BF16, NULL, 0, 2 * L);
    ln_case("tiny", FP8T_PREC_DELAYED, "layers=1-2,precision=bf16", 0, 2 * 2);
    ln_case("tiny", FP8T_PREC_BF16, "module=qkv,gemm=wgrad,precision=fp32", 0,
            L);                                     /* ln1 kept in FP32 */
    ln_case("tiny", FP8T_PREC_DELAYED, NULL, 0, 0); /* FP8: the plain norm */
    ln_case("tiny", FP8T_PREC_BF16, NULL, 1, 0);    /* hooked */
    /* Llama's RMSNorms: ln1 -> qkv, ln2 (with the residual add) -> gate, whose operand up
     * takes; not where up cannot take it (another precision), which needs ln2 in FP32 */
    const long LL = 4; /* tiny-llama's layers */
    /* a layer's final residual add rides in the next layer's ln1 pass (ADD_RMSNORM) as x2's
     * in ln2's: the last layer's alone is an add_bias of its own; an unfused norm (FP8,
     * hooked, layer 2's ln2 where up cannot take gate's operand, layer 2's ln1 where qkv is
     * FP8) adds before it, an add_bias */
    ln_case2("tiny-llama", FP8T_PREC_BF16, NULL, 0, 2 * LL, 1);
    ln_case2("tiny-llama-gqa", FP8T_PREC_BF16, NULL, 0, 2 * LL, 1);
    ln_case2("tiny-llama", FP8T_PREC_BF16, "layers=2,module=up,precision=rowwise", 0, 2 * LL - 1,
             2);
    ln_case2("tiny-llama", FP8T_PREC_BF16, "layers=2,module=qkv,precision=delayed", 0, 2 * LL - 1,
             2);
    ln_case2("tiny-llama", FP8T_PREC_DELAYED, NULL, 0, 0, 2 * LL);
    ln_case2("tiny-llama", FP8T_PREC_BF16, NULL, 1, 0, 2 * LL);
}

/* ---- every switch at once ---- */

/* FP8T_DISABLE_ALL_FUSION: the plain path of everything at once still gives the default's bits
 * (and the fused ops are never called), for GPT-2 and Llama in BF16 and FP8 delayed. */
static void all_fusion_case(const char *preset, fp8t_precision prec) {
    pair_run pr;
    /* both sides with FP32 saves: BF16 saves change what the backward reads, and the plain
     * fp8-save / attn-save paths read those tensors again (bf16_saves tests them on their own) */
    make_extra = NO_BF16_SAVES;
    const int ran = run_pair(&pr, preset, prec, NULL, 0, FP8T_DISABLE_ALL_FUSION, "all fusion");
    make_extra = 0;
    if (!ran) return;
    const calls c = pr.c;
    T_CHECK(c.to_bf16[1] == 0 && c.ln16[1] == 0 && c.add_bias[1] == 0,
            "%s: a fused op ran with every fusion off (to_bf16 %ld, ln16 %ld, add_bias %ld)",
            pr.what, c.to_bf16[1], c.ln16[1], c.add_bias[1]);
    fp8t_model_destroy(pr.r);
    fp8t_model_destroy(pr.q);
}

static void all_fusion(void) {
    T_CHECK(FP8T_DISABLE_ALL_FUSION ==
                (FP8T_DISABLE_FUSED_XENT | FP8T_DISABLE_BF16_XENT | FP8T_DISABLE_CODE_REUSE |
                 FP8T_DISABLE_BF16_OPERANDS | FP8T_DISABLE_GELU_FUSION |
                 FP8T_DISABLE_BIAS_GRAD_FUSION | FP8T_DISABLE_GELU_BWD_FUSION |
                 FP8T_DISABLE_RESIDUAL_BIAS | FP8T_DISABLE_LN_FUSION | FP8T_DISABLE_ATTN_SAVE |
                 FP8T_DISABLE_FP8_SAVE | FP8T_DISABLE_SWIGLU_FUSION |
                 FP8T_DISABLE_SWIGLU_BWD_FUSION | FP8T_DISABLE_X_SHARE),
            "FP8T_DISABLE_ALL_FUSION is not every bit");
    all_fusion_case("tiny", FP8T_PREC_BF16);
    all_fusion_case("tiny", FP8T_PREC_DELAYED);
    all_fusion_case("tiny-llama", FP8T_PREC_BF16);
    all_fusion_case("tiny-llama", FP8T_PREC_DELAYED);
    /* a bit the model does not know is refused, not ignored */
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    fp8t_policy p = policy(FP8T_PREC_BF16);
    const fp8t_model_options bad = {.disable = (unsigned)FP8T_DISABLE_KNOWN + 1u};
    char err[256] = "";
    fp8t_model *m = fp8t_model_create(cpu, &c, &p, &bad, 2, 8, err, sizeof(err));
    T_CHECK(!m && strstr(err, "disable"), "unknown disable bit accepted: %s", err);
    fp8t_model_destroy(m);
}

int main(void) {
    t_suite = "model_fused";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!cpu) {
        printf("FAIL model_fused: cpu backend: %s\n", err);
        return 1;
    }
    counted_ops = *cpu->ops;
    counted_ops.make_operand = count_make_operand;
    counted_ops.softmax_xent = count_xent;
    counted_ops.softmax_xent_bf16 = count_xent16;
    counted_ops.bias_add = count_bias_add;
    counted_ops.gelu_backward_bias = count_gelu_bwd_bias;
    counted_ops.gemm_fp8 = count_gemm_fp8;
    counted_ops.bias_backward = count_bias_bwd;
    counted_ops.add_bias = count_add_bias;
    counted = *cpu;
    counted.ops = &counted_ops;
    T_RUN(xent_dloss_one);
    T_RUN(xent_grad_accumulation);
    T_RUN(xent_dloss_changes);
    T_RUN(xent_logits_readable);
    T_RUN(xent_not_fused_when_frozen_or_hooked);
    T_RUN(reuse_delayed);
    T_RUN(reuse_current);
    T_RUN(reuse_only_when_allowed);
    T_RUN(bf16_operands);
    T_RUN(bf16_operands_mixed);
    T_RUN(gelu_fusion);
    T_RUN(bias_grad_fusion);
    T_RUN(bf16_xent);
    T_RUN(bf16_xent_dloss_changes);
    T_RUN(gelu_bwd_fusion);
    T_RUN(swiglu_fusion);
    T_RUN(x_share);
    T_RUN(residual_bias);
    T_RUN(ln_fusion);
    T_RUN(all_fusion);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
