/* CPU backend — causal multi-head self-attention, flash-attention style.
 *
 * Forward: one pass over qkv makes head-major copies of rope(q), rope(k) and v; then per
 * (batch, head) query rows are processed in blocks of ATT_QB: scores
 * S = scale * q·kᵀ over the keys up to the block's last row (GEMM), softmax per row with the
 * keys after the row's position masked, out = P·v (GEMM, written in place). Only the
 * log-sum-exp of each row is saved (lse[B,NH,T]); no [T,T] matrix survives the op.
 *
 * Backward recomputes P row-block by row-block from q, k and lse (P = exp(S - lse)) and uses
 * D_i = sum(dout_i * out_i):  dS = P * (dout·vᵀ - D),  dq = dS·k,  dk += dSᵀ·q,  dv += Pᵀ·dout.
 * Each (batch, head) is one work item computed by one thread in a fixed order, so the result
 * does not depend on the number of threads.
 *
 * Grouped-query attention: query head h reads key/value head h / (NH/NKV). The backward
 * computes each query head's dk, dv contribution on its own, then sums the heads of a group in
 * head order (one fixed order, whatever the threads), so with NKV = NH nothing is summed and
 * the bits are those of plain multi-head attention.
 *
 * RoPE (rotate-half): for i < HS/2, angle = t * inv_freq_i (fp8t_rope_inv_freq:
 * theta^(-2i/HS), with Llama-3 scaling when asked);
 *   x'[i] = x[i] cos - x[i+HS/2] sin,  x'[i+HS/2] = x[i+HS/2] cos + x[i] sin. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Query rows per block: the score block [ATT_QB, T] stays in L2, and the GEMMs on it are large
 * enough for OpenBLAS to run near its peak. */
enum { ATT_QB = 64 };

/* cos/sin table [T][cos half | sin half] of the RoPE angles, computed in double; NULL when
 * RoPE is off. Every layer's forward and backward of every step asks for the same table, so
 * it is kept in the backend per (HS, theta) and only recomputed for a longer T (a row depends
 * on t only, so a table for a longer T serves shorter ones). */
static int same_scaling(const fp8t_rope_scaling *a, const fp8t_rope_scaling *b) {
    return a->type == b->type && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_pos == b->original_max_pos;
}

static const float *rope_tables(fp8t_backend *b, const fp8t_attn_shape *sh) {
    const int T = sh->T, HS = sh->HS;
    const float theta = sh->rope_theta;
    if (theta <= 0.0f) return NULL;
    if (HS % 2) {
        FP8T_FATAL("attention: RoPE needs an even head size, got %d; change n_embd / "
                   "n_head or disable rope",
                   HS);
    }
    cpu_state *s = cpu_of(b);
    if (s->rope && s->rope_T >= T && s->rope_HS == HS && s->rope_theta == theta &&
        same_scaling(&s->rope_scaling, &sh->rope_scaling))
        return s->rope;
    int half = HS / 2;
    free(s->rope);
    float *tab = CPU_ZALLOC((size_t)T * HS * sizeof(float)); /* [T][cos half | sin half] */
    for (int i = 0; i < half; i++) {
        const double freq = fp8t_rope_inv_freq(sh, i);
        for (int t = 0; t < T; t++) {
            double ang = (double)t * freq;
            tab[(size_t)t * HS + i] = (float)cos(ang);
            tab[(size_t)t * HS + half + i] = (float)sin(ang);
        }
    }
    s->rope = tab, s->rope_T = T, s->rope_HS = HS, s->rope_theta = theta;
    s->rope_scaling = sh->rope_scaling;
    return tab;
}

/* dst[HS] = rope(src[HS]) at position t (tab NULL: no rotation) */
static inline void rope_apply(float *dst, const float *src, const float *tab, int t, int HS) {
    if (!tab) {
        memcpy(dst, src, (size_t)HS * sizeof(float));
        return;
    }
    int half = HS / 2;
    const float *c = tab + (size_t)t * HS, *s = c + half;
    for (int i = 0; i < half; i++) {
        float x1 = src[i], x2 = src[i + half];
        dst[i] = x1 * c[i] - x2 * s[i];
        dst[i + half] = x2 * c[i] + x1 * s[i];
    }
}

