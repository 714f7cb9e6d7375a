/* gpu_test rows for inference (include/fp8train/infer.h): the inference ops of the CUDA
 * backend (kv_cache_write, attention_decode, embedding_forward_bf16: cuda_attention_decode.cu)
 * against the CPU's, and the inference model's prefill and decode logits on both backends in
 * FP32, BF16 and FP8.
 *
 * Tolerances (relative L2 over the whole tensor). The ops: the FP32 cache holds the same
 * rotated K up to an FMA contraction in the GPU's rotation (1 ulp), so 1e-6; a BF16 cache may
 * round such an element the other way (2^-8), so 4e-3; the decode output sums the same
 * products in another order: 1e-5 from an FP32 cache, 5e-3 from BF16 ones (the rounding flips
 * above, averaged by the softmax). The model: FP32 with the FP32 attention kernels
 * (attention option tiled): GEMM summation order through 2 layers, 1e-4; BF16 (BF16 flash
 * attention in the prefill): operand rounding flips carried through the layers, 3e-2; FP8:
 * an E4M3 flip is a 6-12% step on one element and the GPU accumulates FP8 products in
 * reduced precision, 8e-2 — still far below the order-1 error of a layout or scale bug. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/infer.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"

static int *np_, *nf_;
static uint64_t g_rng = 0x1234567ull;

static void irow(const char *op, const char *shape, double err, double tol, int ok,
                 const char *note) {
    printf("%-34s %-24s %10.3e %9.1e  %s%s%s\n", op, shape, err, tol, ok ? "PASS" : "FAIL",
           note && *note ? "  " : "", note ? note : "");
    fflush(stdout);
    if (ok) (*np_)++;
    else (*nf_)++;
}

static double uni(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}
static float gauss(void) {
    return (float)(sqrt(-2.0 * log(uni() + 1e-300)) * cos(6.283185307179586 * uni()));
}

/* relative L2 error of a against b; NaN when either holds a non-finite value */
static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return NAN;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* cache contents as floats */
static void cache_floats(float *out, const void *host, int bf16, size_t n) {
    if (!bf16) {
        memcpy(out, host, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)((const uint16_t *)host)[i] << 16;
        memcpy(&out[i], &u, 4);
    }
}

