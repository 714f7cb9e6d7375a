/* Gradient check of every parameter tensor of both architectures. The model runs in FP32 on
 * the CPU backend; the test has its own straightforward double-precision forward (plain
 * loops, written from the definitions) and compares:
 *   - the model's loss with the reference loss,
 *   - the model's analytic gradient of every tensor with central finite differences of the
 *     reference loss (h = 1e-5, in double).
 * A tensor passes when |g_model - g_fd| / |g_fd| (L2 norms over the tensor) is below 1e-4.
 *
 * Then the LM head in chunks (head.c, fp8t_model_options.head_chunk) against the unchunked
 * head, two models trained side by side (BF16 head, as the chunked path needs). Where the CPU
 * GEMM computes a row the same whatever rows the call has (OpenBLAS on one thread, chunks a
 * multiple of its row tile: 24 rows on the AVX2 kernels, so 96 here): the losses, every
 * per-position loss, the FP8 recipe state and every gradient tensor but the head's weight bit
 * for bit, the head weight's gradient (whose sum over the tokens is grouped by chunk) within
 * 1e-5 of its L2 norm. With OpenBLAS's threads and 16-row chunks (its tiles and thread split
 * then group a row's products differently), an FP32 body: every gradient within 1e-5. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "fp8train/recipe.h"
#include "test.h"

/* ---------------- the double-precision reference ---------------- */

typedef struct {
    const fp8t_model_config *c;
    const fp8t_param_info *info;
    int n_tensors;
    int B, T;
    const int *tokens, *targets;
} ref_ctx;

static const double *tensor(const ref_ctx *r, const double *params, const char *name, int l) {
    char full[64];
    if (l >= 0)
        snprintf(full, sizeof(full), "h.%d.%s", l, name);
    else
        snprintf(full, sizeof(full), "%s", name);
    for (int i = 0; i < r->n_tensors; i++)
        if (!strcmp(r->info[i].name, full)) return params + r->info[i].offset;
    fprintf(stderr, "reference: no tensor %s\n", full);
    abort();
}

/* out[n][oc] = in[n][ic] · w[oc][ic] (+ b[oc]) */
static void ref_linear(double *out, const double *in, const double *w, const double *b, int n,
                       int ic, int oc) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < oc; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < ic; k++) s += in[(size_t)i * ic + k] * w[(size_t)o * ic + k];
            out[(size_t)i * oc + o] = s;
        }
}

static void ref_norm(double *out, const double *x, const double *w, const double *b, int n, int C,
                     double eps, int rms) {
    for (int i = 0; i < n; i++) {
        const double *xi = x + (size_t)i * C;
        double mean = 0.0, var = 0.0;
        if (!rms) {
            for (int k = 0; k < C; k++) mean += xi[k];
            mean /= C;
        }
        for (int k = 0; k < C; k++) var += (xi[k] - mean) * (xi[k] - mean);
        var /= C;
        double rstd = 1.0 / sqrt(var + eps);
        for (int k = 0; k < C; k++)
            out[(size_t)i * C + k] = (xi[k] - mean) * rstd * w[k] + (b ? b[k] : 0.0);
    }
}

/* the RoPE inverse frequency of pair i, in double from the definitions (Llama 3.1's "llama3"
 * scaling: wavelengths below original/high_freq_factor kept, above original/low_freq_factor
 * divided by factor, linear in original/wavelength between) */
static double ref_inv_freq(const fp8t_model_config *c, int i, int HS) {
    double f = pow(c->rope_theta, -2.0 * i / HS);
    const fp8t_rope_scaling *r = &c->rope_scaling;
    if (r->type != FP8T_ROPE_LLAMA3) return f;
    double wl = 2 * M_PI / f, ctx = r->original_max_pos;
    if (wl < ctx / r->high_freq_factor) return f;
    if (wl > ctx / r->low_freq_factor) return f / r->factor;
    double a = (ctx / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - a) * f / r->factor + a * f;
}

/* x[HS] rotated in place by position t (rotate-half pairs (i, i + HS/2)) */
static void ref_rope(double *x, int t, int HS, const fp8t_model_config *c) {
    for (int i = 0; i < HS / 2; i++) {
        double ang = t * ref_inv_freq(c, i, HS);
        double x0 = x[i], x1 = x[i + HS / 2];
        x[i] = x0 * cos(ang) - x1 * sin(ang);
        x[i + HS / 2] = x0 * sin(ang) + x1 * cos(ang);
    }
}

/* causal attention on qkv[B*T][(NH + 2 NKV) HS] (q heads, then k, then v heads; query head h
 * reads key/value head h / (NH / NKV)); RoPE when rope */