/* dst[HS] = rope⁻¹ applied to a gradient: the transpose of the rotation */
static inline void rope_grad(float *dst, const float *g, const float *tab, int t, int HS) {
    if (!tab) {
        memcpy(dst, g, (size_t)HS * sizeof(float));
        return;
    }
    int half = HS / 2;
    const float *c = tab + (size_t)t * HS, *s = c + half;
    for (int i = 0; i < half; i++) {
        float g1 = g[i], g2 = g[i + half];
        dst[i] = g1 * c[i] + g2 * s[i];
        dst[i + half] = g2 * c[i] - g1 * s[i];
    }
}

/* ---- row kernels of the softmax (vectorized: these loops are most of the non-GEMM time) */

/* x = exp(x - sub); returns the sum (in a fixed, compile-time order) */
static float row_exp_sum(float *x, int n, float sub) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        float e = cpu_expf(x[j] - sub);
        x[j] = e;
        sum += e;
    }
    return sum;
}

static void row_scale(float *x, int n, float s) {
#pragma omp simd
    for (int j = 0; j < n; j++) x[j] *= s;
}

/* p = exp(s - lse) from the scores in p; ds = p * (dp - D) from dP in ds */
static void row_probs_dscores(float *p, float *ds, int n, float lse, float D) {
#pragma omp simd
    for (int j = 0; j < n; j++) {
        float pj = cpu_expf(p[j] - lse);
        p[j] = pj;
        ds[j] = pj * (ds[j] - D);
    }
}

/* Row-major single-threaded GEMM on the per-head buffers. Called inside the OpenMP parallel
 * region, where OpenBLAS (OpenMP build) runs on the calling thread only, so each (batch, head)
 * work item is computed the same way whatever the number of threads. */
static inline void gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                        int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Head-major copies of q (rotated), k (rotated) and v: Q[B][NH][T][HS], K/V[B][NKV][T][HS],
 * made by one pass over qkv in token order. Reading qkv sequentially streams from memory; gathering one head's
 * rows (stride 3C) inside each work item instead stalls on every row. */
static void split_heads(float *Q, float *K, float *V, const float *qkv, const fp8t_attn_shape *sh,
                        const float *tab) {
    const int B = sh->B, T = sh->T, NH = sh->NH, NKV = fp8t_attn_nkv(sh), HS = sh->HS;
    const int CQ = NH * HS, CKV = NKV * HS, W = fp8t_attn_qkv_width(sh);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int bi = bt / T, t = bt % T;
        const float *tok = qkv + (size_t)bt * W;
        for (int h = 0; h < NH; h++)
            rope_apply(Q + (((size_t)bi * NH + h) * T + t) * HS, tok + h * HS, tab, t, HS);
        for (int h = 0; h < NKV; h++) {
            size_t dst = (((size_t)bi * NKV + h) * T + t) * HS;
            rope_apply(K + dst, tok + CQ + h * HS, tab, t, HS);
            memcpy(V + dst, tok + CQ + CKV + h * HS, (size_t)HS * sizeof(float));
        }
    }
}

const float *cpu_qkv_biased(fp8t_backend *b, const float *qkv, const fp8t_attn_shape *s,
                            size_t rows) {
    if (!s->qkv_bias || !rows) return qkv;
    const int W = fp8t_attn_qkv_width(s);
    float *y = cpu_scratch(b, CPU_SCRATCH_QKV, rows * W * sizeof(float));
    memcpy(y, qkv, rows * W * sizeof(float));
    cpu_bias_add(b, y, s->qkv_bias, (int)rows, W);
    return y;
}

