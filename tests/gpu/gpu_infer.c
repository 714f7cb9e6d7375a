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
 * reduced precision, 8e-2 — still far below the order-1 error of a layout or scale bug.
 * An FP8 cache: without RoPE the GPU stores the CPU's codes and scales bit for bit (V always);
 * a rotated K element one ulp apart can round to the neighbouring E4M3 code (2^-4), so 2e-2;
 * the decode output from such caches 2e-2. The fused operand ops are checked bit for bit
 * against the CUDA backend's own unfused ops (the same kernels' arithmetic), and against the
 * CPU within one BF16 / E4M3 rounding flip per element (norm statistics in float vs double).
 * Calibrated scales, an FP8 cache and an FP8 head keep the model's 8e-2 (the calibrating
 * forward's amaxes differ by rounding, so the scales do by an ulp or so). A decode step
 * replayed from a graph gives the bits of the same step run op by op. */
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
#include "model/operand.h"
#include "../operand_ops.h"

static int *np_, *nf_;
static uint64_t g_rng = 0x1234567ull;

static void irow(const char *op, const char *shape, double err, double tol, int ok,
                 const char *note) {
    printf("%-34s %-24s %10.3e %9.1e  %s%s%s\n", op, shape, err, tol, ok ? "PASS" : "FAIL",
           note && *note ? "  " : "", note ? note : "");
    fflush(stdout);
    if (ok)
        (*np_)++;
    else
        (*nf_)++;
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

/* cache contents [blocks, Tmax, HS] as floats (FP8: code * the position's scale_inv) */
static void cache_floats(float *out, const void *host, int kv, size_t blocks, int Tmax, int HS) {
    const size_t n = blocks * Tmax * HS;
    if (kv == FP8T_KV_FP32) {
        memcpy(out, host, n * 4);
        return;
    }
    if (kv == FP8T_KV_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)((const uint16_t *)host)[i] << 16;
            memcpy(&out[i], &u, 4);
        }
        return;
    }
    const size_t hb = fp8t_kv_head_bytes(FP8T_KV_FP8, Tmax, HS);
    for (size_t b = 0; b < blocks; b++) {
        const uint8_t *blk = (const uint8_t *)host + b * hb;
        const float *si = (const float *)(blk + fp8t_kv_scale_offset(Tmax, HS));
        for (int t = 0; t < Tmax; t++)
            for (int i = 0; i < HS; i++)
                out[(b * Tmax + t) * HS + i] =
                    fp8_decode(blk[(size_t)t * HS + i], FP8_E4M3) * si[t];
    }
}

static void decode_ops(fp8t_backend *cpu, fp8t_backend *gpu) {
    static const struct {
        int B, T, NH, NKV, HS, Tmax;
        float rope, l3;
    } cases[] = {{1, 1, 1, 1, 32, 4, 0, 0},
                 {3, 17, 4, 4, 64, 40, 0, 0},
                 {4, 33, 8, 2, 64, 64, 1e4f, 0},
                 {2, 100, 4, 1, 128, 130, 5e5f, 32},
                 {2, 9, 6, 2, 80, 16, 1e4f, 0},
                 {2, 1500, 2, 2, 64, 2600, 1e4f, 8},
                 {5, 5, 4, 4, 256, 8, 1e4f, 0},
                 {64, 20, 25, 25, 64, 24, 0, 0},
                 /* GPT-2 1.5B at batch 1 (several splits) and 64, llama-1b at 64 (GQA 4:1) */
                 {1, 128, 25, 25, 64, 160, 0, 0},
                 {64, 140, 25, 25, 64, 160, 0, 0},
                 {64, 140, 32, 8, 64, 160, 5e5f, 32},
                 {3, 40, 32, 1, 128, 300, 1e4f, 0}};
    fp8t_backend *be[2] = {cpu, gpu};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int B = cases[ci].B, T = cases[ci].T, NH = cases[ci].NH, NKV = cases[ci].NKV;
        const int HS = cases[ci].HS, Tmax = cases[ci].Tmax;
        fp8t_attn_shape s = {
            .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .rope_theta = cases[ci].rope};
        if (cases[ci].l3 > 0)
            s.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, cases[ci].l3, 1.0f, 4.0f, 64};
        const int W = fp8t_attn_qkv_width(&s);
        const size_t nqkv = (size_t)B * T * W, nkv = (size_t)B * NKV * Tmax * HS;
        const size_t nblk = (size_t)B * NKV;
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
        for (int bf = 0; bf < 3; bf++) {
            float *out[2], *kf[2], *vf[2];
            const size_t cb = nblk * fp8t_kv_head_bytes(bf, Tmax, HS); /* cache bytes */
            for (int k = 0; k < 2; k++) {
                const fp8t_backend_ops *o = be[k]->ops;
                float *dq = o->malloc(be[k], nqkv * 4), *dr = o->malloc(be[k], (size_t)B * W * 4);
                float *dout = o->malloc(be[k], nout * 4);
                int *dpos = o->malloc(be[k], (size_t)B * sizeof(int));
                void *kc = o->malloc(be[k], cb), *vc = o->malloc(be[k], cb);
                o->to_device(be[k], dq, qkv, nqkv * 4);
                o->to_device(be[k], dr, row, (size_t)B * W * 4);
                o->to_device(be[k], dpos, pos, (size_t)B * sizeof(int));
                fp8t_attn_shape one = s;
                one.T = 1;
                o->kv_cache_write(be[k], kc, vc, bf, dq, &s, Tmax);
                o->attention_decode(be[k], dout, kc, vc, bf, dr, dpos, &one, Tmax);
                void *hk = malloc(cb), *hv = malloc(cb);
                out[k] = malloc(nout * 4), kf[k] = malloc(nkv * 4), vf[k] = malloc(nkv * 4);
                o->to_host(be[k], out[k], dout, nout * 4);
                o->to_host(be[k], hk, kc, cb);
                o->to_host(be[k], hv, vc, cb);
                cache_floats(kf[k], hk, bf, nblk, Tmax, HS);
                cache_floats(vf[k], hv, bf, nblk, Tmax, HS);
                free(hk), free(hv);
                o->free(be[k], dq), o->free(be[k], dr), o->free(be[k], dout);
                o->free(be[k], dpos), o->free(be[k], kc), o->free(be[k], vc);
            }
            const double ek = rel_l2(kf[1], kf[0], nkv), ev = rel_l2(vf[1], vf[0], nkv);
            const double eo = rel_l2(out[1], out[0], nout);
            const int rope = s.rope_theta > 0;
            const double tk = bf == 2 ? (rope ? 2e-2 : 0) : bf ? 4e-3 : 1e-6;
            const double to = bf == 2 ? 2e-2 : bf ? 5e-3 : 1e-5;
            static const char *const kn[3] = {"fp32", "bf16", "fp8"};
            char op[64];
            snprintf(op, sizeof(op), "kv_cache_write K (%s cache)", kn[bf]);
            irow(op, shape, ek, tk, ek <= tk, "");
            snprintf(op, sizeof(op), "kv_cache_write V (%s cache)", kn[bf]);
            irow(op, shape, ev, 0, ev == 0, "V is copied (or rounded once): the same bits");
            snprintf(op, sizeof(op), "attention_decode (%s cache)", kn[bf]);
            irow(op, shape, eo, to, eo <= to, "");
            for (int k = 0; k < 2; k++) free(out[k]), free(kf[k]), free(vf[k]);
        }
        free(qkv), free(row), free(pos);
    }
}