static void ref_attention(double *out, const double *qkv, int B, int T,
                          const fp8t_model_config *c, int rope) {
    const int NH = c->n_head, HS = c->n_embd / NH, C = NH * HS;
    const int NKV = c->n_kv_head ? c->n_kv_head : NH, W = (NH + 2 * NKV) * HS;
    double *q = malloc(sizeof(double) * HS), *k = malloc(sizeof(double) * (size_t)T * HS);
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kh = h / (NH / NKV);
            /* rotated keys of every position */
            for (int t = 0; t < T; t++) {
                const double *src = qkv + ((size_t)b * T + t) * W + C + kh * HS;
                for (int i = 0; i < HS; i++) k[(size_t)t * HS + i] = src[i];
                if (rope) ref_rope(k + (size_t)t * HS, t, HS, c);
            }
            for (int t = 0; t < T; t++) {
                const double *src = qkv + ((size_t)b * T + t) * W + h * HS;
                for (int i = 0; i < HS; i++) q[i] = src[i];
                if (rope) ref_rope(q, t, HS, c);
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    double d = 0.0;
                    for (int i = 0; i < HS; i++) d += q[i] * k[(size_t)s * HS + i];
                    p[s] = d / sqrt((double)HS);
                    if (p[s] > mx) mx = p[s];
                }
                double z = 0.0;
                for (int s = 0; s <= t; s++) z += (p[s] = exp(p[s] - mx));
                double *o = out + ((size_t)b * T + t) * C + h * HS;
                for (int i = 0; i < HS; i++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++)
                        acc +=
                            p[s] / z * qkv[((size_t)b * T + s) * W + C + NKV * HS + kh * HS + i];
                    o[i] = acc;
                }
            }
        }
    free(q);
    free(k);
    free(p);
}