void cpu_attention_forward(fp8t_backend *b, float *out, float *lse, void *saved, const float *qkv,
                           const fp8t_attn_shape *sh) {
    (void)saved; /* the CPU rebuilds everything from qkv: attention_saved_bytes is 0 */
    const int B = sh->B, T = sh->T, NH = sh->NH, NKV = fp8t_attn_nkv(sh), HS = sh->HS;
    const int C = NH * HS, G = NH / NKV; /* G query heads per key/value head */
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t nq = (size_t)B * T * C, nkv = (size_t)B * T * NKV * HS;
    const float *tab = rope_tables(b, sh);
    /* head-major Q [B][NH][T][HS], K, V [B][NKV][T][HS] */
    float *Qall = cpu_scratch(b, CPU_SCRATCH_ATTN, (nq + 2 * nkv) * sizeof(float));
    float *Kall = Qall + nq, *Vall = Kall + nkv;
    split_heads(Qall, Kall, Vall, cpu_qkv_biased(b, qkv, sh, (size_t)B * T), sh, tab);
#pragma omp parallel
    {
        float *S = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float)); /* [QB][T] scores, probs */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const size_t kvh = (size_t)bi * NKV + h / G;
            const float *Q = Qall + (size_t)bh * T * HS;       /* [T][HS] */
            const float *K = Kall + kvh * T * HS;              /* [T][HS] */
            const float *V = Vall + kvh * T * HS;              /* [T][HS] */
            float *lse_bh = lse ? lse + (size_t)bh * T : NULL; /* [T]; NULL: not kept */
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq_ = T - t0 < ATT_QB ? T - t0 : ATT_QB, kend = t0 + nq_;
                /* S[nq][kend] = scale * Q_blk · K[0:kend]ᵀ */
                gemm(0, 1, nq_, kend, HS, scale, Q + (size_t)t0 * HS, HS, K, HS, 0.0f, S, kend);
                for (int qi = 0; qi < nq_; qi++) {
                    float *srow = S + (size_t)qi * kend;
                    int nk = t0 + qi + 1; /* causal: keys 0..t */
                    float mx = cpu_row_max(srow, nk);
                    float sum = row_exp_sum(srow, nk, mx);
                    row_scale(srow, nk, 1.0f / sum);
                    for (int j = nk; j < kend; j++) srow[j] = 0.0f;
                    if (lse_bh) lse_bh[t0 + qi] = mx + logf(sum);
                }
                /* out[t0:t0+nq] = P · V[0:kend], written in place with the row stride C */
                float *dst = out + ((size_t)bi * T + t0) * C + (size_t)h * HS;
                gemm(0, 0, nq_, HS, kend, 1.0f, S, kend, V, HS, 0.0f, dst, C);
            }
        }
        free(S);
    }
}

void cpu_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, const float *out, const float *lse,
                            const fp8t_attn_shape *sh) {
    (void)saved;
    if (sh->qkv_bias) FP8T_FATAL("attention_backward: qkv_bias is for the forward ops only");
    const int B = sh->B, T = sh->T, NH = sh->NH, NKV = fp8t_attn_nkv(sh), HS = sh->HS;
    const int C = NH * HS, CKV = NKV * HS, W = fp8t_attn_qkv_width(sh), G = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t nq = (size_t)B * T * C, nkv = (size_t)B * T * CKV;
    const float *tab = rope_tables(b, sh);
    /* head-major Q, dO [B][NH][T][HS], K, V [B][NKV][T][HS], D [B][NH][T], and each query
     * head's dK, dV contributions [B][NH][T][HS] (summed over a group at the end) */
    size_t scratch_floats = 4 * nq + 2 * nkv + (size_t)B * NH * T;
    float *Qall = cpu_scratch(b, CPU_SCRATCH_ATTN, scratch_floats * sizeof(float));
    float *Kall = Qall + nq, *Vall = Kall + nkv, *dOall = Vall + nkv;
    float *dKall = dOall + nq, *dVall = dKall + nq, *Dall = dVall + nq;
    split_heads(Qall, Kall, Vall, qkv, sh, tab);
    /* dO per head, and D = sum(dout * out) per (token, head) in double */
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int bi = bt / T, t = bt % T;
        const float *dtok = dout + (size_t)bt * C, *otok = out + (size_t)bt * C;
        for (int h = 0; h < NH; h++) {
            size_t row = ((size_t)bi * NH + h) * T + t;
            memcpy(dOall + row * HS, dtok + h * HS, (size_t)HS * sizeof(float));
            double D = 0.0;
            for (int d = 0; d < HS; d++) D += (double)dtok[h * HS + d] * otok[h * HS + d];
            Dall[row] = (float)D;
        }
    }
