/* CPU backend — causal multi-head self-attention, flash-attention style.
 *
 * Forward, per (batch, head): q (RoPE'd, pre-multiplied by 1/sqrt(HS)), k (RoPE'd, stored
 * transposed) and v are gathered into contiguous per-head buffers; query rows are processed in
 * blocks of ATT_QB: scores S = q·kᵀ over the causal keys, softmax per row, out = P·v. Only the
 * log-sum-exp of each row is saved (lse[B,NH,T]); no [T,T] matrix survives the op.
 *
 * Backward recomputes P row-block by row-block from q, k and lse (P = exp(S - lse)) and uses
 * D_i = sum(dout_i * out_i):  dS = P * (dout·vᵀ - D),  dq = dS·k,  dk += dSᵀ·q,  dv += Pᵀ·dout.
 * Each (batch, head) is one work item computed by one thread in a fixed order, so the result
 * does not depend on the number of threads.
 *
 * RoPE (rotate-half): for i < HS/2, angle = t * theta^(-2i/HS);
 *   x'[i] = x[i] cos - x[i+HS/2] sin,  x'[i+HS/2] = x[i+HS/2] cos + x[i] sin. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

enum { ATT_QB = 32 }; /* query rows per block */

/* cos/sin tables [T, HS/2] of the RoPE angles, computed in double; NULL when RoPE is off. */
static float *rope_tables(int T, int HS, float theta) {
    if (theta <= 0.0f) return NULL;
    if (HS % 2) {
        fprintf(stderr,
                "fp8train: attention: RoPE needs an even head size, got %d; change n_embd / "
                "n_head or disable rope (%s:%d)\n",
                HS, __FILE__, __LINE__);
        exit(1);
    }
    int half = HS / 2;
    float *tab = CPU_ZALLOC((size_t)T * HS * sizeof(float)); /* [T][cos half | sin half] */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double freq = pow((double)theta, -2.0 * i / HS);
            double ang = (double)t * freq;
            tab[(size_t)t * HS + i] = (float)cos(ang);
            tab[(size_t)t * HS + half + i] = (float)sin(ang);
        }
    return tab;
}

/* dst[HS] = rope(src[HS]) * mul at position t (tab NULL: no rotation) */
static inline void rope_apply(float *dst, const float *src, const float *tab, int t, int HS,
                              float mul) {
    if (!tab) {
        for (int i = 0; i < HS; i++) dst[i] = src[i] * mul;
        return;
    }
    int half = HS / 2;
    const float *c = tab + (size_t)t * HS, *s = c + half;
    for (int i = 0; i < half; i++) {
        float x1 = src[i], x2 = src[i + half];
        dst[i] = (x1 * c[i] - x2 * s[i]) * mul;
        dst[i + half] = (x2 * c[i] + x1 * s[i]) * mul;
    }
}

/* dst[HS] = rope⁻¹ applied to a gradient: the transpose of the rotation, times mul */
static inline void rope_grad(float *dst, const float *g, const float *tab, int t, int HS,
                             float mul) {
    if (!tab) {
        for (int i = 0; i < HS; i++) dst[i] = g[i] * mul;
        return;
    }
    int half = HS / 2;
    const float *c = tab + (size_t)t * HS, *s = c + half;
    for (int i = 0; i < half; i++) {
        float g1 = g[i] * mul, g2 = g[i + half] * mul;
        dst[i] = g1 * c[i] + g2 * s[i];
        dst[i + half] = g2 * c[i] - g1 * s[i];
    }
}

/* S[nq][lds] rows: S[qi][j] = sum_d Q[qi][d] * Kt[d][j] for j <= t0+qi (causal) */
static void scores_block(float *S, int lds, const float *Q, const float *Kt, int ldk, int nq,
                         int t0, int HS) {
    for (int qi = 0; qi < nq; qi++) {
        float *srow = S + (size_t)qi * lds;
        const float *qrow = Q + (size_t)qi * HS;
        int nk = t0 + qi + 1;
        for (int j = 0; j < nk; j++) srow[j] = 0.0f;
        for (int d = 0; d < HS; d++) {
            float a = qrow[d];
            const float *kt = Kt + (size_t)d * ldk;
#pragma omp simd
            for (int j = 0; j < nk; j++) srow[j] += a * kt[j];
        }
    }
}