static double ref_loss(const ref_ctx *r, const double *P) {
    const fp8t_model_config *c = r->c;
    const int B = r->B, T = r->T, N = B * T, C = c->n_embd, H = c->mlp_hidden, V = c->vocab_size;
    const int gpt2 = c->arch == FP8T_ARCH_GPT2;
    const double eps = c->norm_eps;
    double *x = calloc((size_t)N * C, sizeof(double)), *ln = calloc((size_t)N * C, 8);
    const int HS = C / c->n_head,
              QKV = (c->n_head + 2 * (c->n_kv_head ? c->n_kv_head : c->n_head)) * HS;
    double *qkv = calloc((size_t)N * QKV, 8), *att = calloc((size_t)N * C, 8);
    double *tmp = calloc((size_t)N * C, 8), *h1 = calloc((size_t)N * H, 8);
    double *h2 = calloc((size_t)N * H, 8), *logits = calloc((size_t)N * V, 8);
    const double *wte = tensor(r, P, "wte", -1);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < C; k++)
            x[(size_t)i * C + k] = wte[(size_t)r->tokens[i] * C + k] +
                                   (gpt2 ? tensor(r, P, "wpe", -1)[(size_t)(i % T) * C + k] : 0);
    for (int l = 0; l < c->n_layer; l++) {
        ref_norm(ln, x, tensor(r, P, "ln1.w", l), gpt2 ? tensor(r, P, "ln1.b", l) : NULL, N, C,
                 eps, !gpt2);
        const int qkv_b = gpt2 || c->qkv_bias;
        ref_linear(qkv, ln, tensor(r, P, "qkv.w", l), qkv_b ? tensor(r, P, "qkv.b", l) : NULL, N,
                   C, QKV);
        ref_attention(att, qkv, B, T, c, !gpt2);
        ref_linear(tmp, att, tensor(r, P, "proj.w", l), gpt2 ? tensor(r, P, "proj.b", l) : NULL,
                   N, C, C);
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += tmp[i];
        ref_norm(ln, x, tensor(r, P, "ln2.w", l), gpt2 ? tensor(r, P, "ln2.b", l) : NULL, N, C,
                 eps, !gpt2);
        if (gpt2) {
            ref_linear(h1, ln, tensor(r, P, "fc1.w", l), tensor(r, P, "fc1.b", l), N, C, H);
            for (size_t i = 0; i < (size_t)N * H; i++) {
                double u = h1[i];
                h1[i] = 0.5 * u * (1.0 + tanh(sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
            }
            ref_linear(tmp, h1, tensor(r, P, "fc2.w", l), tensor(r, P, "fc2.b", l), N, H, C);
        } else {
            ref_linear(h1, ln, tensor(r, P, "gate.w", l), NULL, N, C, H);
            ref_linear(h2, ln, tensor(r, P, "up.w", l), NULL, N, C, H);
            for (size_t i = 0; i < (size_t)N * H; i++)
                h1[i] = h1[i] / (1.0 + exp(-h1[i])) * h2[i];
            ref_linear(tmp, h1, tensor(r, P, "down.w", l), NULL, N, H, C);
        }
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += tmp[i];
    }
    ref_norm(ln, x, tensor(r, P, "lnf.w", -1), gpt2 ? tensor(r, P, "lnf.b", -1) : NULL, N, C, eps,
             !gpt2);
    ref_linear(logits, ln, c->untied_head ? tensor(r, P, "lm_head.w", -1) : wte, NULL, N, C, V);
    double loss = 0.0;
    int count = 0;
    for (int i = 0; i < N; i++) {
        if (r->targets[i] < 0) continue;
        const double *z = logits + (size_t)i * V;
        double mx = z[0], s = 0.0;
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        loss += mx + log(s) - z[r->targets[i]];
        count++;
    }
    free(x);
    free(ln);
    free(qkv);
    free(att);
    free(tmp);
    free(h1);
    free(h2);
    free(logits);
    return loss / count;
}

/* ---------------- the check ---------------- */

static uint64_t rng_state = 42;
static double rnd_uniform(void) { /* (0, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double rnd_normal(void) {
    return sqrt(-2.0 * log(rnd_uniform())) * cos(6.283185307179586 * rnd_uniform());
}

static void gradcheck_config(const fp8t_model_config *cfg, const char *label) {
    char err[256];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "cpu backend: %s", err);
    const fp8t_model_config c = *cfg;
    const fp8t_arch arch = c.arch;
    const int B = 2, T = 8, N = B * T;
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_FP32;
    pol.head_precision = FP8T_PREC_FP32;
    fp8t_model *m = fp8t_model_create(be, &c, &pol, NULL, B, T, err, sizeof(err));
    T_ASSERT(m, "model: %s", err);

    size_t np = fp8t_model_num_params(m);
    int nt = fp8t_model_param_table(&c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)nt, sizeof(*info));
    fp8t_model_param_table(&c, info, NULL);

    /* random parameters in general position: norms and biases away from 1 / 0 */
    rng_state = 42 + (uint64_t)arch;
    float *pf = malloc(np * sizeof(float));
    double *pd = malloc(np * sizeof(double));
    for (int i = 0; i < nt; i++) {
        const char *dot = strrchr(info[i].name, '.');
        int is_norm_w = info[i].ndim == 1 && dot && !strcmp(dot, ".w");
        for (size_t k = 0; k < info[i].numel; k++) {
            double v = info[i].ndim == 2 ? 0.3 * rnd_normal()
                       : is_norm_w       ? 1.0 + 0.2 * rnd_normal()
                                         : 0.1 * rnd_normal();
            pf[info[i].offset + k] = (float)v;
        }
    }
    for (size_t i = 0; i < np; i++) pd[i] = pf[i]; /* the reference sees the same values */
    be->ops->to_device(be, fp8t_model_params(m), pf, np * sizeof(float));

    int tokens[16], targets[16];
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)(rnd_uniform() * c.vocab_size);
        targets[i] = (int)(rnd_uniform() * c.vocab_size);
    }
    targets[5] = -1; /* an ignored position: no loss, no gradient */

    fp8t_model_zero_grad(m);
    float loss = fp8t_model_forward(m, tokens, targets);
    fp8t_model_backward(m, 1.0f);
    float *grad = malloc(np * sizeof(float));
    be->ops->to_host(be, grad, fp8t_model_grads(m), np * sizeof(float));

    ref_ctx r = {&c, info, nt, B, T, tokens, targets};
    double ref = ref_loss(&r, pd);
    printf("  %s: model loss %.7f, reference loss %.7f\n", label, loss, ref);
    T_CLOSE(loss, ref, 0.0, 2e-6);

    const double h = 1e-5;
    double worst = 0.0;
    for (int i = 0; i < nt; i++) {
        double num = 0.0, den = 0.0;
        for (size_t k = 0; k < info[i].numel; k++) {
            size_t j = info[i].offset + k;
            double save = pd[j];
            pd[j] = save + h;
            double lp = ref_loss(&r, pd);
            pd[j] = save - h;
            double lm = ref_loss(&r, pd);
            pd[j] = save;
            double fd = (lp - lm) / (2 * h);
            num += (grad[j] - fd) * (grad[j] - fd);
            den += fd * fd;
        }
        double rel = sqrt(num) / (sqrt(den) > 1e-12 ? sqrt(den) : 1e-12);
        if (rel > worst) worst = rel;
        T_CHECK(rel < 1e-4, "%s %s: gradient relative error %.3g (|g_fd| = %.3g)", label,
                info[i].name, rel, sqrt(den));
        T_CHECK(sqrt(den) > 1e-6, "%s %s: the gradient is zero, so the check is vacuous", label,
                info[i].name);
    }
    printf("  %s: %d tensors, %zu parameters, worst relative gradient error %.3g\n", label, nt,
           np, worst);
    free(grad);
    free(pf);
    free(pd);
    free(info);
    fp8t_model_destroy(m);
    fp8t_backend_destroy(be);
}