/* qkv_bias (the FP8 QKV GEMM's bias, left to the attention ops): attention_forward,
 * kv_cache_write and attention_decode given the bias give the bits of the same op on qkv with
 * bias_add applied first, on the GPU (the CPU's composition is make test's). The shapes take
 * cuDNN's path (head size 128), flash's (64) and the copy fallback (80), the vectorized and
 * element-wise cache writes, the split and generic decode kernels. */
static void qkv_bias_rows(fp8t_backend *gpu) {
    static const struct {
        int B, T, NH, NKV, HS, Tmax;
        float rope;
    } cases[] = {{4, 128, 25, 25, 64, 160, 0},
                 {3, 40, 8, 2, 64, 300, 5e5f},
                 {2, 64, 4, 2, 128, 80, 5e5f},
                 {2, 9, 6, 2, 80, 16, 1e4f},
                 {2, 5, 4, 4, 256, 8, 1e4f}};
    const fp8t_backend_ops *o = gpu->ops;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int B = cases[ci].B, T = cases[ci].T, NH = cases[ci].NH, NKV = cases[ci].NKV;
        const int HS = cases[ci].HS, Tmax = cases[ci].Tmax;
        fp8t_attn_shape s = {
            .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .rope_theta = cases[ci].rope};
        const int W = fp8t_attn_qkv_width(&s);
        const size_t n = (size_t)B * T * W, nout = (size_t)B * T * NH * HS;
        const size_t nlse = (size_t)B * NH * T, ndec = (size_t)B * NH * HS;
        float *h = malloc(n * 4), *hb = malloc((size_t)W * 4);
        int hpos[64];
        for (size_t i = 0; i < n; i++) h[i] = gauss();
        for (int i = 0; i < W; i++) hb[i] = gauss();
        for (int b = 0; b < B; b++) hpos[b] = (int)(uni() * T) % T;
        float *qkv = o->malloc(gpu, n * 4), *added = o->malloc(gpu, n * 4);
        float *bias = o->malloc(gpu, (size_t)W * 4);
        int *pos = o->malloc(gpu, (size_t)B * sizeof(int));
        o->to_device(gpu, qkv, h, n * 4);
        o->to_device(gpu, added, h, n * 4);
        o->to_device(gpu, bias, hb, (size_t)W * 4);
        o->to_device(gpu, pos, hpos, (size_t)B * sizeof(int));
        o->bias_add(gpu, added, bias, B * T, W);
        char shape[96];
        snprintf(shape, sizeof(shape), "B%d T%d NH%d/%d HS%d%s", B, T, NH, NKV, HS,
                 s.rope_theta > 0 ? " rope" : "");
        for (int bf = 0; bf < 3; bf++) {
            const size_t cb = (size_t)B * NKV * fp8t_kv_head_bytes(bf, Tmax, HS);
            char *res[2]; /* out | lse | K cache | V cache | decode out, host copies */
            const size_t tot = nout * 4 + nlse * 4 + 2 * cb + ndec * 4;
            for (int k = 0; k < 2; k++) { /* k 0: the bias given; 1: added before */
                fp8t_attn_shape sk = s;
                sk.qkv_bias = k ? NULL : bias;
                const float *in = k ? added : qkv;
                float *out = o->malloc(gpu, nout * 4), *lse = o->malloc(gpu, nlse * 4);
                float *dec = o->malloc(gpu, ndec * 4);
                void *kc = o->malloc(gpu, cb), *vc = o->malloc(gpu, cb);
                o->zero(gpu, kc, cb), o->zero(gpu, vc, cb);
                o->attention_forward(gpu, out, lse, NULL, in, &sk);
                o->kv_cache_write(gpu, kc, vc, bf, in, &sk, Tmax);
                sk.T = 1; /* the first rows again, each sequence at its own position */
                o->attention_decode(gpu, dec, kc, vc, bf, in, pos, &sk, Tmax);
                res[k] = malloc(tot);
                o->to_host(gpu, res[k], out, nout * 4);
                o->to_host(gpu, res[k] + nout * 4, lse, nlse * 4);
                o->to_host(gpu, res[k] + (nout + nlse) * 4, kc, cb);
                o->to_host(gpu, res[k] + (nout + nlse) * 4 + cb, vc, cb);
                o->to_host(gpu, res[k] + (nout + nlse) * 4 + 2 * cb, dec, ndec * 4);
                o->free(gpu, out), o->free(gpu, lse), o->free(gpu, dec);
                o->free(gpu, kc), o->free(gpu, vc);
            }
            static const char *const kn[3] = {"fp32", "bf16", "fp8"};
            const size_t off[4] = {0, (nout + nlse) * 4, (nout + nlse) * 4 + 2 * cb, tot};
            static const char *const part[3] = {"attention_forward", "kv_cache_write",
                                                "attention_decode"};
            for (int q = 0; q < 3; q++) {
                if (q == 0 && bf) continue; /* the forward does not depend on the cache kind */
                const int same = !memcmp(res[0] + off[q], res[1] + off[q], off[q + 1] - off[q]);
                char op[64];
                snprintf(op, sizeof(op), "%s qkv_bias%s%s", part[q], q ? " " : "",
                         q ? kn[bf] : "");
                irow(op, shape, same ? 0.0 : 1.0, 0, same, "the bits of bias_add first");
            }
            free(res[0]), free(res[1]);
        }
        o->free(gpu, qkv), o->free(gpu, added), o->free(gpu, bias), o->free(gpu, pos);
        free(h), free(hb);
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
        int *tok = malloc((size_t)B * T * sizeof(int)),
            *pos = malloc((size_t)B * T * sizeof(int));
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
                o->embedding_forward_bf16(be[k], dout, dtok, d16, ld, dpe, per_row ? dpos : NULL,
                                          B, T, C);
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
            /* the E4M3 table: the low bytes of the same bits as codes (every finite code; a
             * NaN's payload is not defined by the op) */
            const float sinv = 0.0123f;
            for (int k = 0; k < 2; k++) {
                const fp8t_backend_ops *o = be[k]->ops;
                uint8_t *d8 = o->malloc(be[k], (size_t)V * ld);
                uint8_t *h8 = malloc((size_t)V * ld);
                for (size_t i = 0; i < (size_t)V * ld; i++)
                    h8[i] = (t16[i] & 0x7F) == 0x7F ? 0x7E : (uint8_t)t16[i];
                float *dpe = o->malloc(be[k], (size_t)T * C * 4), *dout = o->malloc(be[k], n * 4);
                float *dsi = o->malloc(be[k], 4);
                int *dtok = o->malloc(be[k], (size_t)B * T * sizeof(int));
                int *dpos = o->malloc(be[k], (size_t)B * T * sizeof(int));
                o->to_device(be[k], d8, h8, (size_t)V * ld);
                o->to_device(be[k], dpe, wpe, (size_t)T * C * 4);
                o->to_device(be[k], dsi, &sinv, 4);
                o->to_device(be[k], dtok, tok, (size_t)B * T * sizeof(int));
                o->to_device(be[k], dpos, pos, (size_t)B * T * sizeof(int));
                o->embedding_forward_fp8(be[k], dout, dtok, d8, ld, dsi, dpe,
                                         per_row ? dpos : NULL, B, T, C);
                o->to_host(be[k], out[k], dout, n * 4);
                o->free(be[k], d8), o->free(be[k], dpe), o->free(be[k], dout);
                o->free(be[k], dsi), o->free(be[k], dtok), o->free(be[k], dpos);
                free(h8);
            }
            const int same8 = !memcmp(out[0], out[1], n * 4);
            irow("embedding_forward_fp8 (bits)", shape, same8 ? 0.0 : 1.0, 0, same8, "");
            free(out[0]), free(out[1]);
        }
        free(t16), free(wpe), free(tok), free(pos);
    }
}

