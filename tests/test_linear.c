/* The FP8 linear layer against a direct composition of the numerics library.
 *
 * A one-layer model runs a few optimizer steps (two micro-batches each) on the CPU backend
 * with a tensor hook. For every GEMM of every linear (the head included) the hook captures
 * the two operands before quantization and the result after the GEMM; the test computes the
 * result itself from the operands with the numerics library (fp8_encode / fp8_decode, BF16
 * rounding, the recipe functions, block / MXFP8 quantizers) and a double-precision sum, and
 * requires the model's result to be within the FP32 accumulation error bound
 *   |y - ref| <= gamma(K + 4) * sum_k |a_k b_k| * |scale_inv_a scale_inv_b|,
 *   gamma(n) = n u / (1 - n u), u = 2^-24.
 * Delayed scaling is checked against a reference recipe state the test maintains from the
 * amaxes it observed (fp8t_recipe_record_amax / fp8t_delayed_update): the scale used at step s
 * comes from earlier steps, and the model's state must equal the reference bit for bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/fp8.h"
#include "fp8train/model.h"
#include "fp8train/recipe.h"
#include "test.h"

typedef struct {
    fp8t_backend *be;
    fp8t_model *m;
    const fp8t_policy *pol;
    /* reference recipe state over the model's FP8 tensors */
    float *ref_mem;
    fp8t_recipe_state ref;
    /* last captured operands of the current GEMM */
    float *a, *b;
    int a_rows, a_cols, b_rows, b_cols;
    fp8_format a_fmt, b_fmt;
    int a_t, b_t;
    /* results */
    int n_results, n_bad, n_fp32_match, n_site_errors;
    double worst; /* max over elements of err / bound */
    char first_bad[256];
} ctx;

static float *grab(ctx *c, float *dst, const float *dev, size_t n) {
    dst = realloc(dst, n * sizeof(float));
    c->be->ops->to_host(c->be, dst, dev, n * sizeof(float));
    return dst;
}

/* The operand as the GEMM of precision p sees it, in double; *scale_inv gets the factor the
 * FP8 GEMM applies afterwards (1 for the others). Tiles are along the reduction dimension. */
static double *quantized(ctx *c, const float *x, int rows, int cols, fp8_format fmt, int t,
                         int is_weight, fp8t_gemm_kind g, fp8t_precision p, double *scale_inv) {
    size_t n = (size_t)rows * cols;
    double *out = malloc(n * sizeof(double));
    float *tmp = malloc(n * sizeof(float));
    *scale_inv = 1.0;
    switch (p) {
    case FP8T_PREC_FP32:
        for (size_t i = 0; i < n; i++) out[i] = x[i];
        break;
    case FP8T_PREC_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_decode(bf16_encode(x[i]));
        break;
    case FP8T_PREC_DELAYED:
    case FP8T_PREC_CURRENT: {
        float scale, sinv;
        if (p == FP8T_PREC_DELAYED) {
            scale = c->ref.scale[t];
            sinv = c->ref.scale_inv[t];
        } else {
            scale = fp8t_current_scale(fp8_amax(x, n), fp8_format_max(fmt), c->pol->epsilon,
                                       c->pol->pow2_scales);
            sinv = 1.0f / scale;
        }
        for (size_t i = 0; i < n; i++) out[i] = fp8_decode(fp8_encode(x[i] * scale, fmt, 1), fmt);
        *scale_inv = sinv;
        break;
    }
    case FP8T_PREC_FAKE: {
        float scale = fp8t_current_scale(fp8_amax(x, n), fp8_format_max(fmt), c->pol->epsilon,
                                         c->pol->pow2_scales);
        fp8_fake_quantize(tmp, x, n, scale, fmt);
        for (size_t i = 0; i < n; i++) out[i] = bf16_decode(bf16_encode(tmp[i])); /* BF16 GEMM */
        break;
    }
    case FP8T_PREC_BLOCK:
    case FP8T_PREC_ROWWISE: {
        /* the reduction dimension K runs along the stored rows of the Wgrad's operands and
         * of the Dgrad's W, along the stored columns of the others */
        const int k_rows = g == FP8T_GEMM_WGRAD || (is_weight && g == FP8T_GEMM_DGRAD);
        int tr, tc;
        if (p == FP8T_PREC_ROWWISE) { /* one scale per K-major row: the whole K */
            tr = k_rows ? rows : 1;
            tc = k_rows ? 1 : cols;
        } else {
            tr = is_weight ? 128 : (k_rows ? 128 : 1);
            tc = is_weight ? 128 : (k_rows ? 1 : 128);
        }
        size_t nb = (size_t)((rows + tr - 1) / tr) * ((cols + tc - 1) / tc);
        uint8_t *codes = malloc(n);
        float *scales = malloc(nb * sizeof(float));
        fp8t_block_quantize_pow2(codes, scales, x, rows, cols, tr, tc, fmt, c->pol->pow2_scales);
        fp8t_block_dequantize(tmp, codes, scales, rows, cols, tr, tc, fmt);
        for (size_t i = 0; i < n; i++) out[i] = tmp[i];
        free(codes);
        free(scales);
        break;
    }
    case FP8T_PREC_MXFP8: {
        uint8_t *codes = malloc(n), *e8 = malloc((size_t)rows * ((cols + 31) / 32));
        fp8t_mxfp8_quantize(codes, e8, x, rows, cols);
        fp8t_mxfp8_dequantize(tmp, codes, e8, rows, cols);
        for (size_t i = 0; i < n; i++) out[i] = tmp[i];
        free(codes);
        free(e8);
        break;
    }
    default: abort();
    }
    free(tmp);
    return out;
}