/* O[nq][HS] = P[nq][lds] · V[keys][HS] over the causal keys of each row (overwrite) */
static void pv_block(float *O, const float *P, int lds, const float *V, int nq, int t0, int HS) {
    for (int qi = 0; qi < nq; qi++) {
        float *orow = O + (size_t)qi * HS;
        const float *prow = P + (size_t)qi * lds;
        for (int d = 0; d < HS; d++) orow[d] = 0.0f;
        for (int j = 0; j <= t0 + qi; j++) {
            float p = prow[j];
            const float *vrow = V + (size_t)j * HS;
#pragma omp simd
            for (int d = 0; d < HS; d++) orow[d] += p * vrow[d];
        }
    }
}

/* G[j][HS] += sum_qi W[qi][j] * X[qi][HS] for keys j <= t0+nq-1 (rows with t0+qi >= j) */
static void wtx_block(float *G, const float *W, int lds, const float *X, int nq, int t0,
                      int HS) {
    int kend = t0 + nq;
    for (int j = 0; j < kend; j++) {
        float *grow = G + (size_t)j * HS;
        int q_first = j > t0 ? j - t0 : 0; /* causal: only queries at or after key j */
        for (int qi = q_first; qi < nq; qi++) {
            float w = W[(size_t)qi * lds + j];
            const float *xrow = X + (size_t)qi * HS;
#pragma omp simd
            for (int d = 0; d < HS; d++) grow[d] += w * xrow[d];
        }
    }
}

void cpu_attention_forward(fp8t_backend *b, float *out, float *lse, const float *qkv, int B,
                           int T, int NH, int HS, float rope_theta) {
    (void)b;
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    float *tab = rope_tables(T, HS, rope_theta);
#pragma omp parallel
    {
        float *Q = CPU_ZALLOC((size_t)T * HS * sizeof(float));       /* [T][HS] rope(q)*scale */
        float *Kt = CPU_ZALLOC((size_t)HS * T * sizeof(float));      /* [HS][T] rope(k)ᵀ */
        float *V = CPU_ZALLOC((size_t)T * HS * sizeof(float));       /* [T][HS] */
        float *S = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float));   /* [QB][T] scores/probs */
        float *O = CPU_ZALLOC((size_t)ATT_QB * HS * sizeof(float));  /* [QB][HS] */
        float *krow = CPU_ZALLOC((size_t)HS * sizeof(float));        /* [HS] */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const float *base = qkv + (size_t)bi * T * C3 + (size_t)h * HS;
            for (int t = 0; t < T; t++) {
                const float *tok = base + (size_t)t * C3;
                rope_apply(Q + (size_t)t * HS, tok, tab, t, HS, scale);
                rope_apply(krow, tok + C, tab, t, HS, 1.0f);
                for (int d = 0; d < HS; d++) Kt[(size_t)d * T + t] = krow[d];
                for (int d = 0; d < HS; d++) V[(size_t)t * HS + d] = tok[2 * C + d];
            }
            float *lse_bh = lse + (size_t)bh * T; /* [T] */
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq = T - t0 < ATT_QB ? T - t0 : ATT_QB;
                scores_block(S, T, Q + (size_t)t0 * HS, Kt, T, nq, t0, HS);
                for (int qi = 0; qi < nq; qi++) {
                    float *srow = S + (size_t)qi * T;
                    int nk = t0 + qi + 1;
                    float mx = -INFINITY;
                    for (int j = 0; j < nk; j++) mx = srow[j] > mx ? srow[j] : mx;
                    float sum = 0.0f;
                    for (int j = 0; j < nk; j++) {
                        float e = expf(srow[j] - mx);
                        srow[j] = e;
                        sum += e;
                    }
                    float inv = 1.0f / sum;
                    for (int j = 0; j < nk; j++) srow[j] *= inv;
                    lse_bh[t0 + qi] = mx + logf(sum);
                }
                pv_block(O, S, T, V, nq, t0, HS);
                for (int qi = 0; qi < nq; qi++) {
                    float *dst = out + ((size_t)bi * T + t0 + qi) * C + (size_t)h * HS;
                    for (int d = 0; d < HS; d++) dst[d] = O[(size_t)qi * HS + d];
                }
            }
        }
        free(Q);
        free(Kt);
        free(V);
        free(S);
        free(O);
        free(krow);
    }
    free(tab);
}