/* operand bytes of [rows, cols]: FP8 codes, or a BF16 operand */
static size_t operand_bytes(int fp8, int rows, int cols) {
    return fp8 ? (size_t)rows * cols : fp8t_bf16_bytes(rows, cols);
}

/* operand contents as floats [rows, cols] (FP8: the codes' values, unscaled) */
static void operand_floats(float *out, const void *h, int fp8, int rows, int cols) {
    const int ld = fp8 ? cols : fp8t_bf16_pad(cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * ld + c;
            out[(size_t)r * cols + c] = fp8 ? fp8_decode(((const uint8_t *)h)[i], FP8_E4M3)
                                            : bf16_decode(((const uint16_t *)h)[i]);
        }
}

/* make_operand's inference kernels (the residual add + norm, SwiGLU into FP8 or BF16): on the
 * GPU bit for bit the CUDA backend's unfused ops as the model composes them
 * (model_compose_operand: add_bias / add, layernorm_forward / rmsnorm_forward or
 * swiglu_forward, then the plain operand), and the CPU's values within rounding flips */
static void operand_rows(fp8t_backend *cpu, fp8t_backend *gpu) {
    static const struct {
        int rows, cols, rms, y, ybias;
    } cases[] = {{64, 1600, 0, 1, 1}, {8192, 1600, 0, 0, 0}, {37, 2048, 1, 1, 0},
                 {5, 24, 0, 1, 1},    {3, 26, 1, 1, 0},      {130, 6400, 0, 1, 1}};
    fp8t_backend *be[2] = {cpu, gpu};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int R = cases[ci].rows, C = cases[ci].cols;
        const size_t n = (size_t)R * C;
        float *a = malloc(n * 4), *y = malloc(n * 4), *yb = malloc((size_t)C * 4);
        float *w = malloc((size_t)C * 4), *bias = malloc((size_t)C * 4);
        for (size_t i = 0; i < n; i++) a[i] = 2.0f * gauss(), y[i] = gauss();
        for (int c = 0; c < C; c++)
            yb[c] = 0.1f * gauss(), w[c] = 1.0f + 0.1f * gauss(), bias[c] = 0.1f * gauss();
        const float scale = 448.0f / 6.0f;
        for (int fp8 = 0; fp8 < 2; fp8++) {
            const size_t ob = operand_bytes(fp8, R, C);
            void *h[3] = {malloc(ob), malloc(ob), malloc(ob)}; /* cpu, gpu fused, gpu unfused */
            float *sums[3] = {malloc(n * 4), malloc(n * 4), malloc(n * 4)};
            for (int k = 0; k < 3; k++) {
                fp8t_backend *b = be[k ? 1 : 0];
                const fp8t_backend_ops *o = b->ops;
                float *da = o->malloc(b, n * 4), *dy = o->malloc(b, n * 4);
                float *dyb = o->malloc(b, C * 4), *dw = o->malloc(b, C * 4);
                float *dbias = o->malloc(b, C * 4), *dsum = o->malloc(b, n * 4);
                float *dsc = o->malloc(b, 4), *tmp = o->malloc(b, n * 4);
                void *dout = o->malloc(b, ob);
                o->to_device(b, da, a, n * 4), o->to_device(b, dy, y, n * 4);
                o->to_device(b, dyb, yb, C * 4), o->to_device(b, dw, w, C * 4);
                o->to_device(b, dbias, bias, C * 4), o->to_device(b, dsc, &scale, 4);
                const float *yy = cases[ci].y ? dy : NULL, *yyb = cases[ci].ybias ? dyb : NULL;
                const float *nb = cases[ci].rms ? NULL : dbias;
                fp8t_operand_req r = t_norm_req(dout, dsum, da, yy, yyb, dw, nb, cases[ci].rms, R,
                                                C, 1e-5f, fp8 ? dsc : NULL);
                if (k < 2)
                    t_run(b, &r);
                else
                    model_compose_operand(o, b, &r, tmp);
                o->to_host(b, h[k], dout, ob);
                o->to_host(b, sums[k], dsum, n * 4);
                o->free(b, da), o->free(b, dy), o->free(b, dyb), o->free(b, dw),
                    o->free(b, dbias);
                o->free(b, dsum), o->free(b, dsc), o->free(b, tmp), o->free(b, dout);
            }
            char shape[96];
            snprintf(shape, sizeof(shape), "%dx%d %s%s%s %s", R, C, cases[ci].rms ? "rms" : "ln",
                     cases[ci].y ? " +y" : "", cases[ci].ybias ? "+bias" : "",
                     fp8 ? "fp8" : "bf16");
            const int same =
                !memcmp(h[1], h[2], ob) && (!cases[ci].y || !memcmp(sums[1], sums[2], n * 4));
            irow("norm operand = unfused (bits)", shape, same ? 0.0 : 1.0, 0, same, "");
            float *f[2] = {malloc(n * 4), malloc(n * 4)};
            operand_floats(f[0], h[0], fp8, R, C), operand_floats(f[1], h[1], fp8, R, C);
            const double e = rel_l2(f[1], f[0], n), t = fp8 ? 2e-2 : 4e-3;
            irow("norm operand vs cpu", shape, e, t, e <= t, "");
            free(f[0]), free(f[1]);
            for (int k = 0; k < 3; k++) free(h[k]), free(sums[k]);
        }
        free(a), free(y), free(yb), free(w), free(bias);
    }
    static const int sw[][2] = {{64, 8192}, {8192, 8192}, {7, 30}, {5, 12}};
    for (size_t ci = 0; ci < sizeof(sw) / sizeof(sw[0]); ci++) {
        const int R = sw[ci][0], C = sw[ci][1];
        const size_t n = (size_t)R * C;
        float *g = malloc(n * 4), *u = malloc(n * 4);
        for (size_t i = 0; i < n; i++) g[i] = 2.0f * gauss(), u[i] = gauss();
        const float scale = 448.0f / 8.0f;
        for (int fp8 = 0; fp8 < 2; fp8++) {
            const size_t ob = operand_bytes(fp8, R, C);
            void *h[3] = {malloc(ob), malloc(ob), malloc(ob)};
            for (int k = 0; k < 3; k++) {
                fp8t_backend *b = be[k ? 1 : 0];
                const fp8t_backend_ops *o = b->ops;
                float *dg = o->malloc(b, n * 4), *du = o->malloc(b, n * 4);
                float *tmp = o->malloc(b, n * 4);
                float *dsc = o->malloc(b, 4);
                void *dout = o->malloc(b, ob);
                o->to_device(b, dg, g, n * 4), o->to_device(b, du, u, n * 4);
                o->to_device(b, dsc, &scale, 4);
                fp8t_operand_req r = t_swiglu_req(dout, dg, du, R, C, fp8 ? dsc : NULL);
                if (k < 2)
                    t_run(b, &r);
                else
                    model_compose_operand(o, b, &r, tmp);
                o->to_host(b, h[k], dout, ob);
                o->free(b, dg), o->free(b, du), o->free(b, tmp), o->free(b, dsc),
                    o->free(b, dout);
            }
            char shape[64];
            snprintf(shape, sizeof(shape), "%dx%d %s", R, C, fp8 ? "fp8" : "bf16");
            const int same = !memcmp(h[1], h[2], ob);
            irow("swiglu operand = unfused (bits)", shape, same ? 0.0 : 1.0, 0, same, "");
            float *f[2] = {malloc(n * 4), malloc(n * 4)};
            operand_floats(f[0], h[0], fp8, R, C), operand_floats(f[1], h[1], fp8, R, C);
            const double e = rel_l2(f[1], f[0], n), t = fp8 ? 2e-2 : 4e-3;
            irow("swiglu operand vs cpu", shape, e, t, e <= t, "");
            free(f[0]), free(f[1]);
            for (int k = 0; k < 3; k++) free(h[k]);
        }
        free(g), free(u);
    }
}