static fp8t_model_config small(fp8t_arch arch) {
    fp8t_model_config c = {.arch = arch,
                           .n_layer = 2,
                           .n_embd = 16,
                           .n_head = 2,
                           .seq_len = 8,
                           .vocab_size = 32,
                           .mlp_hidden = arch == FP8T_ARCH_GPT2 ? 64 : 48,
                           .rope_theta = 10000.0f,
                           .norm_eps = 1e-5f};
    return c;
}

static void gradcheck_gpt2(void) {
    fp8t_model_config c = small(FP8T_ARCH_GPT2);
    gradcheck_config(&c, "gpt2");
}
static void gradcheck_llama(void) {
    fp8t_model_config c = small(FP8T_ARCH_LLAMA);
    gradcheck_config(&c, "llama");
}
/* GQA 2:1 (4 query heads share 2 K/V heads) with Qwen2's q/k/v biases and an untied head */
static void gradcheck_llama_gqa_bias_untied(void) {
    fp8t_model_config c = small(FP8T_ARCH_LLAMA);
    c.n_head = 4, c.n_kv_head = 2, c.qkv_bias = 1, c.untied_head = 1;
    gradcheck_config(&c, "llama gqa 2:1 + qkv bias + untied head");
}
/* multi-query attention with Llama-3 RoPE scaling; head size 8 and an original context of 64
 * put the 4 rotation pairs (wavelengths 6.3, 63, 628, 6283) into all three bands */
static void gradcheck_llama_mqa_rope3(void) {
    fp8t_model_config c = small(FP8T_ARCH_LLAMA);
    c.n_embd = 32, c.n_head = 4, c.n_kv_head = 1;
    c.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 64};
    gradcheck_config(&c, "llama mqa + llama3 rope");
}
/* GPT-2 with its own LM head */
static void gradcheck_gpt2_untied(void) {
    fp8t_model_config c = small(FP8T_ARCH_GPT2);
    c.untied_head = 1;
    gradcheck_config(&c, "gpt2 untied head");
}

/* ---------------- the LM head in chunks against the unchunked head ---------------- */

/* FP32 summation in another grouping: a sum over the 45 tokens of a micro-batch (two micro-
 * batches accumulated) moves each element by a few units of FP32 roundoff (6e-8) of the sum of
 * its terms' magnitudes; 1e-5 of the tensor's norm holds that with a wide margin and fails a
 * missing, doubled or wrongly scaled chunk (an error of order 1). */
#define CHUNK_DW_TOL 1e-5

static void noop_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)ctx, (void)m, (void)s, (void)x;
}

static fp8t_model *chunk_model(fp8t_backend *be, const fp8t_model_config *c, const fp8t_policy *p,
                               int B, int T, int head_chunk) {
    const fp8t_model_options o = {.head_chunk = head_chunk};
    char err[256];
    fp8t_model *m = fp8t_model_create(be, c, p, &o, B, T, err, sizeof(err));
    if (!m)
        printf("  create: %s\n", err);
    else
        fp8t_model_init_weights(m, 777);
    return m;
}

static float *dev_copy(fp8t_backend *be, const void *dev, size_t bytes) {
    float *h = malloc(bytes ? bytes : 1);
    be->ops->to_host(be, h, dev, bytes);
    return h;
}

/* Gradients of a (unchunked) and b (chunked): the number of mismatches (printed); the head
 * weight's relative L2 difference into *head_rel. */
static int compare_chunk_grads(fp8t_backend *be, fp8t_model *a, fp8t_model *b,
                               const fp8t_param_info *info, int nt, const char *head, int exact,
                               const char *when, double *head_rel) {
    const size_t np = fp8t_model_num_params(a);
    float *ga = dev_copy(be, fp8t_model_grads(a), np * 4),
          *gb = dev_copy(be, fp8t_model_grads(b), np * 4);
    int bad = 0;
    *head_rel = 0;
    for (int i = 0; i < nt; i++) {
        const float *x = ga + info[i].offset, *y = gb + info[i].offset;
        const int is_head = !strcmp(info[i].name, head);
        if (exact && !is_head) {
            if (memcmp(x, y, info[i].numel * 4) != 0) {
                if (!bad)
                    printf("  %s: gradient of %s differs (exact expected)\n", when, info[i].name);
                bad++;
            }
            continue;
        }
        double num = 0, den = 0;
        for (size_t k = 0; k < info[i].numel; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)x[k] * x[k];
        }
        const double rel = den > 0 ? sqrt(num / den) : INFINITY;
        if (rel > *head_rel) *head_rel = rel;
        if (!(rel <= CHUNK_DW_TOL) || !(den > 0)) {
            if (!bad)
                printf("  %s: %s gradient %.3g of its norm apart (tolerance %g)\n", when,
                       info[i].name, rel, CHUNK_DW_TOL);
            bad++;
        }
    }
    free(ga);
    free(gb);
    return bad;
}