static void decode_ops(fp8t_backend *cpu, fp8t_backend *gpu) {
    static const struct {
        int B, T, NH, NKV, HS, Tmax;
        float rope, l3;
    } cases[] = {{1, 1, 1, 1, 32, 4, 0, 0},         {3, 17, 4, 4, 64, 40, 0, 0},
                 {4, 33, 8, 2, 64, 64, 1e4f, 0},     {2, 100, 4, 1, 128, 130, 5e5f, 32},
                 {2, 9, 6, 2, 80, 16, 1e4f, 0},      {2, 1500, 2, 2, 64, 2600, 1e4f, 8},
                 {5, 5, 4, 4, 256, 8, 1e4f, 0},      {64, 20, 25, 25, 64, 24, 0, 0}};
    fp8t_backend *be[2] = {cpu, gpu};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int B = cases[ci].B, T = cases[ci].T, NH = cases[ci].NH, NKV = cases[ci].NKV;
        const int HS = cases[ci].HS, Tmax = cases[ci].Tmax;
        fp8t_attn_shape s = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                             .rope_theta = cases[ci].rope};
        if (cases[ci].l3 > 0)
            s.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, cases[ci].l3, 1.0f, 4.0f, 64};
        const int W = fp8t_attn_qkv_width(&s);
        const size_t nqkv = (size_t)B * T * W, nkv = (size_t)B * NKV * Tmax * HS;
        const size_t nout = (size_t)B * NH * HS;
        float *qkv = malloc(nqkv * 4), *row = malloc((size_t)B * W * 4);
        int *pos = malloc((size_t)B * sizeof(int));
        for (size_t i = 0; i < nqkv; i++) qkv[i] = gauss();
        /* each sequence decodes at its own position in 0..T (the prefill filled 0..T-1: the
         * positions after pos must not matter, and pos itself is overwritten) */
        for (int b = 0; b < B; b++) {
            pos[b] = (int)(uni() * (T + 1));
            if (pos[b] > T) pos[b] = T;
            if (pos[b] >= Tmax) pos[b] = Tmax - 1;
            for (int i = 0; i < W; i++) row[(size_t)b * W + i] = gauss();
        }
        char shape[96];
        snprintf(shape, sizeof(shape), "B%d T%d NH%d/%d HS%d%s%s", B, T, NH, NKV, HS,
                 s.rope_theta > 0 ? " rope" : "", cases[ci].l3 > 0 ? " l3" : "");
        for (int bf = 0; bf < 2; bf++) {
            float *out[2], *kf[2], *vf[2];
            for (int k = 0; k < 2; k++) {
                const fp8t_backend_ops *o = be[k]->ops;
                const size_t eb = bf ? 2 : 4;
                float *dq = o->malloc(be[k], nqkv * 4), *dr = o->malloc(be[k], (size_t)B * W * 4);
                float *dout = o->malloc(be[k], nout * 4);
                int *dpos = o->malloc(be[k], (size_t)B * sizeof(int));
                void *kc = o->malloc(be[k], nkv * eb), *vc = o->malloc(be[k], nkv * eb);
                o->to_device(be[k], dq, qkv, nqkv * 4);
                o->to_device(be[k], dr, row, (size_t)B * W * 4);
                o->to_device(be[k], dpos, pos, (size_t)B * sizeof(int));
                fp8t_attn_shape one = s;
                one.T = 1;
                o->kv_cache_write(be[k], kc, vc, bf, dq, &s, Tmax);
                o->attention_decode(be[k], dout, kc, vc, bf, dr, dpos, &one, Tmax);
                void *hk = malloc(nkv * eb), *hv = malloc(nkv * eb);
                out[k] = malloc(nout * 4), kf[k] = malloc(nkv * 4), vf[k] = malloc(nkv * 4);
                o->to_host(be[k], out[k], dout, nout * 4);
                o->to_host(be[k], hk, kc, nkv * eb);
                o->to_host(be[k], hv, vc, nkv * eb);
                cache_floats(kf[k], hk, bf, nkv);
                cache_floats(vf[k], hv, bf, nkv);
                free(hk), free(hv);
                o->free(be[k], dq), o->free(be[k], dr), o->free(be[k], dout);
                o->free(be[k], dpos), o->free(be[k], kc), o->free(be[k], vc);
            }
            const double ek = rel_l2(kf[1], kf[0], nkv), ev = rel_l2(vf[1], vf[0], nkv);
            const double eo = rel_l2(out[1], out[0], nout);
            const double tk = bf ? 4e-3 : 1e-6, to = bf ? 5e-3 : 1e-5;
            irow(bf ? "kv_cache_write K (bf16 cache)" : "kv_cache_write K (fp32 cache)", shape,
                 ek, tk, ek <= tk, "");
            irow(bf ? "kv_cache_write V (bf16 cache)" : "kv_cache_write V (fp32 cache)", shape,
                 ev, 0, ev == 0, "V is copied (or rounded once): the same bits");
            irow(bf ? "attention_decode (bf16 cache)" : "attention_decode (fp32 cache)", shape,
                 eo, to, eo <= to, "");
            for (int k = 0; k < 2; k++) free(out[k]), free(kf[k]), free(vf[k]);
        }
        free(qkv), free(row), free(pos);
    }
}