/* The rows of an activation operand from BF16 inputs (name: swiglu16, gelu16) of [R, C]: h,
 * amax the CPU's, the GPU's and the GPU's unfused ops' operands and amaxes (amax[3]: the GPU's
 * amax-only pass); h freed */
static void act16_report(const char *name, int R, int C, int fp8, void *h[3],
                         const float amax[4]) {
    const size_t n = (size_t)R * C, ob = operand_bytes(fp8, R, C);
    char shape[64], what[64];
    snprintf(shape, sizeof(shape), "%dx%d %s", R, C, fp8 ? "fp8" : "bf16");
    const int same = !memcmp(h[1], h[2], ob) && amax[1] == amax[2] && amax[3] == amax[2];
    snprintf(what, sizeof(what), "%s operand, amax = unfused (bits)", name);
    irow(what, shape, same ? 0.0 : 1.0, 0, same, "");
    float *f[2] = {malloc(n * 4), malloc(n * 4)};
    operand_floats(f[0], h[0], fp8, R, C), operand_floats(f[1], h[1], fp8, R, C);
    const double e = rel_l2(f[1], f[0], n), t = fp8 ? 2e-2 : 4e-3;
    const double ea = fabs((double)amax[1] - amax[0]) / amax[0];
    snprintf(what, sizeof(what), "%s operand, amax vs cpu", name);
    irow(what, shape, e > ea ? e : ea, t, e <= t && ea <= 1e-6, "");
    free(f[0]), free(f[1]);
    for (int k = 0; k < 3; k++) free(h[k]);
}