/* n floats the same bits, or (rtol > 0) each within rtol of the larger magnitude */
static int same_dev(fp8t_backend *be, const void *x, const void *y, size_t n, double rtol) {
    float *hx = dev_copy(be, x, n * 4), *hy = dev_copy(be, y, n * 4);
    int same = 1;
    for (size_t i = 0; same && i < n; i++) {
        if (!memcmp(&hx[i], &hy[i], 4)) continue;
        const double d = fabs((double)hx[i] - hy[i]), mag = fmax(fabs(hx[i]), fabs(hy[i]));
        same = rtol > 0 && d <= rtol * mag;
    }
    free(hx);
    free(hy);
    return same;
}

/* micro-batch k; every 7th target ignored, or (ignore_chunk) all of the second chunk's */
static void chunk_batch(int *tok, int *tgt, int N, int V, int k, int rows, int ignore_chunk) {
    for (int i = 0; i < N; i++) {
        tok[i] = (k * 17 + i * 5) % V;
        tgt[i] = i % 7 == 3 ? -1 : (k * 11 + i * 3 + 1) % V;
        if (ignore_chunk && i >= rows && i < 2 * rows) tgt[i] = -1;
    }
}

/* Micro-batches of the side-by-side run, two per optimizer step. */
typedef struct {
    float dloss;
    int ignore_chunk; /* every target of the second chunk ignored */
    int read_logits;  /* fp8t_model_logits between the forward and the backward */
    int bump_epoch;   /* the policy set again between them: nothing may be recomputed */
} chunk_micro;

/* a (unchunked) and b (chunks of `rows`) side by side over the micro-batches of `plan`.
 * exact: on one OpenBLAS thread, everything but the head weight's gradient bit for bit; else
 * every gradient, loss and amax within 1e-5. */
