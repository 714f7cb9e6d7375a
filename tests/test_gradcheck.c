/* Gradient check of every parameter tensor of both architectures. The model runs in FP32 on
 * the CPU backend; the test has its own straightforward double-precision forward (plain
 * loops, written from the definitions) and compares:
 *   - the model's loss with the reference loss,
 *   - the model's analytic gradient of every tensor with central finite differences of the
 *     reference loss (h = 1e-5, in double).
 * A tensor passes when |g_model - g_fd| / |g_fd| (L2 norms over the tensor) is below 1e-4. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
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
    if (l >= 0) snprintf(full, sizeof(full), "h.%d.%s", l, name);
    else snprintf(full, sizeof(full), "%s", name);
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

static void ref_norm(double *out, const double *x, const double *w, const double *b, int n,
                     int C, double eps, int rms) {
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
                        acc += p[s] / z *
                               qkv[((size_t)b * T + s) * W + C + NKV * HS + kh * HS + i];
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
    const int B = r->B, T = r->T, N = B * T, C = c->n_embd, H = c->mlp_hidden,
              V = c->vocab_size;
    const int gpt2 = c->arch == FP8T_ARCH_GPT2;
    const double eps = c->norm_eps;
    double *x = calloc((size_t)N * C, sizeof(double)), *ln = calloc((size_t)N * C, 8);
    const int HS = C / c->n_head, QKV = (c->n_head + 2 * (c->n_kv_head ? c->n_kv_head : c->n_head)) * HS;
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
    ref_norm(ln, x, tensor(r, P, "lnf.w", -1), gpt2 ? tensor(r, P, "lnf.b", -1) : NULL, N, C,
             eps, !gpt2);
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
    free(x); free(ln); free(qkv); free(att); free(tmp); free(h1); free(h2); free(logits);
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
        T_CHECK(rel < 1e-4, "%s %s: gradient relative error %.3g (|g_fd| = %.3g)",
                label, info[i].name, rel, sqrt(den));
        T_CHECK(sqrt(den) > 1e-6, "%s %s: the gradient is zero, so the check is vacuous",
                label, info[i].name);
    }
    printf("  %s: %d tensors, %zu parameters, worst relative gradient error %.3g\n",
           label, nt, np, worst);
    free(grad);
    free(pf);
    free(pd);
    free(info);
    fp8t_model_destroy(m);
    fp8t_backend_destroy(be);
}

static fp8t_model_config small(fp8t_arch arch) {
    fp8t_model_config c = {.arch = arch, .n_layer = 2, .n_embd = 16, .n_head = 2, .seq_len = 8,
                           .vocab_size = 32, .mlp_hidden = arch == FP8T_ARCH_GPT2 ? 64 : 48,
                           .rope_theta = 10000.0f, .norm_eps = 1e-5f};
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

int main(void) {
    t_suite = "gradcheck";
    T_RUN(gradcheck_gpt2);
    T_RUN(gradcheck_llama);
    T_RUN(gradcheck_llama_gqa_bias_untied);
    T_RUN(gradcheck_llama_mqa_rope3);
    T_RUN(gradcheck_gpt2_untied);
    T_MAIN_END();
}