/* SwiGLU of BF16 gate and up (gelu 0: the inference model's Llama MLP) or GELU of BF16 x plus a
 * bias (gelu 1: its GPT-2 MLP): on the GPU bit for bit the unfused ops on the widened values
 * (bf16_unpack, [bias_add,] swiglu_forward / gelu_forward, amax, the plain operand; codes or
 * BF16 operand), the amax-only pass the same amax; and the CPU's within rounding flips */
static void act16_rows(fp8t_backend *cpu, fp8t_backend *gpu, int gelu) {
    /* [R, C]: Llama's / GPT-2's MLP at a decode step and a prefill chunk, odd shapes; 0-ended */
    static const int sw[][2] = {{64, 8192}, {2048, 8192}, {7, 30}, {5, 12}, {0, 0}};
    static const int gl[][2] = {{64, 6400}, {2048, 6400}, {7, 30}, {0, 0}};
    const int(*cases)[2] = gelu ? gl : sw;
    fp8t_backend *be[2] = {cpu, gpu};
    for (int ci = 0; cases[ci][0]; ci++) {
        const int R = cases[ci][0], C = cases[ci][1];
        const size_t n = (size_t)R * C;
        uint16_t *x16 = malloc(n * 2), *u16 = malloc(n * 2); /* the gate (GELU's x), up */
        float *bias = malloc((size_t)C * 4);
        for (size_t i = 0; i < n; i++)
            x16[i] = bf16_encode(2.0f * gauss()), u16[i] = bf16_encode(gauss());
        for (int c = 0; c < C; c++) bias[c] = 0.5f * gauss();
        const float scale = 448.0f / 8.0f;
        for (int fp8 = 0; fp8 < 2; fp8++) {
            const size_t ob = operand_bytes(fp8, R, C);
            void *h[3] = {malloc(ob), malloc(ob), malloc(ob)};
            float amax[4] = {0, 0, 0, 0}; /* cpu, gpu, gpu unfused, gpu amax alone */
            for (int k = 0; k < 3; k++) {
                fp8t_backend *b = be[k ? 1 : 0];
                const fp8t_backend_ops *o = b->ops;
                uint16_t *dx16 = o->malloc(b, n * 2), *du16 = o->malloc(b, n * 2);
                float *db = o->malloc(b, (size_t)C * 4), *wx = o->malloc(b, n * 4),
                      *wu = o->malloc(b, n * 4), *tmp = o->malloc(b, n * 4);
                float *dsc = o->malloc(b, 4), *dam = o->malloc(b, 8);
                void *dout = o->malloc(b, ob);
                o->to_device(b, dx16, x16, n * 2), o->to_device(b, du16, u16, n * 2);
                o->to_device(b, db, bias, (size_t)C * 4), o->to_device(b, dsc, &scale, 4);
                const float *sc = fp8 ? dsc : NULL;
                if (k < 2) {
                    fp8t_operand_req r = gelu ? t_gelu16_req(dout, dx16, db, R, C, sc, dam)
                                              : t_swiglu16_req(dout, dx16, du16, R, C, sc, dam);
                    t_run(b, &r);
                    if (k == 1) {
                        r.out.data = NULL, r.out.format = FP8T_OPERAND_E4M3, r.out.scale = NULL;
                        r.out.amax = dam + 1;
                        t_run(b, &r);
                    }
                } else {
                    o->bf16_unpack(b, wx, dx16, n);
                    if (gelu) {
                        o->bias_add(b, wx, db, R, C);
                        o->gelu_forward(b, tmp, wx, n);
                    } else {
                        o->bf16_unpack(b, wu, du16, n);
                        o->swiglu_forward(b, tmp, wx, wu, NULL, NULL, n);
                    }
                    o->amax(b, dam, tmp, n);
                    fp8t_operand_req r = t_infer_req(dout, tmp, R, C, sc);
                    t_run(b, &r);
                }
                o->to_host(b, h[k], dout, ob);
                float am[2];
                o->to_host(b, am, dam, 8);
                amax[k] = am[0];
                if (k == 1) amax[3] = am[1];
                o->free(b, dx16), o->free(b, du16), o->free(b, db), o->free(b, wx);
                o->free(b, wu), o->free(b, tmp), o->free(b, dsc), o->free(b, dam);
                o->free(b, dout);
            }
            act16_report(gelu ? "gelu16" : "swiglu16", R, C, fp8, h, amax);
        }
        free(x16), free(u16), free(bias);
    }
}

