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
 * RoPE (rotate-half): for i < HS/2, angle = t * theta^(-2i/HS);
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
static const float *rope_tables(fp8t_backend *b, int T, int HS, float theta) {
    if (theta <= 0.0f) return NULL;
    if (HS % 2) {
        fprintf(stderr,
                "fp8train: attention: RoPE needs an even head size, got %d; change n_embd / "
                "n_head or disable rope (%s:%d)\n",
                HS, __FILE__, __LINE__);
        exit(1);
    }
    cpu_state *s = cpu_of(b);
    if (s->rope && s->rope_T >= T && s->rope_HS == HS && s->rope_theta == theta) return s->rope;
    int half = HS / 2;
    free(s->rope);
    float *tab = CPU_ZALLOC((size_t)T * HS * sizeof(float)); /* [T][cos half | sin half] */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double freq = pow((double)theta, -2.0 * i / HS);
            double ang = (double)t * freq;
            tab[(size_t)t * HS + i] = (float)cos(ang);
            tab[(size_t)t * HS + half + i] = (float)sin(ang);
        }
    s->rope = tab, s->rope_T = T, s->rope_HS = HS, s->rope_theta = theta;
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

/* Head-major copies of q (rotated), k (rotated) and v: Q/K/V[B][NH][T][HS], made by one pass
 * over qkv in token order. Reading qkv sequentially streams from memory; gathering one head's
 * rows (stride 3C) inside each work item instead stalls on every row. */
static void split_heads(float *Q, float *K, float *V, const float *qkv, int B, int T, int NH,
                        int HS, const float *tab) {
    const int C = NH * HS, C3 = 3 * C;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int bi = bt / T, t = bt % T;
        const float *tok = qkv + (size_t)bt * C3;
        for (int h = 0; h < NH; h++) {
            size_t dst = (((size_t)bi * NH + h) * T + t) * HS;
            rope_apply(Q + dst, tok + h * HS, tab, t, HS);
            rope_apply(K + dst, tok + C + h * HS, tab, t, HS);
            memcpy(V + dst, tok + 2 * C + h * HS, (size_t)HS * sizeof(float));
        }
    }
}

void cpu_attention_forward(fp8t_backend *b, float *out, float *lse, void *saved,
                           const float *qkv, int B, int T, int NH, int HS, float rope_theta) {
    (void)saved; /* the CPU rebuilds everything from qkv: attention_saved_bytes is 0 */
    const int C = NH * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t nhead = (size_t)B * T * C; /* floats of one head-major copy */
    const float *tab = rope_tables(b, T, HS, rope_theta);
    /* head-major Q, K, V [B][NH][T][HS] */
    float *Qall = cpu_scratch(b, CPU_SCRATCH_ATTN, 3 * nhead * sizeof(float));
    float *Kall = Qall + nhead, *Vall = Kall + nhead;
    split_heads(Qall, Kall, Vall, qkv, B, T, NH, HS, tab);
#pragma omp parallel
    {
        float *S = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float)); /* [QB][T] scores, probs */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const float *Q = Qall + (size_t)bh * T * HS; /* [T][HS] */
            const float *K = Kall + (size_t)bh * T * HS; /* [T][HS] */
            const float *V = Vall + (size_t)bh * T * HS; /* [T][HS] */
            float *lse_bh = lse ? lse + (size_t)bh * T : NULL; /* [T]; NULL: not kept */
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq = T - t0 < ATT_QB ? T - t0 : ATT_QB, kend = t0 + nq;
                /* S[nq][kend] = scale * Q_blk · K[0:kend]ᵀ */
                gemm(0, 1, nq, kend, HS, scale, Q + (size_t)t0 * HS, HS, K, HS, 0.0f, S, kend);
                for (int qi = 0; qi < nq; qi++) {
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
                gemm(0, 0, nq, HS, kend, 1.0f, S, kend, V, HS, 0.0f, dst, C);
            }
        }
        free(S);
    }
}