/* embedding_forward_bf16: a widened BF16 element plus a float, the same bits on both */
static void embedding_bf16_rows(fp8t_backend *cpu, fp8t_backend *gpu) {
    static const int cases[][4] = {{50257, 1600, 1608, 64}, {512, 256, 256, 7}, {37, 21, 24, 5}};
    fp8t_backend *be[2] = {cpu, gpu};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int V = cases[ci][0], C = cases[ci][1], ld = cases[ci][2], N = cases[ci][3];
        const int T = N > 4 ? 4 : N, B = N / T;
        uint16_t *t16 = malloc((size_t)V * ld * 2);
        float *wpe = malloc((size_t)T * C * 4);
        int *tok = malloc((size_t)B * T * sizeof(int)), *pos = malloc((size_t)B * T * sizeof(int));
        for (size_t i = 0; i < (size_t)V * ld; i++) {
            float x = gauss();
            uint32_t u;
            memcpy(&u, &x, 4);
            t16[i] = (uint16_t)(u >> 16);
        }
        for (int i = 0; i < T * C; i++) wpe[i] = gauss();
        for (int i = 0; i < B * T; i++)
            tok[i] = (int)(uni() * V) % V, pos[i] = (int)(uni() * T) % T;
        float *out[2];
        const size_t n = (size_t)B * T * C;
        for (int per_row = 0; per_row < 2; per_row++) {
            for (int k = 0; k < 2; k++) {
                const fp8t_backend_ops *o = be[k]->ops;
                uint16_t *d16 = o->malloc(be[k], (size_t)V * ld * 2);
                float *dpe = o->malloc(be[k], (size_t)T * C * 4), *dout = o->malloc(be[k], n * 4);
                int *dtok = o->malloc(be[k], (size_t)B * T * sizeof(int));
                int *dpos = o->malloc(be[k], (size_t)B * T * sizeof(int));
                o->to_device(be[k], dpos, pos, (size_t)B * T * sizeof(int));
                o->to_device(be[k], d16, t16, (size_t)V * ld * 2);
                o->to_device(be[k], dpe, wpe, (size_t)T * C * 4);
                o->to_device(be[k], dtok, tok, (size_t)B * T * sizeof(int));
                o->embedding_forward_bf16(be[k], dout, dtok, d16, ld, dpe, per_row ? dpos : NULL, B,
                                          T, C);
                out[k] = malloc(n * 4);
                o->to_host(be[k], out[k], dout, n * 4);
                o->free(be[k], d16), o->free(be[k], dpe), o->free(be[k], dout);
                o->free(be[k], dtok);
                o->free(be[k], dpos);
            }
            char shape[64];
            snprintf(shape, sizeof(shape), "V%d C%d ld%d N%d%s", V, C, ld, B * T,
                     per_row ? " pos" : "");
            const int same = !memcmp(out[0], out[1], n * 4);
            irow("embedding_forward_bf16 (bits)", shape, same ? 0.0 : 1.0, 0, same, "");
            free(out[0]), free(out[1]);
        }
        free(t16), free(wpe), free(tok), free(pos);
    }
}

/* random weights of cfg as fp8t_weights (the training model's init on the CPU) */
static int weights_of(fp8t_backend *cpu, const fp8t_model_config *cfg, fp8t_weights *w) {
    char err[512];
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    fp8t_model *m = fp8t_model_create(cpu, cfg, &pol, NULL, 1, 8, err, sizeof(err));
    if (!m) return -1;
    fp8t_model_init_weights(m, 77);
    memset(w, 0, sizeof(*w));
    w->model = *cfg;
    w->num_params = fp8t_model_num_params(m);
    w->params = malloc(w->num_params * 4);
    cpu->ops->to_host(cpu, w->params, fp8t_model_params(m), w->num_params * 4);
    fp8t_model_destroy(m);
    snprintf(w->source, sizeof(w->source), "gpu_test weights");
    return 0;
}

/* prefill + 8 decode steps of 4 prompts of different lengths on both backends, the same
 * tokens fed to both (the CPU's greedy choices) */