static void check_result(ctx *c, const fp8t_tensor_site *s, const float *y) {
    const fp8t_precision p = s->precision;
    const fp8t_gemm_kind g = s->gemm;
    double sa, sb, sa32, sb32;
    /* operand A is X (fprop) or dY (dgrad, wgrad); B is W (fprop, dgrad) or X (wgrad) */
    double *qa = quantized(c, c->a, c->a_rows, c->a_cols, c->a_fmt, c->a_t, 0, g, p, &sa);
    double *qb = quantized(c, c->b, c->b_rows, c->b_cols, c->b_fmt, c->b_t, g != FP8T_GEMM_WGRAD,
                           g, p, &sb);
    double *fa =
        quantized(c, c->a, c->a_rows, c->a_cols, c->a_fmt, c->a_t, 0, g, FP8T_PREC_FP32, &sa32);
    double *fb =
        quantized(c, c->b, c->b_rows, c->b_cols, c->b_fmt, c->b_t, 0, g, FP8T_PREC_FP32, &sb32);
    int M, Nn, K;
    if (g == FP8T_GEMM_FPROP) {
        M = c->a_rows;
        Nn = c->b_rows;
        K = c->a_cols;
    } else if (g == FP8T_GEMM_DGRAD) {
        M = c->a_rows;
        Nn = c->b_cols;
        K = c->a_cols;
    } else {
        M = c->a_cols;
        Nn = c->b_cols;
        K = c->a_rows;
    }
    if (s->rows != M || s->cols != Nn) {
        c->n_site_errors++;
        return;
    }
    const double u = ldexp(1.0, -24), gam = (K + 4) * u / (1 - (K + 4) * u);
    int bad = 0, fp32_all_close = 1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nn; j++) {
            double ref = 0, abs_sum = 0, ref32 = 0, abs32 = 0;
            for (int k = 0; k < K; k++) {
                double av, bv, af, bf;
                if (g == FP8T_GEMM_FPROP) { /* X[i,k] W[j,k] */
                    av = qa[(size_t)i * K + k];
                    bv = qb[(size_t)j * K + k];
                    af = fa[(size_t)i * K + k];
                    bf = fb[(size_t)j * K + k];
                } else if (g == FP8T_GEMM_DGRAD) { /* dY[i,k] W[k,j] */
                    av = qa[(size_t)i * K + k];
                    bv = qb[(size_t)k * Nn + j];
                    af = fa[(size_t)i * K + k];
                    bf = fb[(size_t)k * Nn + j];
                } else { /* dY[k,i] X[k,j] */
                    av = qa[(size_t)k * M + i];
                    bv = qb[(size_t)k * Nn + j];
                    af = fa[(size_t)k * M + i];
                    bf = fb[(size_t)k * Nn + j];
                }
                ref += av * bv;
                abs_sum += fabs(av * bv);
                ref32 += af * bf;
                abs32 += fabs(af * bf);
            }
            double scl = sa * sb;
            ref *= scl;
            double bound = gam * abs_sum * fabs(scl) + 1e-35;
            double err = fabs((double)y[(size_t)i * Nn + j] - ref);
            if (!(err <= bound)) {
                if (!bad && !c->first_bad[0])
                    snprintf(c->first_bad, sizeof(c->first_bad),
                             "lin %d %s %s [%d,%d]: model %.9g reference %.9g (bound %.3g)",
                             s->lin, fp8t_gemm_name(g), fp8t_precision_name(p), i, j,
                             (double)y[(size_t)i * Nn + j], ref, bound);
                bad = 1;
            }
            if (bound > 0 && err / bound > c->worst) c->worst = err / bound;
            if (fabs((double)y[(size_t)i * Nn + j] - ref32) > gam * abs32 + 1e-35)
                fp32_all_close = 0;
        }
    c->n_results++;
    c->n_bad += bad;
    c->n_fp32_match += fp32_all_close;
    free(qa);
    free(qb);
    free(fa);
    free(fb);
}