void cpu_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                            const void *saved,
                            const float *out, const float *lse, int B, int T, int NH, int HS,
                            float rope_theta) {
    (void)saved;
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t nhead = (size_t)B * T * C;
    const float *tab = rope_tables(b, T, HS, rope_theta);
    /* head-major Q, K, V, dO [B][NH][T][HS] and D [B][NH][T] */
    size_t scratch_floats = 4 * nhead + (size_t)B * NH * T;
    float *Qall = cpu_scratch(b, CPU_SCRATCH_ATTN, scratch_floats * sizeof(float));
    float *Kall = Qall + nhead, *Vall = Kall + nhead, *dOall = Vall + nhead;
    float *Dall = dOall + nhead;
    split_heads(Qall, Kall, Vall, qkv, B, T, NH, HS, tab);
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
        float *dK = CPU_ZALLOC(th); /* [T][HS] gradient wrt rope(k) */
        float *dV = CPU_ZALLOC(th); /* [T][HS] */
        float *P = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float));  /* [QB][T] */
        float *dS = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float)); /* [QB][T] dP, then dS */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const float *Q = Qall + (size_t)bh * T * HS, *K = Kall + (size_t)bh * T * HS;
            const float *V = Vall + (size_t)bh * T * HS, *dO = dOall + (size_t)bh * T * HS;
            const float *Dv = Dall + (size_t)bh * T, *lse_bh = lse + (size_t)bh * T;
            memset(dK, 0, th);
            memset(dV, 0, th);
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq = T - t0 < ATT_QB ? T - t0 : ATT_QB, kend = t0 + nq;
                const float *Qb = Q + (size_t)t0 * HS, *dOb = dO + (size_t)t0 * HS;
                /* P = exp(scale * Q_blk·Kᵀ - lse), recomputed; 0 above the diagonal */
                gemm(0, 1, nq, kend, HS, scale, Qb, HS, K, HS, 0.0f, P, kend);
                /* dP = dO_blk · V[0:kend]ᵀ */
                gemm(0, 1, nq, kend, HS, 1.0f, dOb, HS, V, HS, 0.0f, dS, kend);
                for (int qi = 0; qi < nq; qi++) {
                    float *prow = P + (size_t)qi * kend, *srow = dS + (size_t)qi * kend;
                    int nk = t0 + qi + 1;
                    row_probs_dscores(prow, srow, nk, lse_bh[t0 + qi], Dv[t0 + qi]);
                    for (int j = nk; j < kend; j++) prow[j] = srow[j] = 0.0f;
                }
                /* dQ_blk = scale * dS · K;  dK += scale * dSᵀ · Q_blk;  dV += Pᵀ · dO_blk */
                gemm(0, 0, nq, HS, kend, scale, dS, kend, K, HS, 0.0f, dQ + (size_t)t0 * HS, HS);
                gemm(1, 0, kend, HS, nq, scale, dS, kend, Qb, HS, 1.0f, dK, HS);
                gemm(1, 0, kend, HS, nq, 1.0f, P, kend, dOb, HS, 1.0f, dV, HS);
            }
            /* back through the rotation (its transpose) into dq and dk; dv as is */
            for (int t = 0; t < T; t++) {
                float *dtok = dqkv + ((size_t)bi * T + t) * C3 + (size_t)h * HS;
                rope_grad(dtok, dQ + (size_t)t * HS, tab, t, HS);
                rope_grad(dtok + C, dK + (size_t)t * HS, tab, t, HS);
                memcpy(dtok + 2 * C, dV + (size_t)t * HS, (size_t)HS * sizeof(float));
            }
        }
        free(dQ);
        free(dK);
        free(dV);
        free(P);
        free(dS);
    }
}

size_t cpu_attention_saved_bytes(fp8t_backend *b, int B, int T, int NH, int HS,
                                 float rope_theta) {
    (void)b, (void)B, (void)T, (void)NH, (void)HS, (void)rope_theta;
    return 0;
}