/* gemm_tn_bf16_out (BF16 and per-tensor FP8 operands, fast accumulation) at the inference
 * model's MLP shapes and at ones cuBLASLt's BF16 output does not take (N % 8 != 0: the FP32
 * result rounded by bf16_pack): every value within one BF16 rounding of the rounded FP32-output
 * GEMM's (the library may sum in another order for another output type; the row says how many
 * are the same bits), and the CPU's within the FP32 sums' differences */
static void gemm16_rows(fp8t_backend *cpu, fp8t_backend *gpu) {
    static const int sh[][3] = {{64, 8192, 2048}, {2048, 8192, 2048}, {13, 24, 40}, {5, 12, 16}};
    fp8t_backend *be[2] = {cpu, gpu};
    for (size_t ci = 0; ci < sizeof(sh) / sizeof(sh[0]); ci++) {
        const int M = sh[ci][0], N = sh[ci][1], K = sh[ci][2];
        const size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
        float *A = malloc(na * 4), *B = malloc(nb * 4);
        for (size_t i = 0; i < na; i++) A[i] = gauss();
        for (size_t i = 0; i < nb; i++) B[i] = 0.05f * gauss();
        for (int fp8 = 0; fp8 < 2; fp8++) {
            uint16_t *out[3] = {malloc(nc * 2), malloc(nc * 2), malloc(nc * 2)};
            for (int k = 0; k < 3; k++) { /* cpu, gpu, gpu FP32 output rounded */
                fp8t_backend *b = be[k ? 1 : 0];
                const fp8t_backend_ops *o = b->ops;
                float *dA = o->malloc(b, na * 4), *dB = o->malloc(b, nb * 4);
                float *dC = o->malloc(b, nc * 4), *dsc = o->malloc(b, 16);
                uint16_t *d16 = o->malloc(b, nc * 2);
                uint8_t *a8 = o->malloc(b, na), *b8 = o->malloc(b, nb);
                uint16_t *a16 = o->malloc(b, fp8t_bf16_bytes(M, K));
                uint16_t *b16 = o->malloc(b, fp8t_bf16_bytes(N, K));
                const float sc[4] = {16.0f, 1.0f / 16.0f, 1024.0f, 1.0f / 1024.0f};
                o->to_device(b, dA, A, na * 4), o->to_device(b, dB, B, nb * 4);
                o->to_device(b, dsc, sc, 16);
                fp8t_operand_req r = t_fp8_req(a8, NULL, NULL, dA, M, K, FP8_E4M3, dsc);
                t_run(b, &r);
                r = t_fp8_req(b8, NULL, NULL, dB, N, K, FP8_E4M3, dsc + 2);
                t_run(b, &r);
                r = t_bf16_req(a16, NULL, dA, M, K);
                t_run(b, &r);
                r = t_bf16_req(b16, NULL, dB, N, K);
                t_run(b, &r);
                const fp8t_fp8_operand qa = {
                    a8, NULL, dsc + 1, FP8_E4M3, M, K, FP8T_SCALING_TENSOR};
                const fp8t_fp8_operand qb = {
                    b8, NULL, dsc + 3, FP8_E4M3, N, K, FP8T_SCALING_TENSOR};
                const fp8t_bf16_operand ha = {a16, M, K}, hb = {b16, N, K};
                if (k < 2) {
                    if (fp8)
                        o->gemm_tn_bf16_out(b, d16, &qa, &qb, NULL, NULL, M, N, K, 1);
                    else
                        o->gemm_tn_bf16_out(b, d16, NULL, NULL, &ha, &hb, M, N, K, 0);
                } else {
                    if (fp8)
                        o->gemm_fp8(b, dC, &qa, &qb, M, N, K, 0, 1, 0, 1, NULL, NULL);
                    else
                        o->gemm_bf16_rounded(b, dC, &ha, &hb, M, N, K, 0, 1, 0, NULL, 0);
                    o->bf16_pack(b, d16, dC, NULL, M, N);
                }
                o->to_host(b, out[k], d16, nc * 2);
                o->free(b, dA), o->free(b, dB), o->free(b, dC), o->free(b, dsc), o->free(b, d16);
                o->free(b, a8), o->free(b, b8), o->free(b, a16), o->free(b, b16);
            }
            float *f[3] = {malloc(nc * 4), malloc(nc * 4), malloc(nc * 4)};
            size_t same = 0;
            double worst = 0.0; /* |gpu - gpu rounded| in BF16 ulps of the larger */
            for (size_t i = 0; i < nc; i++) {
                for (int k = 0; k < 3; k++) f[k][i] = bf16_decode(out[k][i]);
                same += out[1][i] == out[2][i];
                const double a = fabs(f[1][i]), bb = fabs(f[2][i]);
                const double ulp = ldexp(1.0, ilogb(a > bb ? a : bb) - 7);
                const double d = fabs((double)f[1][i] - f[2][i]) / (ulp > 0 ? ulp : 1);
                if (d > worst) worst = d;
            }
            char shape[64], note[64];
            snprintf(shape, sizeof(shape), "%dx%dx%d %s", M, N, K, fp8 ? "fp8" : "bf16");
            snprintf(note, sizeof(note), "%zu of %zu the same bits", same, nc);
            irow("gemm_tn_bf16_out vs fp32 out rounded (ulps)", shape, worst, 1.0, worst <= 1.0,
                 note);
            const double e = rel_l2(f[1], f[0], nc), t = fp8 ? 1e-2 : 4e-3;
            irow("gemm_tn_bf16_out vs cpu", shape, e, t, e <= t, "");
            for (int k = 0; k < 3; k++) free(out[k]), free(f[k]);
        }
        free(A), free(B);
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
 * tokens fed to both (the CPU's greedy choices); on the GPU a third model runs the decode
 * steps op by op, against the steps replayed from the recorded graph (the same bits), which
 * prefetch each next weight into L2 (prefetch_l2 on its own stream, in the graph) */
static void model_rows(fp8t_backend *cpu, const char *name, const fp8t_model_config *cfg) {
    fp8t_weights w;
    char err[512];
    if (weights_of(cpu, cfg, &w) != 0) {
        irow("infer: weights", name, 1, 0, 0, "cannot create the model");
        return;
    }
    const int B = 4, T = 24, steps = 8, V = cfg->vocab_size, lens[4] = {24, 1, 13, 7};
    int *tok = malloc((size_t)B * T * sizeof(int)),
        *ctok = malloc((size_t)2 * B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) tok[i] = (int)(uni() * V) % V;
    for (int i = 0; i < 2 * B * T; i++) ctok[i] = (int)(uni() * V) % V;
    static const struct {
        fp8t_eval_precision p;
        fp8t_act_scale act;
        int kv, fp8_head;
        double tol;
    } runs[] = {{FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, -1, 0, 1e-4},
                {FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT, -1, 0, 3e-2},
                {FP8T_EVAL_FP8, FP8T_ACT_SCALE_CURRENT, FP8T_KV_BF16, 0, 8e-2},
                {FP8T_EVAL_FP8, FP8T_ACT_SCALE_CALIBRATED, FP8T_KV_BF16, 0, 8e-2},
                {FP8T_EVAL_FP8, FP8T_ACT_SCALE_CALIBRATED, FP8T_KV_FP8, 0, 8e-2},
                {FP8T_EVAL_FP8, FP8T_ACT_SCALE_CALIBRATED, FP8T_KV_FP8, 1, 8e-2},
                {FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT, FP8T_KV_FP8, 0, 3e-2}};
    for (size_t ri = 0; ri < sizeof(runs) / sizeof(runs[0]); ri++) {
        const fp8t_eval_precision P = runs[ri].p;
        /* FP32: the exact FP32 attention kernels for the prefill; else the default (flash) */
        const fp8t_backend_options bo = {.attn = P == FP8T_EVAL_FP32 ? FP8T_ATTN_TILED
                                                                     : FP8T_ATTN_DEFAULT};
        fp8t_backend *gpu = fp8t_backend_create("cuda", &bo, err, sizeof(err));
        fp8t_infer *m[3] = {NULL, NULL, NULL};
        fp8t_backend *be[3] = {cpu, gpu, gpu};
        int ok = gpu != NULL;
        for (int k = 0; k < 3 && ok; k++) {
            fp8t_infer_opts o;
            fp8t_infer_opts_default(&o, P, runs[ri].act);
            o.kv = runs[ri].kv;
            o.fp8_head = runs[ri].fp8_head;
            o.no_graphs = k == 2;
            o.prefetch_mb = k == 1 ? 1 : 0; /* a hint: the replayed steps' bits all the same */
            m[k] = fp8t_infer_create_opts(be[k], &w, &o, B, T + steps, err, sizeof(err));
            ok = m[k] && fp8t_infer_calibrate(m[k], ctok, 2, B, T, err, sizeof(err)) == 0;
        }
        char shape[128];
        snprintf(shape, sizeof(shape), "%s %s%s%s%s", name, fp8t_eval_precision_name(P),
                 runs[ri].act == FP8T_ACT_SCALE_CALIBRATED ? " calib" : "",
                 runs[ri].kv == FP8T_KV_FP8 ? " kv8" : "", runs[ri].fp8_head ? " head8" : "");
        if (!ok) {
            irow("infer: create", shape, 1, 0, 0, err);
            for (int k = 0; k < 3; k++) fp8t_infer_destroy(m[k]);
            fp8t_backend_destroy(gpu);
            continue;
        }
        const double tol = runs[ri].tol;
        float *lg[3] = {malloc((size_t)B * V * 4), malloc((size_t)B * V * 4),
                        malloc((size_t)B * V * 4)};
        for (int k = 0; k < 3; k++)
            ok &= fp8t_infer_prefill(m[k], tok, B, T, lens, lg[k], err, sizeof(err)) == 0;
        double e = ok ? rel_l2(lg[1], lg[0], (size_t)B * V) : NAN;
        irow("infer: prefill logits", shape, e, tol, ok && e <= tol, ok ? "" : err);
        double worst = 0;
        int next[4], pos[4], graph_same = 1;
        for (int st = 0; st < steps && ok; st++) {
            for (int b = 0; b < B; b++) {
                next[b] = fp8t_sample(lg[0] + (size_t)b * V, V, 0.0f, 0, NULL);
                pos[b] = lens[b] + st;
            }
            for (int k = 0; k < 3; k++)
                ok &= fp8t_infer_decode(m[k], next, pos, B, lg[k], err, sizeof(err)) == 0;
            double d = ok ? rel_l2(lg[1], lg[0], (size_t)B * V) : NAN;
            if (!(d <= worst)) worst = d;
            graph_same &= ok && !memcmp(lg[1], lg[2], (size_t)B * V * 4);
        }
        irow("infer: decode logits (8 steps)", shape, worst, tol, ok && worst <= tol,
             "worst step");
        if (P != FP8T_EVAL_FP32) {
            const int rec = fp8t_infer_graphs(m[1]);
            irow("infer: decode replayed, prefetching = op by op", shape, graph_same ? 0.0 : 1.0,
                 0, ok && rec && graph_same, rec ? "bits of 8 steps" : "no graph was recorded");
        }
        for (int k = 0; k < 3; k++) free(lg[k]), fp8t_infer_destroy(m[k]);
        fp8t_backend_destroy(gpu);
    }
    free(tok), free(ctok);
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
    qkv_bias_rows(gpu);
    embedding_bf16_rows(cpu, gpu);
    operand_rows(cpu, gpu);
    act16_rows(cpu, gpu, 0);
    act16_rows(cpu, gpu, 1);
    gemm16_rows(cpu, gpu);
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