static void hook(void *vctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    ctx *c = vctx;
    size_t n = (size_t)s->rows * s->cols;
    /* the site must name the precision the model resolved and the tensor's FP8 format */
    if (s->precision != fp8t_model_gemm_precision(m, s->lin, s->gemm)) c->n_site_errors++;
    if (s->kind <= FP8T_T_GRAD_OUTPUT) {
        /* block and rowwise: E4M3 everywhere unless block_hybrid (--format hybrid) */
        const int scaled = s->precision == FP8T_PREC_BLOCK || s->precision == FP8T_PREC_ROWWISE;
        const int hybrid = scaled ? c->pol->block_hybrid : c->pol->hybrid;
        fp8_format want = (s->kind == FP8T_T_GRAD_OUTPUT && hybrid) ? FP8_E5M2 : FP8_E4M3;
        if (s->fmt != want || s->fp8_index != s->lin * 3 + (int)s->kind) c->n_site_errors++;
    }
    int first = (s->gemm == FP8T_GEMM_WGRAD) ? (s->kind == FP8T_T_GRAD_OUTPUT)
                                             : (s->kind != FP8T_T_WEIGHT);
    switch (s->kind) {
    case FP8T_T_INPUT:
    case FP8T_T_WEIGHT:
    case FP8T_T_GRAD_OUTPUT:
        if (first) {
            c->a = grab(c, c->a, x, n);
            c->a_rows = s->rows;
            c->a_cols = s->cols;
            c->a_fmt = s->fmt;
            c->a_t = s->fp8_index;
        } else {
            c->b = grab(c, c->b, x, n);
            c->b_rows = s->rows;
            c->b_cols = s->cols;
            c->b_fmt = s->fmt;
            c->b_t = s->fp8_index;
        }
        /* the amaxes the model must record: X and W at Fprop, dY at Dgrad */
        if ((s->gemm == FP8T_GEMM_FPROP) ||
            (s->gemm == FP8T_GEMM_DGRAD && s->kind == FP8T_T_GRAD_OUTPUT))
            fp8t_recipe_record_amax(&c->ref, s->fp8_index, fp8_amax(first ? c->a : c->b, n));
        break;
    default: {
        float *y = grab(c, NULL, x, n);
        check_result(c, s, y);
        free(y);
    }
    }
}

/* A CPU backend that asks for transposed FP8 copies (as Hopper does) and checks, in every
 * gemm_fp8, that data_t is the transpose of data before running the CPU GEMM. */
static fp8t_backend_ops transpose_ops;
static const fp8t_backend_ops *cpu_ops;
static int n_fp8_gemms, n_bad_transposes;

static int transposed_ok(const fp8t_fp8_operand *o) {
    if (!o->data || !o->data_t) return 0;
    for (int r = 0; r < o->rows; r++)
        for (int c = 0; c < o->cols; c++)
            if (o->data[(size_t)r * o->cols + c] != o->data_t[(size_t)c * o->rows + r]) return 0;
    return 1;
}

static void checking_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                              const fp8t_fp8_operand *B, int M, int N, int K, int transA,
                              int transB, int acc, int fast_accum, float *amax_out,
                              const float *bias) {
    n_fp8_gemms++;
    if (!transposed_ok(A) || !transposed_ok(B)) n_bad_transposes++;
    cpu_ops->gemm_fp8(b, C, A, B, M, N, K, transA, transB, acc, fast_accum, amax_out, bias);
}