#pragma omp parallel
    {
        size_t th = (size_t)T * HS * sizeof(float);
        float *dQ = CPU_ZALLOC(th); /* [T][HS] gradient wrt rope(q) */
        float *P = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float));  /* [QB][T] */
        float *dS = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float)); /* [QB][T] dP, then dS */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const size_t kvh = (size_t)bi * NKV + h / G;
            const float *Q = Qall + (size_t)bh * T * HS, *K = Kall + kvh * T * HS;
            const float *V = Vall + kvh * T * HS, *dO = dOall + (size_t)bh * T * HS;
            const float *Dv = Dall + (size_t)bh * T, *lse_bh = lse + (size_t)bh * T;
            float *dK = dKall + (size_t)bh * T * HS; /* [T][HS] gradient wrt rope(k) */
            float *dV = dVall + (size_t)bh * T * HS; /* [T][HS] */
            memset(dK, 0, th);
            memset(dV, 0, th);
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq_ = T - t0 < ATT_QB ? T - t0 : ATT_QB, kend = t0 + nq_;
                const float *Qb = Q + (size_t)t0 * HS, *dOb = dO + (size_t)t0 * HS;
                /* P = exp(scale * Q_blk·Kᵀ - lse), recomputed; 0 above the diagonal */
                gemm(0, 1, nq_, kend, HS, scale, Qb, HS, K, HS, 0.0f, P, kend);
                /* dP = dO_blk · V[0:kend]ᵀ */
                gemm(0, 1, nq_, kend, HS, 1.0f, dOb, HS, V, HS, 0.0f, dS, kend);
                for (int qi = 0; qi < nq_; qi++) {
                    float *prow = P + (size_t)qi * kend, *srow = dS + (size_t)qi * kend;
                    int nk = t0 + qi + 1;
                    row_probs_dscores(prow, srow, nk, lse_bh[t0 + qi], Dv[t0 + qi]);
                    for (int j = nk; j < kend; j++) prow[j] = srow[j] = 0.0f;
                }
                /* dQ_blk = scale * dS · K;  dK += scale * dSᵀ · Q_blk;  dV += Pᵀ · dO_blk */
                gemm(0, 0, nq_, HS, kend, scale, dS, kend, K, HS, 0.0f, dQ + (size_t)t0 * HS, HS);
                gemm(1, 0, kend, HS, nq_, scale, dS, kend, Qb, HS, 1.0f, dK, HS);
                gemm(1, 0, kend, HS, nq_, 1.0f, P, kend, dOb, HS, 1.0f, dV, HS);
            }
            /* back through the rotation (its transpose) into dq */
            for (int t = 0; t < T; t++)
                rope_grad(dqkv + ((size_t)bi * T + t) * W + (size_t)h * HS, dQ + (size_t)t * HS,
                          tab, t, HS);
        }
        free(dQ);
        free(P);
        free(dS);
    }
    /* dk, dv of each key/value head: its group's query heads summed in head order (in the
     * group's first head's rows), then back through the rotation */
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int bi = bt / T, t = bt % T;
        float *dtok = dqkv + (size_t)bt * W;
        for (int kh = 0; kh < NKV; kh++) {
            float *dk = dKall + (((size_t)bi * NH + (size_t)kh * G) * T + t) * HS;
            float *dv = dVall + (((size_t)bi * NH + (size_t)kh * G) * T + t) * HS;
            for (int g = 1; g < G; g++) {
                const size_t off = (size_t)g * T * HS; /* the same token, head kh*G + g */
                for (int d = 0; d < HS; d++) {
                    dk[d] += dk[off + d];
                    dv[d] += dv[off + d];
                }
            }
            rope_grad(dtok + C + (size_t)kh * HS, dk, tab, t, HS);
            memcpy(dtok + C + CKV + (size_t)kh * HS, dv, (size_t)HS * sizeof(float));
        }
    }
}

size_t cpu_attention_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *s) {
    (void)b, (void)s;
    return 0;
}