static void chunk_case(const char *label, fp8t_model_config c, fp8t_precision body, int B, int T,
                       int rows, int exact) {
    char err[256];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "cpu backend: %s", err);
    const int N = B * T;
    c.seq_len = T;
    c.vocab_size = 61; /* odd: the logits rows are padded */
    const int V = c.vocab_size, Vp = fp8t_bf16_pad(V);
    const double rtol = exact ? 0.0 : CHUNK_DW_TOL;
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = body; /* the head stays BF16 (the default head precision) */
    pol.history_len = 4;
    fp8t_model *a = chunk_model(be, &c, &pol, B, T, FP8T_HEAD_CHUNK_OFF);
    fp8t_model *b = chunk_model(be, &c, &pol, B, T, rows);
    T_ASSERT(a && b, "%s: create", label);
    T_CHECK(fp8t_model_head_chunk_rows(a) == 0 && fp8t_model_head_chunk_rows(b) == rows,
            "%s: chunk rows %d / %d", label, fp8t_model_head_chunk_rows(a),
            fp8t_model_head_chunk_rows(b));
    const int nt = fp8t_model_param_table(&c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)nt, sizeof(*info));
    fp8t_model_param_table(&c, info, NULL);
    const char *head = c.untied_head ? "lm_head.w" : "wte";
    const size_t np = fp8t_model_num_params(a);
    const size_t st =
        fp8t_recipe_state_floats(fp8t_model_fp8_count(a), fp8t_model_fp8_history_len(a));
    /* the first forward has no known dloss (the chunked one makes the losses, its backward
     * the chunks' gradient); then a chunk of ignored targets, a logits read, a dloss that
     * changes (the chunks made again with it), the policy set again with the same dloss (the
     * kept gradient) and with another (the kept gradient scaled by 0.2 / 0.3) */
    static const chunk_micro plan[] = {{0.5f, 0, 0, 0}, {0.5f, 1, 0, 0}, {0.5f, 0, 1, 0},
                                       {0.3f, 0, 0, 0}, {0.3f, 0, 0, 1}, {0.2f, 0, 0, 1}};
    const int n_micro = (int)(sizeof(plan) / sizeof(plan[0]));
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    fp8t_model *m[2] = {a, b};
    double worst = 0;
    int bad = 0;
    const int threads = omp_get_max_threads();
    if (exact) omp_set_num_threads(1);
    for (int j = 0; j < n_micro; j++) {
        const chunk_micro *mc = &plan[j];
        char when[160];
        snprintf(when, sizeof(when), "%s micro-batch %d", label, j);
        if (j % 2 == 0)
            for (int k = 0; k < 2; k++) fp8t_model_zero_grad(m[k]);
        chunk_batch(tok, tgt, N, V, j, rows, mc->ignore_chunk);
        float loss[2];
        for (int k = 0; k < 2; k++) loss[k] = fp8t_model_forward(m[k], tok, tgt);
        if (!isfinite(loss[0]) || (memcmp(&loss[0], &loss[1], 4) &&
                                   !(fabs((double)loss[0] - loss[1]) <= rtol * fabs(loss[0])))) {
            printf("  %s: loss %.9g vs %.9g\n", when, loss[0], loss[1]);
            bad++;
        }
        if (!same_dev(be, fp8t_model_losses(a), fp8t_model_losses(b), (size_t)N, rtol)) {
            printf("  %s: per-position losses differ\n", when);
            bad++;
        }
        if (mc->read_logits) {
            /* rebuilt by the head GEMM again (and allocated: N x pad(V) floats more) */
            const size_t before = fp8t_model_activation_bytes(b);
            if (!same_dev(be, fp8t_model_logits(a), fp8t_model_logits(b), (size_t)N * V, 0)) {
                printf("  %s: logits differ\n", when);
                bad++;
            }
            T_CHECK(fp8t_model_activation_bytes(b) == before + (size_t)N * Vp * 4,
                    "%s: the logits read took %zu bytes", when,
                    fp8t_model_activation_bytes(b) - before);
        }
        if (mc->bump_epoch)
            for (int k = 0; k < 2; k++) {
                fp8t_policy same = *fp8t_model_get_policy(m[k]);
                fp8t_model_set_policy(m[k], &same);
            }
        for (int k = 0; k < 2; k++) fp8t_model_backward(m[k], mc->dloss);
        double rel = 0;
        bad += compare_chunk_grads(be, a, b, info, nt, head, exact, when, &rel);
        if (rel > worst) worst = rel;
        if (!same_dev(be, fp8t_model_fp8_state(a), fp8t_model_fp8_state(b), st, rtol)) {
            printf("  %s: FP8 recipe state (amax histories) differs\n", when);
            bad++;
        }
        if (j == 1) {
            /* no [N, V] buffer in the chunked model (its chunk buffers fit the backward's
             * scratch) */
            const size_t ba = fp8t_model_activation_bytes(a), bb = fp8t_model_activation_bytes(b);
            T_CHECK(ba >= bb + (size_t)N * Vp * 4,
                    "%s: activation bytes %zu unchunked, %zu "
                    "chunked: expected at least the logits' %zu fewer",
                    when, ba, bb, (size_t)N * Vp * 4);
        }
        if (j % 2 == 1) {
            /* the optimizer step on the same gradients, so the next step starts equal */
            be->ops->copy(be, fp8t_model_grads(b), fp8t_model_grads(a), np * 4);
            for (int k = 0; k < 2; k++) {
                float norm = fp8t_model_grad_norm(m[k]);
                fp8t_model_adamw(m[k], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, j / 2 + 1, 1.0f, norm);
                fp8t_model_end_step(m[k]);
            }
            if (!exact)
                be->ops->copy(be, fp8t_model_fp8_state(b), fp8t_model_fp8_state(a), st * 4);
        }
    }
    /* validation: a frozen forward, the losses only, and still no logits buffer beyond the
     * one the read above allocated (what else it allocates, one layer's scratch for the saves
     * a training forward keeps in FP32, the unchunked model allocates too) */
    const size_t ba = fp8t_model_activation_bytes(a), bb = fp8t_model_activation_bytes(b);
    float vl[2];
    for (int k = 0; k < 2; k++) {
        fp8t_model_set_frozen(m[k], 1);
        vl[k] = fp8t_model_forward(m[k], tok, tgt);
        fp8t_model_set_frozen(m[k], 0);
    }
    T_CHECK(fabs((double)vl[0] - vl[1]) <= rtol * fabs(vl[0]) &&
                same_dev(be, fp8t_model_losses(a), fp8t_model_losses(b), (size_t)N, rtol),
            "%s: frozen forward losses %.9g vs %.9g", label, vl[0], vl[1]);
    T_CHECK(fp8t_model_activation_bytes(b) - bb == fp8t_model_activation_bytes(a) - ba,
            "%s: the frozen forward allocated %zu bytes, %zu unchunked", label,
            fp8t_model_activation_bytes(b) - bb, fp8t_model_activation_bytes(a) - ba);
    printf("  %s: %d micro-batches of %d tokens in chunks of %d, gradients at most %.3g of "
           "their norm from the unchunked ones%s\n",
           label, n_micro, N, rows, worst,
           exact ? " (the head weight's; every other tensor, the losses and the amaxes bit for "
                   "bit)"
                 : "");
    T_CHECK(bad == 0, "%s: %d mismatches", label, bad);
    omp_set_num_threads(threads);
    free(tok);
    free(tgt);
    free(info);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
    fp8t_backend_destroy(be);
}