/* A CPU backend that claims block-scaled FP8 GEMMs (fp8_block_native, as Hopper's cuBLASLt):
 * the model then runs the block precision through block_quantize and gemm_fp8, and this
 * counts the gemm_fp8 calls whose operands are block-scaled. */
static int n_block_gemms;
static void counting_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                              const fp8t_fp8_operand *B, int M, int N, int K, int transA,
                              int transB, int acc, int fast_accum, float *amax_out,
                              const float *bias) {
    if (A->scaling != FP8T_SCALING_TENSOR && B->scaling != FP8T_SCALING_TENSOR) n_block_gemms++;
    cpu_ops->gemm_fp8(b, C, A, B, M, N, K, transA, transB, acc, fast_accum, amax_out, bias);
}

/* Runs `steps` optimizer steps of two micro-batches under policy pol; returns via T_* checks.
 * With transpose (1), the model runs on the transposed-copies backend above; with 2, on the
 * block-native one, at sizes whose GEMMs are all multiples of 16 (the MLP's 208 a partial
 * 128-block along K). */
static void run_policy_on(fp8t_arch arch, const fp8t_policy *pol, const char *label,
                          int transpose) {
    const int native = transpose == 2;
    if (native) transpose = 0;
    char err[256];
    fp8t_backend *cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(cpu, "%s", err);
    fp8t_backend wrapped = *cpu, *be = cpu;
    if (transpose) {
        cpu_ops = cpu->ops;
        transpose_ops = *cpu->ops;
        transpose_ops.gemm_fp8 = checking_gemm_fp8;
        wrapped.ops = &transpose_ops;
        wrapped.fp8_wants_transpose = 1;
        be = &wrapped;
        n_fp8_gemms = n_bad_transposes = 0;
    }
    if (native) {
        cpu_ops = cpu->ops;
        transpose_ops = *cpu->ops;
        transpose_ops.gemm_fp8 = counting_gemm_fp8;
        wrapped.ops = &transpose_ops;
        wrapped.fp8_block_native = 1;
        be = &wrapped;
        n_block_gemms = 0;
    }
    /* sizes chosen so block tiles (128) and MX blocks (32) have full and partial blocks */
    fp8t_model_config cfg = {.arch = arch,
                             .n_layer = 1,
                             .n_embd = 32,
                             .n_head = 2,
                             .seq_len = 48,
                             .vocab_size = 160,
                             .mlp_hidden = 192,
                             .rope_theta = 10000.0f,
                             .norm_eps = 1e-5f};
    if (native) cfg.n_embd = 128, cfg.mlp_hidden = 208, cfg.seq_len = 64, cfg.vocab_size = 256;
    const int B = native ? 2 : 3, T = native ? 64 : 48, N = B * T, steps = 3;
    fp8t_model *m = fp8t_model_create(be, &cfg, pol, NULL, B, T, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    fp8t_model_init_weights(m, 7);

    ctx c;
    memset(&c, 0, sizeof(c));
    c.be = be;
    c.m = m;
    c.pol = fp8t_model_get_policy(m);
    int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    size_t sf = fp8t_recipe_state_floats(n, len);
    c.ref_mem = malloc(sf * sizeof(float));
    fp8t_recipe_state_view(&c.ref, c.ref_mem, n, len);
    fp8_format *fmts = malloc((size_t)n * sizeof(fp8_format));
    for (int t = 0; t < n; t++)
        fmts[t] = (t % 3 == FP8T_ROLE_DY && pol->hybrid) ? FP8_E5M2 : FP8_E4M3;
    fp8t_recipe_state_reset(&c.ref, fmts);
    free(fmts);
    fp8t_model_set_hook(m, hook, &c);

    float *state = malloc(sf * sizeof(float));
    int *tokens = malloc((size_t)N * sizeof(int)), *targets = malloc((size_t)N * sizeof(int));
    uint64_t r = 12345;
    float first_scale_ok = 1;
    for (int step = 0; step < steps; step++) {
        fp8t_model_zero_grad(m);
        for (int mb = 0; mb < 2; mb++) {
            for (int i = 0; i < N; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                tokens[i] = (int)((r >> 33) % (uint64_t)cfg.vocab_size);
                targets[i] = (int)((r >> 13) % (uint64_t)cfg.vocab_size);
            }
            float loss = fp8t_model_forward(m, tokens, targets);
            T_CHECK(isfinite(loss), "%s: loss %g", label, loss);
            fp8t_model_backward(m, 0.5f);
        }
        float norm = fp8t_model_grad_norm(m);
        fp8t_model_adamw(m, 2e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step + 1, 1.0f, norm);
        /* before the update: slot 0 holds this step's amaxes (max over both micro-batches) */
        be->ops->to_host(be, state, fp8t_model_fp8_state(m), sf * sizeof(float));
        T_CHECK(memcmp(state, c.ref_mem, (size_t)n * sizeof(float)) == 0,
                "%s step %d: recorded amaxes differ from the amaxes of the hooked tensors", label,
                step);
        fp8t_model_end_step(m);
        fp8t_delayed_update(&c.ref, c.pol->algo, c.pol->margin);
        be->ops->to_host(be, state, fp8t_model_fp8_state(m), sf * sizeof(float));
        T_CHECK(memcmp(state, c.ref_mem, sf * sizeof(float)) == 0,
                "%s step %d: FP8 recipe state differs from fp8t_delayed_update on the same "
                "amaxes",
                label, step);
        if (step == 0) {
            /* independent of the library: after one step, scale = fmt_max / amax of step 0 */
            fp8t_recipe_state v;
            fp8t_recipe_state_view(&v, state, n, len);
            for (int t = 0; t < n; t++) {
                float amax = v.history[(size_t)(len - 1) * n + t]; /* rolled to the end */
                if (len == 1) amax = 0; /* nothing to compare: len 1 keeps slot 0 only */
                if (amax > 0 && v.scale[t] != v.fmt_max[t] / amax) first_scale_ok = 0;
            }
        }
    }
    T_CHECK(first_scale_ok, "%s: scale after step 0 is not fmt_max / amax(step 0)", label);
    printf("  %-28s %3d GEMM results checked, worst error %.3f of the bound\n", label,
           c.n_results, c.worst);
    T_CHECK(c.n_results == steps * 2 * 3 * fp8t_model_num_linears(&cfg),
            "%s: %d GEMM results seen", label, c.n_results);
    T_CHECK(c.n_site_errors == 0,
            "%s: %d tensor sites with a wrong precision, format, index or "
            "shape",
            label, c.n_site_errors);
    T_CHECK(c.n_bad == 0,
            "%s: %d of %d GEMM results differ from the numerics composition; "
            "first: %s",
            label, c.n_bad, c.n_results, c.first_bad);
    free(state);
    free(tokens);
    free(targets);
    free(c.a);
    free(c.b);
    free(c.ref_mem);
    fp8t_model_destroy(m);
    fp8t_backend_destroy(cpu);
    if (transpose) {
        T_CHECK(n_fp8_gemms > 0, "%s: no FP8 GEMM ran", label);
        T_CHECK(n_bad_transposes == 0,
                "%s: %d of %d FP8 GEMMs got data_t that is not the "
                "transpose of data",
                label, n_bad_transposes, n_fp8_gemms);
    }
    if (native)
        T_CHECK(n_block_gemms == c.n_results, "%s: %d of %d GEMMs ran block-scaled", label,
                n_block_gemms, c.n_results);
    /* the control: results of a quantizing precision must not also match plain FP32 */
    if (pol->default_precision != FP8T_PREC_FP32)
        T_CHECK(c.n_fp32_match < c.n_results / 4,
                "%s: %d of %d results equal the FP32 GEMM: quantization did not happen?", label,
                c.n_fp32_match, c.n_results);
}

static void run_policy(fp8t_arch arch, const fp8t_policy *pol, const char *label) {
    run_policy_on(arch, pol, label, 0);
}

static void run_precision(fp8t_precision p) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = p;
    pol.head_precision = p;
    pol.history_len = 2; /* short window: the roll is exercised within the 3 steps */
    char label[64];
    snprintf(label, sizeof(label), "gpt2 %s", fp8t_precision_name(p));
    run_policy(FP8T_ARCH_GPT2, &pol, label);
    snprintf(label, sizeof(label), "llama %s", fp8t_precision_name(p));
    run_policy(FP8T_ARCH_LLAMA, &pol, label);
}