static void model_rows(fp8t_backend *cpu, const char *name, const fp8t_model_config *cfg) {
    fp8t_weights w;
    char err[512];
    if (weights_of(cpu, cfg, &w) != 0) {
        irow("infer: weights", name, 1, 0, 0, "cannot create the model");
        return;
    }
    const int B = 4, T = 24, steps = 8, V = cfg->vocab_size, lens[4] = {24, 1, 13, 7};
    int *tok = malloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) tok[i] = (int)(uni() * V) % V;
    static const fp8t_eval_precision P[3] = {FP8T_EVAL_FP32, FP8T_EVAL_BF16, FP8T_EVAL_FP8};
    static const double tol[3] = {1e-4, 3e-2, 8e-2};
    for (int pi = 0; pi < 3; pi++) {
        /* FP32: the exact FP32 attention kernels for the prefill; else the default (flash) */
        const fp8t_backend_options bo = {.attn = P[pi] == FP8T_EVAL_FP32 ? FP8T_ATTN_TILED
                                                                         : FP8T_ATTN_DEFAULT};
        fp8t_backend *gpu = fp8t_backend_create("cuda", &bo, err, sizeof(err));
        fp8t_infer *m[2] = {NULL, NULL};
        fp8t_backend *be[2] = {cpu, gpu};
        for (int k = 0; k < 2 && gpu; k++)
            m[k] = fp8t_infer_create(be[k], &w, P[pi], FP8T_ACT_SCALE_CURRENT, B, T + steps,
                                     err, sizeof(err));
        char shape[96];
        snprintf(shape, sizeof(shape), "%s %s", name, fp8t_eval_precision_name(P[pi]));
        if (!m[0] || !m[1]) {
            irow("infer: create", shape, 1, 0, 0, err);
            fp8t_infer_destroy(m[0]), fp8t_infer_destroy(m[1]);
            fp8t_backend_destroy(gpu);
            continue;
        }
        float *lg[2] = {malloc((size_t)B * V * 4), malloc((size_t)B * V * 4)};
        int ok = 1;
        for (int k = 0; k < 2; k++)
            ok &= fp8t_infer_prefill(m[k], tok, B, T, lens, lg[k], err, sizeof(err)) == 0;
        double e = ok ? rel_l2(lg[1], lg[0], (size_t)B * V) : NAN;
        irow("infer: prefill logits", shape, e, tol[pi], ok && e <= tol[pi], ok ? "" : err);
        double worst = 0;
        int next[4], pos[4];
        for (int st = 0; st < steps && ok; st++) {
            for (int b = 0; b < B; b++) {
                next[b] = fp8t_sample(lg[0] + (size_t)b * V, V, 0.0f, 0, NULL);
                pos[b] = lens[b] + st;
            }
            for (int k = 0; k < 2; k++)
                ok &= fp8t_infer_decode(m[k], next, pos, B, lg[k], err, sizeof(err)) == 0;
            double d = ok ? rel_l2(lg[1], lg[0], (size_t)B * V) : NAN;
            if (!(d <= worst)) worst = d;
        }
        irow("infer: decode logits (8 steps)", shape, worst, tol[pi], ok && worst <= tol[pi],
             "worst step");
        free(lg[0]), free(lg[1]);
        fp8t_infer_destroy(m[0]), fp8t_infer_destroy(m[1]);
        fp8t_backend_destroy(gpu);
    }
    free(tok);
    fp8t_weights_free(&w);
}

void gpu_test_infer(int *n_pass, int *n_fail) {
    np_ = n_pass, nf_ = n_fail;
    char err[512];
    fp8t_backend *cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    fp8t_backend *gpu = fp8t_backend_create("cuda", NULL, err, sizeof(err));
    if (!cpu || !gpu) {
        irow("infer: backends", "-", 1, 0, 0, err);
        fp8t_backend_destroy(cpu), fp8t_backend_destroy(gpu);
        return;
    }
    printf("== cuda vs cpu: inference (KV cache ops, inference model)\n");
    decode_ops(cpu, gpu);
    embedding_bf16_rows(cpu, gpu);
    fp8t_backend_destroy(gpu);
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    c.n_layer = 2, c.n_embd = 256, c.n_head = 4, c.seq_len = 64, c.vocab_size = 512;
    c.mlp_hidden = 1024;
    model_rows(cpu, "gpt2-small-ish", &c);
    fp8t_model_preset(&c, "tiny-llama");
    c.n_layer = 2, c.n_embd = 256, c.n_head = 8, c.n_kv_head = 2, c.seq_len = 64;
    c.vocab_size = 512, c.mlp_hidden = 768, c.untied_head = 1, c.qkv_bias = 1;
    model_rows(cpu, "llama-small-ish gqa", &c);
    fp8t_backend_destroy(cpu);
}