/* 249 tokens in chunks of 96: 96, 96 and a last chunk of 57 (not a multiple of 8: its
 * operands end in padding rows); the second chunk's targets all ignored in one micro-batch */
static void head_chunks_gpt2(void) {
    chunk_case("gpt2 tied, bf16", small(FP8T_ARCH_GPT2), FP8T_PREC_BF16, 3, 83, 96, 1);
    fp8t_model_config c = small(FP8T_ARCH_GPT2);
    c.untied_head = 1;
    chunk_case("gpt2 untied, fp8 delayed body", c, FP8T_PREC_DELAYED, 3, 83, 96, 1);
    /* 45 tokens in chunks of 16 (16, 16, 13) on OpenBLAS's threads, FP32 body */
    chunk_case("gpt2 tied, fp32 body, threaded", small(FP8T_ARCH_GPT2), FP8T_PREC_FP32, 3, 15, 16,
               0);
}

static void head_chunks_llama(void) {
    chunk_case("llama tied, fp8 current body", small(FP8T_ARCH_LLAMA), FP8T_PREC_CURRENT, 3, 83,
               96, 1);
    fp8t_model_config c = small(FP8T_ARCH_LLAMA);
    c.n_head = 4, c.n_kv_head = 2, c.untied_head = 1, c.qkv_bias = 1;
    chunk_case("llama gqa untied, bf16", c, FP8T_PREC_BF16, 3, 83, 96, 1);
    chunk_case("llama gqa untied, fp32 body, threaded", c, FP8T_PREC_FP32, 3, 15, 16, 0);
}

/* A hook set between a chunked forward and its backward (the hook wants every tensor):
 * before the model's first backward, the backward makes the logits again and takes the plain
 * path, the bits of the unchunked model's; after it, the forward's gradient is kept (scaled
 * when the dloss changed: within BF16 rounding of the plain path's). */
static void head_chunks_hook_between(void) {
    char err[256];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "cpu backend: %s", err);
    fp8t_model_config c = small(FP8T_ARCH_GPT2);
    const int B = 3, T = 83, N = B * T;
    c.seq_len = T;
    c.vocab_size = 61;
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_BF16;
    fp8t_model *m[2] = {chunk_model(be, &c, &pol, B, T, FP8T_HEAD_CHUNK_OFF),
                        chunk_model(be, &c, &pol, B, T, 96)};
    T_ASSERT(m[0] && m[1], "create");
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const size_t np = fp8t_model_num_params(m[0]);
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    chunk_batch(tok, tgt, N, c.vocab_size, 1, 96, 0);
    for (int k = 0; k < 2; k++) {
        fp8t_model_zero_grad(m[k]);
        fp8t_model_forward(m[k], tok, tgt);
        fp8t_model_set_hook(m[k], noop_hook, NULL);
        fp8t_model_backward(m[k], 0.5f);
    }
    T_CHECK(same_dev(be, fp8t_model_grads(m[0]), fp8t_model_grads(m[1]), np, 0),
            "first backward with a hook set after the forward: the gradients differ");
    for (int k = 0; k < 2; k++) {
        fp8t_model_set_hook(m[k], NULL, NULL);
        fp8t_model_zero_grad(m[k]);
        fp8t_model_forward(m[k], tok, tgt);
        fp8t_model_set_hook(m[k], noop_hook, NULL);
        fp8t_model_backward(m[k], 0.375f);
    }
    float *g0 = dev_copy(be, fp8t_model_grads(m[0]), np * 4),
          *g1 = dev_copy(be, fp8t_model_grads(m[1]), np * 4);
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        num += ((double)g1[i] - g0[i]) * ((double)g1[i] - g0[i]);
        den += (double)g0[i] * g0[i];
    }
    /* the BF16 dlogits made with 0.5 and scaled by 0.75 against dlogits made with 0.375: a
     * few BF16 roundings (2^-9) apart, where a missing scale would be 33% off */
    T_CHECK(den > 0 && sqrt(num / den) < 1e-2, "rescaled gradient %.3g from the plain path's",
            den > 0 ? sqrt(num / den) : -1.0);
    free(g0);
    free(g1);
    free(tok);
    free(tgt);
    fp8t_model_destroy(m[0]);
    fp8t_model_destroy(m[1]);
    omp_set_num_threads(threads);
    fp8t_backend_destroy(be);
}