static void linear_delayed(void) { run_precision(FP8T_PREC_DELAYED); }
static void linear_current(void) { run_precision(FP8T_PREC_CURRENT); }
static void linear_fake(void) { run_precision(FP8T_PREC_FAKE); }
static void linear_bf16(void) { run_precision(FP8T_PREC_BF16); }
static void linear_fp32(void) { run_precision(FP8T_PREC_FP32); }
static void linear_block(void) { run_precision(FP8T_PREC_BLOCK); }
static void linear_rowwise(void) { run_precision(FP8T_PREC_ROWWISE); }
static void linear_mxfp8(void) { run_precision(FP8T_PREC_MXFP8); }

/* current scaling with the options: power-of-two scales and an amax floor */
static void linear_current_pow2_eps(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_CURRENT;
    pol.head_precision = FP8T_PREC_CURRENT;
    pol.pow2_scales = 1;
    pol.epsilon = 0.5f; /* above the amax of small tensors: the floor is active */
    run_policy(FP8T_ARCH_GPT2, &pol, "gpt2 current pow2 eps=0.5");
}

/* a different precision per GEMM kind and for the head, non-hybrid (E4M3 gradients) */
static void linear_mixed(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.history_len = 4;
    pol.hybrid = 0;
    char err[256];
    int rc = fp8t_policy_add_overrides(&pol,
                                       "gemm=dgrad,precision=current;"
                                       "gemm=wgrad,precision=fake;"
                                       "module=head,gemm=fprop,precision=delayed;"
                                       "module=head,gemm=wgrad,precision=block",
                                       err, sizeof(err));
    T_ASSERT(rc == 0, "%s", err);
    run_policy(FP8T_ARCH_LLAMA, &pol, "llama mixed per-gemm");
}