void cpu_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                            const float *out, const float *lse, int B, int T, int NH, int HS,
                            float rope_theta) {
    (void)b;
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    float *tab = rope_tables(T, HS, rope_theta);
#pragma omp parallel
    {
        size_t th = (size_t)T * HS * sizeof(float);
        float *Q = CPU_ZALLOC(th);   /* [T][HS] rope(q)*scale */
        float *K = CPU_ZALLOC(th);   /* [T][HS] rope(k) */
        float *Kt = CPU_ZALLOC(th);  /* [HS][T] */
        float *Vt = CPU_ZALLOC(th);  /* [HS][T] */
        float *dO = CPU_ZALLOC(th);  /* [T][HS] */
        float *dQ = CPU_ZALLOC(th);  /* [T][HS] gradient wrt Q (scaled, rotated) */
        float *dK = CPU_ZALLOC(th);  /* [T][HS] gradient wrt rope(k) */
        float *dV = CPU_ZALLOC(th);  /* [T][HS] */
        float *Dv = CPU_ZALLOC((size_t)T * sizeof(float));          /* [T] sum(dout*out) */
        float *P = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float));  /* [QB][T] */
        float *dS = CPU_ZALLOC((size_t)ATT_QB * T * sizeof(float)); /* [QB][T] */
        float *tmp = CPU_ZALLOC((size_t)HS * sizeof(float));        /* [HS] */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int bi = bh / NH, h = bh % NH;
            const float *base = qkv + (size_t)bi * T * C3 + (size_t)h * HS;
            const float *lse_bh = lse + (size_t)bh * T;
            for (int t = 0; t < T; t++) {
                const float *tok = base + (size_t)t * C3;
                rope_apply(Q + (size_t)t * HS, tok, tab, t, HS, scale);
                rope_apply(K + (size_t)t * HS, tok + C, tab, t, HS, 1.0f);
                const float *kr = K + (size_t)t * HS, *vr = tok + 2 * C;
                for (int d = 0; d < HS; d++) {
                    Kt[(size_t)d * T + t] = kr[d];
                    Vt[(size_t)d * T + t] = vr[d];
                }
                size_t row = ((size_t)bi * T + t) * C + (size_t)h * HS;
                double D = 0.0;
                for (int d = 0; d < HS; d++) {
                    dO[(size_t)t * HS + d] = dout[row + d];
                    D += (double)dout[row + d] * out[row + d];
                }
                Dv[t] = (float)D;
            }
            for (size_t i = 0; i < (size_t)T * HS; i++) dK[i] = dV[i] = 0.0f;
            for (int t0 = 0; t0 < T; t0 += ATT_QB) {
                int nq = T - t0 < ATT_QB ? T - t0 : ATT_QB;
                /* P = exp(S - lse), recomputed */
                scores_block(P, T, Q + (size_t)t0 * HS, Kt, T, nq, t0, HS);
                for (int qi = 0; qi < nq; qi++) {
                    float *prow = P + (size_t)qi * T;
                    float l = lse_bh[t0 + qi];
                    for (int j = 0; j <= t0 + qi; j++) prow[j] = expf(prow[j] - l);
                }
                /* dP = dO·vᵀ, then dS = P * (dP - D) */
                scores_block(dS, T, dO + (size_t)t0 * HS, Vt, T, nq, t0, HS);
                for (int qi = 0; qi < nq; qi++) {
                    float *srow = dS + (size_t)qi * T;
                    const float *prow = P + (size_t)qi * T;
                    float D = Dv[t0 + qi];
                    for (int j = 0; j <= t0 + qi; j++) srow[j] = prow[j] * (srow[j] - D);
                }
                pv_block(dQ + (size_t)t0 * HS, dS, T, K, nq, t0, HS); /* dQ = dS·K */
                wtx_block(dK, dS, T, Q + (size_t)t0 * HS, nq, t0, HS); /* dK += dSᵀ·Q */
                wtx_block(dV, P, T, dO + (size_t)t0 * HS, nq, t0, HS); /* dV += Pᵀ·dO */
            }
            /* S = Q·Kᵀ with Q = rope(q)*scale: dq = scale * rope⁻¹(dQ), while dK = dSᵀ·Q
             * already carries the scale, so dk = rope⁻¹(dK). */
            for (int t = 0; t < T; t++) {
                float *dtok = dqkv + ((size_t)bi * T + t) * C3 + (size_t)h * HS;
                rope_grad(dtok, dQ + (size_t)t * HS, tab, t, HS, scale);
                rope_grad(tmp, dK + (size_t)t * HS, tab, t, HS, 1.0f);
                for (int d = 0; d < HS; d++) dtok[C + d] = tmp[d];
                for (int d = 0; d < HS; d++) dtok[2 * C + d] = dV[(size_t)t * HS + d];
            }
        }
        free(Q);
        free(K);
        free(Kt);
        free(Vt);
        free(dO);
        free(dQ);
        free(dK);
        free(dV);
        free(Dv);
        free(P);
        free(dS);
        free(tmp);
    }
    free(tab);
}