/* Where the chunked head applies and where it does not: the option's values, auto's choice
 * (never at the CPU suite's shapes), an FP8 head, a hook, the fused cross-entropy off. */

static void head_chunks_when(void) {
    char err[256];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "cpu backend: %s", err);
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    fp8t_model_config tiny;
    fp8t_model_preset(&tiny, "tiny");
    fp8t_model_options o = {.head_chunk = 12};
    fp8t_model *m = fp8t_model_create(be, &tiny, &pol, &o, 2, 64, err, sizeof(err));
    T_CHECK(!m && strstr(err, "multiple of 8"), "head_chunk 12 accepted (%s)", err);
    fp8t_model_destroy(m);
    /* auto at tiny shapes (the CLI tests' 8 x 128 tokens): unchunked */
    m = fp8t_model_create(be, &tiny, &pol, NULL, 8, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "auto chunks tiny 8x128: %d rows",
            fp8t_model_head_chunk_rows(m));
    fp8t_model_destroy(m);
    /* auto with a GPT-2 vocabulary and 2048 tokens (617 MB of logits and dlogits): the
     * backward's scratch holds too few rows, so the least, 1024 */
    fp8t_model_config big = tiny;
    big.n_layer = 1, big.n_embd = 16, big.n_head = 2, big.mlp_hidden = 64, big.vocab_size = 50257;
    m = fp8t_model_create(be, &big, &pol, NULL, 16, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 1024, "auto, 2048 tokens of V 50257: %d rows",
            fp8t_model_head_chunk_rows(m));
    /* nothing of [N, V] allocated at create */
    T_CHECK(fp8t_model_activation_bytes(m) < (size_t)2048 * 50264 * 4,
            "create holds %zu activation bytes", fp8t_model_activation_bytes(m));
    fp8t_model_destroy(m);
    /* explicit rows: chunks only when the micro-batch has more tokens */
    o.head_chunk = 128;
    m = fp8t_model_create(be, &tiny, &pol, &o, 1, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "128 tokens in chunks of 128: %d rows",
            fp8t_model_head_chunk_rows(m));
    fp8t_model_destroy(m);
    m = fp8t_model_create(be, &tiny, &pol, &o, 2, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 128, "256 tokens: %d rows",
            fp8t_model_head_chunk_rows(m));
    /* a hook sees the whole logits: unchunked while it is set */
    fp8t_model_set_hook(m, noop_hook, NULL);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "hooked: %d rows", fp8t_model_head_chunk_rows(m));
    fp8t_model_set_hook(m, NULL, NULL);
    /* an FP8 head: unchunked */
    fp8t_policy fp8_head = pol;
    fp8_head.head_precision = FP8T_PREC_DELAYED;
    fp8t_model_set_policy(m, &fp8_head);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "fp8 head: %d rows",
            fp8t_model_head_chunk_rows(m));
    fp8t_model_set_policy(m, &pol);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 128, "bf16 head again: %d rows",
            fp8t_model_head_chunk_rows(m));
    fp8t_model_destroy(m);
    /* the plain cross-entropy paths: unchunked */
    o.disable = FP8T_DISABLE_BF16_XENT;
    m = fp8t_model_create(be, &tiny, &pol, &o, 2, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "bf16-xent off: %d rows",
            fp8t_model_head_chunk_rows(m));
    fp8t_model_destroy(m);
    o.disable = 0;
    o.head_chunk = FP8T_HEAD_CHUNK_OFF;
    m = fp8t_model_create(be, &tiny, &pol, &o, 2, 128, err, sizeof(err));
    T_ASSERT(m, "%s", err);
    T_CHECK(fp8t_model_head_chunk_rows(m) == 0, "off: %d rows", fp8t_model_head_chunk_rows(m));
    fp8t_model_destroy(m);
    fp8t_backend_destroy(be);
}

int main(void) {
    t_suite = "gradcheck";
    T_RUN(gradcheck_gpt2);
    T_RUN(gradcheck_llama);
    T_RUN(gradcheck_llama_gqa_bias_untied);
    T_RUN(gradcheck_llama_mqa_rope3);
    T_RUN(gradcheck_gpt2_untied);
    T_RUN(head_chunks_gpt2);
    T_RUN(head_chunks_llama);
    T_RUN(head_chunks_hook_between);
    T_RUN(head_chunks_when);
    T_MAIN_END();
}