/* delayed and current on a backend that wants transposed FP8 copies (Hopper's TN layout) */
static void linear_transposed_copies(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.history_len = 2;
    pol.head_precision = FP8T_PREC_FP8;
    char err[256];
    T_ASSERT(fp8t_policy_add_overrides(&pol, "gemm=dgrad,precision=current", err, sizeof(err)) ==
                 0,
             "%s", err);
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 fp8, transposed copies", 1);
}

/* block on a backend with block-scaled GEMMs: the same results (within the FP32 bound: the
 * operands decode to code * scale_inv instead of code / scale, an ulp apart at most) */
static void linear_block_native(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_BLOCK;
    pol.head_precision = FP8T_PREC_BLOCK;
    pol.history_len = 2;
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 block, native GEMMs", 2);
    run_policy_on(FP8T_ARCH_LLAMA, &pol, "llama block, native GEMMs", 2);
    /* --format hybrid given: E5M2 gradients in block GEMMs too */
    pol.block_hybrid = 1;
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 block hybrid, native", 2);
}

/* block and rowwise with power-of-two scales (block then takes the scaled-operand path on any
 * backend: code * (1/scale) is code / scale exactly), and rowwise on the scaled-GEMM backend
 * (every GEMM row-scaled) */
static void linear_scaled_pow2(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_BLOCK;
    pol.head_precision = FP8T_PREC_BLOCK;
    pol.history_len = 2;
    pol.pow2_scales = 1;
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 block pow2", 0);
    pol.default_precision = pol.head_precision = FP8T_PREC_ROWWISE;
    run_policy_on(FP8T_ARCH_LLAMA, &pol, "llama rowwise pow2", 0);
    pol.pow2_scales = 0;
    pol.block_hybrid = 1;
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 rowwise hybrid, native", 2);
}

/* torchao's rowwise_with_gw_hp: rowwise Fprop and Dgrad, the Wgrad in BF16 */
static void linear_rowwise_gw_hp(void) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_ROWWISE;
    pol.history_len = 2;
    char err[256];
    T_ASSERT(fp8t_policy_add_overrides(&pol, "gemm=wgrad,precision=bf16", err, sizeof(err)) == 0,
             "%s", err);
    run_policy_on(FP8T_ARCH_GPT2, &pol, "gpt2 rowwise_with_gw_hp", 0);
}

int main(void) {
    t_suite = "linear";
    T_RUN(linear_delayed);
    T_RUN(linear_current);
    T_RUN(linear_current_pow2_eps);
    T_RUN(linear_fake);
    T_RUN(linear_bf16);
    T_RUN(linear_fp32);
    T_RUN(linear_block);
    T_RUN(linear_mxfp8);
    T_RUN(linear_mixed);
    T_RUN(linear_transposed_copies);
    T_RUN(linear_block_native);
    T_RUN(linear_rowwise);
    T_RUN(linear_scaled_pow2);
    T_RUN(linear_rowwise_gw_hp);
    T_MAIN_END();
}
